"""Closed intervals given as (start, end) pairs."""


def overlaps(first, second):
    """Whether two closed intervals share at least one point (touching ends count)."""
    return first[0] < second[1] and second[0] < first[1]
