import unittest

from fizzbuzz import fizzbuzz


class FizzBuzzTest(unittest.TestCase):
    def test_multiples_of_three(self):
        self.assertEqual(fizzbuzz(9), "Fizz")

    def test_multiples_of_fifteen(self):
        self.assertEqual(fizzbuzz(15), "FizzBuzz")
