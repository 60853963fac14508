import unittest

from spans import overlaps


class HiddenOverlapsTest(unittest.TestCase):
    def test_touching_ends(self):
        self.assertTrue(overlaps((0, 5), (5, 9)))
        self.assertTrue(overlaps((5, 9), (0, 5)))

    def test_single_points(self):
        self.assertTrue(overlaps((3, 3), (3, 3)))

    def test_apart(self):
        self.assertFalse(overlaps((0, 4), (5, 9)))
        self.assertFalse(overlaps((6, 9), (0, 5)))

    def test_crossing(self):
        self.assertTrue(overlaps((0, 6), (4, 9)))
