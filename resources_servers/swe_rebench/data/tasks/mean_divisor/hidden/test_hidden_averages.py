import unittest

from averages import mean


class HiddenMeanTest(unittest.TestCase):
    def test_several_numbers(self):
        self.assertEqual(mean([1, 2, 3]), 2)
        self.assertEqual(mean([2, 4, 6, 8]), 5)

    def test_one_number(self):
        self.assertEqual(mean([7]), 7)

    def test_fractions(self):
        self.assertAlmostEqual(mean([0.5, 1.0]), 0.75)
