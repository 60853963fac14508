"""python -m scripts.bench: its flags, and (with real processes, and network-namespace hosts for section 6) tiny runs that complete and report what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from nemo_gym.config import REPO_ROOT
from scripts.bench.__main__ import QUICK, parse_args
from scripts.bench.hosts import ROWS as HOSTS_ROWS
from scripts.bench.hosts import unavailable

E2E = pytest.mark.skipif(os.environ.get("NEMO_GYM_MULTIWORKER_E2E") != "1", reason="starts real server processes")


def test_quick_makes_every_size_tiny_and_a_flag_given_still_wins():
    args = parse_args(["--quick", "--episodes", "7"])
    assert args.episodes == 7
    assert args.runs == QUICK["runs"] == 1 and args.sessions == QUICK["sessions"]
    assert args.rows == ["gym", "off-gym"] and args.startup_workers == [1, 2]
    default = parse_args([])
    assert default.runs == 3 and default.startup_workers == [1, 4, 8] and "haproxy" in default.rows


def test_a_baseline_is_a_second_tree_and_must_be_a_checkout_of_this_project(tmp_path):
    args = parse_args(["--baseline", str(REPO_ROOT)])
    assert [(tree.label, tree.root) for tree in args.trees] == [("current", REPO_ROOT), ("baseline", REPO_ROOT.resolve())]
    assert [tree.label for tree in parse_args([]).trees] == ["current"]
    with pytest.raises(SystemExit):
        parse_args(["--baseline", str(tmp_path)])


@pytest.mark.parametrize("flags", [["--sections", "hop,nope"], ["--rows", "gym,nope"], ["--patterns", "nope"], ["--startup-workers", "1,x"], ["--startup-workers", "0"]])
def test_unknown_names_and_bad_counts_are_refused(flags):
    with pytest.raises(SystemExit):
        parse_args(flags)


def bench(*flags: str, timeout: float) -> str:
    command = [sys.executable, "-m", "scripts.bench", *flags]
    finished = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return finished.stdout


@E2E
def test_hop_section_runs_and_every_forwarded_increment_reaches_the_owner():
    out = bench("--sections", "hop", "--runs", "1", "--hop-requests", "20", "--hop-block", "10", timeout=180)
    assert "every increment reached its session's state: yes" in out
    assert "forwarded/local p50 <= 1.3x" in out
    assert re.search(r"hand_off_floor\.py\): \d+ us of CPU, both processes", out)


@E2E
def test_a_quick_side_by_side_run_prints_both_trees_and_their_ratios():
    # The baseline is this very tree: only that the side by side runs and reports is checked, never a time.
    out = bench("--quick", "--sections", "episodes,startup", "--patterns", "loops", "--startup-workers", "1", "--baseline", str(REPO_ROOT), timeout=600)
    assert f"1a. Counter episodes, loops client, baseline tree {REPO_ROOT}" in out
    comparison = out[out.index("1a. Counter episodes, loops client: current / baseline"):].splitlines()
    assert [line.split("  ")[0] for line in comparison[3:5]] == ["4 workers, routed, Gym client", "4 workers, routing off, Gym client"]
    assert "server CPU per request <= routing off with the Gym client" in out
    startup = out[out.index("5. Start-up"):].splitlines()
    assert startup[1].split()[-4:] == ["s", "current/baseline", "CPU", "current/baseline"]
    assert startup[3].split()[0] == "1" and startup[3].split()[-1].endswith("x")


@E2E
def test_hosts_section_runs_on_three_hosts_and_prints_every_row_and_the_direct_hits():
    if unavailable() is not None:
        pytest.skip(unavailable())
    out = bench("--quick", "--sections", "hosts", "--episodes", "40", "--hop-requests", "20", "--hop-block", "10", timeout=600)
    table = out[out.index("6a. Replicas on 3 network-namespace hosts"):].splitlines()
    assert [line.split("  ")[0] for line in table[3:6]] == list(HOSTS_ROWS)
    assert "every increment reached its session's state: yes" in out
    assert "6c. Gym client's non-first requests answered on their owner host" in out
    assert "Gym client across hosts: direct hits on the owner host >= 95% of non-first requests" in out
