import unittest

from bounds import clamp


class HiddenClampTest(unittest.TestCase):
    def test_below_the_range(self):
        self.assertEqual(clamp(-3, 0, 10), 0)

    def test_above_the_range(self):
        self.assertEqual(clamp(11, 0, 10), 10)
        self.assertEqual(clamp(10**9, -1, 1), 1)

    def test_the_bounds_themselves(self):
        self.assertEqual(clamp(0, 0, 10), 0)
        self.assertEqual(clamp(10, 0, 10), 10)

    def test_inside_the_range(self):
        self.assertEqual(clamp(2.5, 0, 10), 2.5)
