"""scripts/bench/targets.py: each target judged met, not met or not measured from a run's figures."""

from __future__ import annotations

from scripts.bench import episodes
from scripts.bench.hop import FORWARDED, LOCAL
from scripts.bench.targets import gym_targets, startup_target, targets


def results(routed_good=(100, 100, 100), routed_rate=130.0, haproxy_rate=100.0, p99=(10.0, 12.0), spread=0.05, local=1.0, forwarded=1.2, growth=(0.5, 4.0), scale=1.8):
    rows = {
        episodes.ONE_WORKER: {"per_second": 100.0},
        episodes.ROUTED: {"total": 100, "good_all_runs": list(routed_good), "per_second": routed_rate, "p99_ms": p99[0], "spread": spread},
        episodes.HAPROXY: {"per_second": haproxy_rate, "p99_ms": p99[1]} if haproxy_rate else {"skipped": "haproxy not installed"},
    }
    return {
        "episodes": {"patterns": {"loops": rows, "tasks": rows}, "warnings": []},
        "hop": {LOCAL: {"p50_ms": local}, FORWARDED: {"p50_ms": forwarded}},
        "memory": {"sessions": 100_000, "workers": [{"growth_mb": g} for g in growth]},
        "cpu": {"scale": scale},
    }


def verdicts(measured: dict) -> list[str]:
    return [verdict for _, verdict, _ in targets(measured)]


def test_targets_met():
    # loops: HAProxy, spread; tasks: HAProxy, p99, one worker, spread; hop; memory; CPU; then start-up and the hosts, not run
    assert verdicts(results()) == ["met"] * 9 + ["not measured"] * 3


def test_targets_not_met():
    measured = results(routed_rate=90.0, p99=(20.0, 12.0), spread=0.2, forwarded=1.4, growth=(0.5, 5.5), scale=1.6)
    assert verdicts(measured) == ["not met"] * 9 + ["not measured"] * 3


def test_the_tasks_client_needs_1_2x_haproxy_where_the_loops_client_needs_1_0x():
    assert verdicts(results(routed_rate=110.0))[:3] == ["met", "met", "not met"]


def test_one_wrong_episode_in_any_run_fails_the_routing_target():
    assert verdicts(results(routed_good=(100, 99, 100)))[0] == "not met"


def test_targets_without_haproxy_or_a_section_are_not_measured():
    measured = results(haproxy_rate=None)
    del measured["cpu"]
    assert verdicts(measured) == ["not measured", "not measured", "met", "met", "not measured", "not measured", "not measured", "not measured"]


def test_rows_left_out_with_rows_are_not_measured_rather_than_an_error():
    gym_rows = {
        episodes.ROUTED_GYM: {"direct_share": 1.0, "per_second": 100.0, "server_cpu_ms": 1.4, "server_cpu_request_ms": 0.35},
        episodes.UNROUTED_GYM: {"per_second": 110.0, "server_cpu_ms": 1.2, "server_cpu_request_ms": 0.31},
    }
    measured = {"episodes": {"patterns": {"loops": gym_rows}}}
    checks = targets(measured)
    assert checks[0] == ("loops client, 4 workers routed: 100% correct and throughput >= 1.0x HAProxy", "not measured", "not run")
    assert [verdict for _, verdict, _ in checks[1:4]] == ["met", "not met", "not met"]  # direct hits, throughput, CPU


def gym_rows(routed_ms: float, off_ms: float) -> dict:
    return {
        episodes.ROUTED_GYM: {"direct_share": 1.0, "per_second": 100.0, "server_cpu_ms": routed_ms * 4, "server_cpu_request_ms": routed_ms},
        episodes.UNROUTED_GYM: {"per_second": 100.0, "server_cpu_ms": off_ms * 4, "server_cpu_request_ms": off_ms},
    }


def test_the_gym_client_routed_may_spend_no_more_server_cpu_per_request_than_routing_off():
    def cpu_verdict(routed_ms: float, off_ms: float) -> tuple[str, str]:
        name, verdict, figure = gym_targets("loops", gym_rows(routed_ms, off_ms))[-1]
        assert "server CPU per request <= routing off" in name
        return verdict, figure

    assert cpu_verdict(0.30, 0.31) == ("met", "0.300 against 0.310 ms per request (1.20 against 1.24 ms per episode)")
    assert cpu_verdict(0.31, 0.31)[0] == "met"
    assert cpu_verdict(0.36, 0.31)[0] == "not met"


def startup(current_s: float, baseline_s: float, counts=(1, 8)) -> dict:
    trees = {label: {count: {"seconds": seconds, "cpu_s": 1.0} for count in counts} for label, seconds in (("current", current_s), ("baseline", baseline_s))}
    return {"workers": list(counts), "trees": trees, "ratios": {count: {"seconds": current_s / baseline_s, "cpu_s": 1.0} for count in counts}}


def test_an_8_worker_start_must_take_at_most_half_the_baselines():
    assert startup_target(startup(10.0, 20.0))[1:] == ("met", "0.50x (10.0 s against 20.0 s; its CPU 1.00x)")
    assert startup_target(startup(11.0, 20.0))[1] == "not met"


def test_a_start_without_a_baseline_or_without_8_workers_is_not_measured():
    assert startup_target(None)[1] == "not measured"
    assert startup_target(startup(10.0, 20.0, counts=(1, 4)))[1] == "not measured"
    alone = startup(10.0, 20.0)
    del alone["ratios"]
    assert startup_target(alone)[1] == "not measured"
