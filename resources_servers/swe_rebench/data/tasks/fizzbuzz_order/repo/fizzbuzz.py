"""The counting game."""


def fizzbuzz(number):
    """'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, else the number."""
    if number % 3 == 0:
        return "Fizz"
    if number % 5 == 0:
        return "Buzz"
    if number % 15 == 0:
        return "FizzBuzz"
    return str(number)
