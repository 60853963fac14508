import unittest

from slugs import slugify


class SlugifyTest(unittest.TestCase):
    def test_punctuation_is_dropped(self):
        self.assertEqual(slugify("red, green; blue"), "red-green-blue")

    def test_slug_is_lower_case(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")
