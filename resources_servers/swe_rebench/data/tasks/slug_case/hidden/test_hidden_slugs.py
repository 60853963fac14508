import unittest

from slugs import slugify


class HiddenSlugifyTest(unittest.TestCase):
    def test_lower_case(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")
        self.assertEqual(slugify("NeMo Gym 2"), "nemo-gym-2")

    def test_already_a_slug(self):
        self.assertEqual(slugify("plain-words"), "plain-words")

    def test_nothing_to_keep(self):
        self.assertEqual(slugify("?!"), "")
