"""scripts/bench/startup.py: the start-up figures, their medians and the current tree's over the baseline's."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scripts.bench.servers import Tree
from scripts.bench.startup import Start, startup_table, summarize


def starts(seconds: list[float], cpu: list[float], started: int) -> list[Start]:
    return [Start(s, c, started) for s, c in zip(seconds, cpu)]


def test_medians_per_tree_and_worker_count_and_current_over_baseline():
    result = summarize(
        {
            "current": {1: starts([4.0, 6.0, 5.0], [2.0, 2.2, 2.1], 1), 8: starts([30.0, 20.0, 25.0], [20.0, 18.0, 19.0], 8)},
            "baseline": {1: starts([5.0, 5.0, 5.0], [2.1, 2.1, 2.1], 1), 8: starts([50.0, 40.0, 60.0], [38.0, 36.0, 37.0], 8)},
        },
        [1, 8],
    )
    assert result["trees"]["current"][8]["seconds"] == 25.0 and result["trees"]["current"][8]["cpu_s"] == 19.0
    assert result["trees"]["current"][8]["all_seconds"] == [30.0, 20.0, 25.0]
    assert result["ratios"][8]["seconds"] == pytest.approx(0.5)
    assert result["ratios"][8]["cpu_s"] == pytest.approx(19.0 / 37.0)
    assert result["ratios"][1]["seconds"] == pytest.approx(1.0)
    assert result["warnings"] == []


def test_without_a_baseline_there_are_no_ratios():
    result = summarize({"current": {4: starts([10.0], [9.0], 4)}}, [4])
    assert "ratios" not in result
    args = argparse.Namespace(runs=1, trees=[Tree("current", Path("/x"))])
    table = startup_table(result, args).splitlines()
    assert table[1].split() == ["workers", "current", "s", "current", "CPU", "s", "current", "CPU", "s/process"]
    # 9 CPU seconds over the supervisor and its 4 workers
    assert table[3].split() == ["4", "10.0", "9.0", "1.80"]


def test_a_worker_replaced_while_starting_is_warned_of():
    result = summarize({"current": {4: starts([10.0, 12.0], [9.0, 11.0], 4) + starts([14.0], [13.0], 5)}}, [4])
    assert result["trees"]["current"][4]["workers_started"] == 5
    assert result["warnings"] == ["WARNING: uvicorn replaced a worker of the current tree's 4-worker counter while it started (5 workers started)"]


def test_the_table_puts_both_trees_and_their_ratios_side_by_side():
    result = summarize({"current": {8: starts([20.0], [18.0], 8)}, "baseline": {8: starts([40.0], [36.0], 8)}}, [8])
    args = argparse.Namespace(runs=1, trees=[Tree("current", Path("/a")), Tree("baseline", Path("/b"))])
    lines = startup_table(result, args).splitlines()
    assert lines[3].split() == ["8", "20.0", "18.0", "2.00", "40.0", "36.0", "4.00", "0.50x", "0.50x"]
    assert lines[4:] == ["   current: /a", "   baseline: /b"]
