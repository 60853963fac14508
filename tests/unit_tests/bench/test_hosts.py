"""scripts/bench/hosts.py and hosts_client.py, their pure parts: the skip, the figures' arithmetic, the table, the targets."""

from __future__ import annotations

import argparse
import shutil

import pytest

from scripts.bench import hosts
from scripts.bench.hosts import COOKIE_INSERT, GYM, ROUND_ROBIN, hosts_section, hosts_table, row_figures
from scripts.bench.hosts_client import CROSS_HOST, LOCAL, direct_hits
from scripts.bench.targets import hosts_targets

ARGS = argparse.Namespace(episodes=10, concurrency=2, runs=2)


def test_without_root_the_section_is_skipped_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    result = hosts_section(ARGS, tmp_path)
    assert result == {"skipped": "network namespaces need root"}
    assert hosts_table(result, ARGS) == "6. Replicas on several hosts: skipped (network namespaces need root)"
    assert {verdict for _, verdict, _ in hosts_targets(result)} == {"not measured"}


def test_without_haproxy_the_skip_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 0)
    which = shutil.which
    monkeypatch.setattr(hosts.shutil, "which", lambda tool: None if tool == "haproxy" else which("sh"))
    assert hosts_section(ARGS, tmp_path)["skipped"].startswith("no haproxy (install: apt-get")


def run(per_second: float, cpu_s: float, good: int = 10, **extra) -> dict:
    latencies = {"p50_ms": per_second / 100, "p99_ms": per_second / 10, "client_cpu_ms": 1.0}
    return {"total": 10, "good": good, "errors": 10 - good, "per_second": per_second, **latencies, "server_cpu_s": cpu_s, "first_error": None, **extra}


def test_a_row_takes_medians_of_rates_and_cpu_per_episode_and_sums_the_counts():
    figures = row_figures([run(100, 0.05, requests=30, owner_host=29, owner_worker=27), run(300, 0.02, good=9, requests=30, owner_host=30, owner_worker=28)])
    assert figures["per_second"] == 200 and figures["p50_ms"] == 2 and figures["p99_ms"] == 20
    assert figures["per_second_all_runs"] == [100, 300]
    assert figures["server_cpu_ms"] == pytest.approx(3.5)  # median of 5 and 2 ms per episode
    assert (figures["good"], figures["total"], figures["errors"]) == (19, 20, 1)
    assert (figures["requests"], figures["owner_host"], figures["owner_worker"]) == (60, 59, 55)
    assert "requests" not in row_figures([run(100, 0.05)])


def test_a_direct_hit_is_a_worker_of_the_owner_replica_and_a_hop_free_one_the_owner_worker():
    replica_of_worker = {"w1": "h1:8000", "w2": "h1:8000", "w3": "h2:8000"}
    answered = [("w1", "h1:8000", "w1"), ("w1", "h1:8000", "w2"), ("w1", "h1:8000", "w3"), ("w3", "h2:8000", "unknown")]
    assert direct_hits(answered, replica_of_worker) == {"requests": 4, "owner_host": 2, "owner_worker": 1}


def measured(gym_hosts: int = 300) -> dict:
    rows = {
        ROUND_ROBIN: {**row_figures([run(400, 0.03)]), "processes": 13},
        GYM: {**row_figures([run(600, 0.01, requests=300, owner_host=gym_hosts, owner_worker=280)]), "processes": 13},
        COOKIE_INSERT: {**row_figures([run(500, 0.02)]), "processes": 7},
    }
    hop = {LOCAL: {"p50_ms": 0.5, "p99_ms": 1.0}, CROSS_HOST: {"p50_ms": 1.25, "p99_ms": 3.0}, "state_intact": True, "requests_per_run": 40}
    return {"rows": rows, "hop": hop}


def test_the_table_prints_each_row_against_cookie_insert_and_the_forward_against_local():
    lines = hosts_table(measured(), ARGS).splitlines()
    round_robin = next(line for line in lines if line.startswith(ROUND_ROBIN)).split()
    # 400/s and 3 ms per episode against 500/s and 2 ms.
    assert round_robin[-6:] == ["40.0", "3.00", "0.80x", "1.50x", "13", "1.00"]
    cross = next(line for line in lines if line.startswith(CROSS_HOST)).split()
    assert cross[1:] == ["1.250", "3.000", "2.50x"]
    assert "   every increment reached its session's state: yes" in lines
    assert any("300/300 (100.0%; target >= 95%), by the owner worker itself: 280 (93.3%)" in line for line in lines)


def test_the_targets_want_every_episode_right_and_95_percent_direct_hits():
    assert [verdict for _, verdict, _ in hosts_targets(measured())] == ["met", "met", "met"]
    name, verdict, figure = hosts_targets(measured(gym_hosts=280))[-1]
    assert verdict == "not met" and figure == "280/300 (93.3%)"
    wrong = measured()
    wrong["rows"][ROUND_ROBIN]["good"] = 9
    assert [verdict for _, verdict, _ in hosts_targets(wrong)][0] == "not met"
