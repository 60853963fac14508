import unittest

from bounds import clamp


class ClampTest(unittest.TestCase):
    def test_value_inside_the_range_is_unchanged(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_value_above_the_range_becomes_the_upper_bound(self):
        self.assertEqual(clamp(15, 0, 10), 10)
