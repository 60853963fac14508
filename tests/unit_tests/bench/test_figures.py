"""scripts/bench/figures.py: percentiles, medians, ratios and aligned tables."""

from __future__ import annotations

import pytest

from scripts.bench.figures import median, percentile, ratio, render_table


def test_percentile_interpolates_between_ranks():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0


def test_median_and_ratio():
    assert median([5.0, 1.0, 3.0]) == 3.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(3.0, None) is None
    assert ratio(None, 2.0) is None


def test_table_aligns_columns():
    table = render_table(["name", "value"], [["a", "1"], ["longer", "1000"]])
    assert table.splitlines() == [
        "name    value",
        "------  -----",
        "a           1",
        "longer   1000",
    ]
