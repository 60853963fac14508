import unittest

from averages import mean


class MeanTest(unittest.TestCase):
    def test_mean_of_three_numbers(self):
        self.assertEqual(mean([1, 2, 3]), 2)
