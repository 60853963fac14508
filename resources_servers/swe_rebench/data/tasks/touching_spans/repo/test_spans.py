import unittest

from spans import overlaps


class OverlapsTest(unittest.TestCase):
    def test_nested_spans_overlap(self):
        self.assertTrue(overlaps((0, 10), (2, 3)))

    def test_touching_spans_overlap(self):
        self.assertTrue(overlaps((0, 5), (5, 9)))
