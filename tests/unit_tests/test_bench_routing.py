"""scripts/bench_routing.py: its arithmetic and verdicts, and (with real processes) one tiny section.

Timings are never asserted: only that the benchmark computes, judges and reports what it says.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nemo_gym.config import REPO_ROOT
from scripts import bench_routing as bench

E2E = pytest.mark.skipif(os.environ.get("NEMO_GYM_MULTIWORKER_E2E") != "1", reason="starts real server processes")


def test_percentile_interpolates_between_ranks():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert bench.percentile(values, 50) == pytest.approx(50.5)
    assert bench.percentile(values, 99) == pytest.approx(99.01)
    assert bench.percentile(values, 0) == 1.0
    assert bench.percentile(values, 100) == 100.0
    assert bench.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert bench.percentile([7.0], 99) == 7.0


def test_median_and_ratio():
    assert bench.median([5.0, 1.0, 3.0]) == 3.0
    assert bench.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert bench.ratio(3.0, 2.0) == 1.5
    assert bench.ratio(3.0, None) is None
    assert bench.ratio(None, 2.0) is None


def test_table_aligns_columns():
    table = bench.render_table(["name", "value"], [["a", "1"], ["longer", "1000"]])
    assert table.splitlines() == [
        "name    value",
        "------  -----",
        "a           1",
        "longer   1000",
    ]


def results(routed_good=(100, 100, 100), routed_rate=130.0, haproxy_rate=100.0, p99=(10.0, 12.0), spread=0.05, local=1.0, forwarded=1.2, growth=(0.5, 4.0), scale=1.8):
    rows = {
        bench.ONE_WORKER: {"per_second": 100.0},
        bench.ROUTED: {"total": 100, "good_all_runs": list(routed_good), "per_second": routed_rate, "p99_ms": p99[0], "spread": spread},
        bench.HAPROXY: {"per_second": haproxy_rate, "p99_ms": p99[1]} if haproxy_rate else {"skipped": "haproxy not installed"},
    }
    return {
        "episodes": {"patterns": {"loops": rows, "tasks": rows}, "warnings": []},
        "hop": {bench.LOCAL: {"p50_ms": local}, bench.FORWARDED: {"p50_ms": forwarded}},
        "memory": {"sessions": 100_000, "workers": [{"growth_mb": g} for g in growth]},
        "cpu": {"scale": scale},
    }


def verdicts(measured: dict) -> list[str]:
    return [verdict for _, verdict, _ in bench.targets(measured)]


def test_targets_met():
    # loops: HAProxy, spread; tasks: HAProxy, p99, one worker, spread; hop; memory; CPU
    assert verdicts(results()) == ["met"] * 9


def test_targets_not_met():
    measured = results(routed_rate=90.0, p99=(20.0, 12.0), spread=0.2, forwarded=1.4, growth=(0.5, 5.5), scale=1.6)
    assert verdicts(measured) == ["not met"] * 9


def test_the_tasks_client_needs_1_2x_haproxy_where_the_loops_client_needs_1_0x():
    assert verdicts(results(routed_rate=110.0))[:3] == ["met", "met", "not met"]


def test_one_wrong_episode_in_any_run_fails_the_routing_target():
    assert verdicts(results(routed_good=(100, 99, 100)))[0] == "not met"


def test_targets_without_haproxy_or_a_section_are_not_measured():
    measured = results(haproxy_rate=None)
    del measured["cpu"]
    assert verdicts(measured) == ["not measured", "not measured", "met", "met", "not measured"]


def test_sessions_per_worker_spread_is_the_furthest_owner_from_the_mean():
    run = bench.Run(8, 8, 0, 1.0, [], owners=bench.Counter({"a": 3, "b": 1, "c": 2, "d": 2}))
    assert run.spread == pytest.approx(0.5)
    assert bench.Run(1, 1, 0, 1.0, [], owners=bench.Counter({"a": 1})).spread is None


@E2E
def test_hop_section_runs_and_every_forwarded_increment_reaches_the_owner():
    command = [sys.executable, "scripts/bench_routing.py", "--sections", "hop", "--runs", "1", "--hop-requests", "20", "--hop-block", "10"]
    finished = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert "every increment reached its session's state: yes" in finished.stdout
    assert "forwarded/local p50 <= 1.3x" in finished.stdout
