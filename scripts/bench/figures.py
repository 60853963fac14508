"""The benchmark's numbers and how it prints them: percentiles, medians, ratios, aligned tables, progress."""

from __future__ import annotations

import statistics
import sys


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between the two nearest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None or value != value else f"{value:{spec}}{suffix}"


def render_table(header: list[str], rows: list[list[str]]) -> str:
    """First column left-aligned, the others right-aligned, two spaces between columns."""
    widths = [max(len(row[i]) if i < len(row) else 0 for row in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def log(message: str) -> None:
    """Progress, on stderr: the tables alone go to stdout."""
    print(message, file=sys.stderr, flush=True)
