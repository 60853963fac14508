import unittest

from fizzbuzz import fizzbuzz


class HiddenFizzBuzzTest(unittest.TestCase):
    def test_first_fifteen(self):
        expected = ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz", "11", "Fizz", "13", "14", "FizzBuzz"]
        self.assertEqual([fizzbuzz(number) for number in range(1, 16)], expected)

    def test_larger_multiples_of_both(self):
        self.assertEqual(fizzbuzz(45), "FizzBuzz")
        self.assertEqual(fizzbuzz(90), "FizzBuzz")
