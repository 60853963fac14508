"""The targets of issues 6, 9, 13, 19 and 20, each judged met, not met or not measured from the figures of a run."""

from __future__ import annotations

from typing import Any

from scripts.bench.episodes import HAPROXY, ONE_WORKER, ROUTED, ROUTED_DURABLE, ROUTED_GYM, ROUTED_PLACED, UNROUTED, UNROUTED_GYM
from scripts.bench.figures import fmt, ratio
from scripts.bench.hop import FORWARDED, LOCAL
from scripts.bench.hosts import COOKIE_INSERT, GYM, ROUND_ROBIN, TARGET_DIRECT_SHARE

TARGET_HAPROXY_RATIO = 1.0
TARGET_TASKS_HAPROXY_RATIO = 1.2
TARGET_HOP_RATIO = 1.3
TARGET_RSS_MB = 5.0
TARGET_CPU_SCALE = 1.7
# Issue 19: an 8-worker counter's start, until every worker serves, against the baseline's.
TARGET_START_WORKERS = 8
TARGET_START_RATIO = 0.5

Check = tuple[str, str, str]


def targets(results: dict) -> list[Check]:
    """(target, 'met' / 'not met' / 'not measured', measured figure) for each target, in the current tree."""
    checks = []
    episodes = results.get("episodes")
    for pattern, needed in (("loops", TARGET_HAPROXY_RATIO), ("tasks", TARGET_TASKS_HAPROXY_RATIO)):
        rows = episodes["patterns"].get(pattern) if episodes else None
        checks += routed_targets(pattern, needed, rows or {})
        checks += gym_targets(pattern, rows or {})
    checks.append(hop_target(results.get("hop")))
    checks.append(memory_target(results.get("memory")))
    checks.append(cpu_target(results.get("cpu")))
    checks.append(startup_target(results.get("startup")))
    checks += hosts_targets(results.get("hosts"))
    return checks


def routed_targets(pattern: str, needed: float, rows: dict[str, Any]) -> list[Check]:
    name = f"{pattern} client, 4 workers routed: 100% correct and throughput >= {needed:.1f}x HAProxy"
    routed = rows.get(ROUTED)
    if routed is None:
        return [(name, "not measured", "not run")]
    correct = all(good == routed["total"] for good in routed["good_all_runs"])
    haproxy = rows.get(HAPROXY, {})
    against = ratio(routed["per_second"], haproxy.get("per_second"))
    figure = f"{min(routed['good_all_runs'])}/{routed['total']} in the worst run, {fmt(against, '.2f', 'x')} HAProxy"
    if against is None:
        return [(name, "not measured", f"HAProxy skipped; {figure}")]
    checks = [(name, "met" if correct and against >= needed else "not met", figure)]
    if pattern == "tasks":
        p99 = f"p99 {routed['p99_ms']:.1f} ms against HAProxy's {haproxy['p99_ms']:.1f} ms"
        checks.append(("tasks client, 4 workers routed: p99 <= HAProxy's", "met" if routed["p99_ms"] <= haproxy["p99_ms"] else "not met", p99))
        if ONE_WORKER in rows:
            one = ratio(routed["per_second"], rows[ONE_WORKER]["per_second"])
            checks.append(("tasks client, 4 workers routed: throughput >= 1.0x one worker", "met" if one >= 1.0 else "not met", fmt(one, ".2f", "x")))
    durable = rows.get(ROUTED_DURABLE, {})
    if "per_second" in durable:
        kept = ratio(durable["per_second"], routed["per_second"])
        checks.append((f"{pattern} client: durable >= 0.85x in memory, routed", "met" if kept >= 0.85 else "not met", fmt(kept, ".2f", "x")))
    placed = rows.get(ROUTED_PLACED, routed)
    if placed.get("spread") is not None:
        spread = f"±{placed['spread']:.0%}"
        checks.append((f"{pattern} client, placement on: sessions per worker within ±10% of the mean", "met" if placed["spread"] <= 0.1 else "not met", spread))
    return checks


def gym_targets(pattern: str, rows: dict[str, Any]) -> list[Check]:
    """Gym's own client, routed: direct hits, and against routing off its throughput and its server's CPU per request."""
    gym = rows.get(ROUTED_GYM, {})
    if gym.get("direct_share") is None:
        return []
    checks = [(f"{pattern} client: Gym client's direct hits >= 95%", "met" if gym["direct_share"] >= 0.95 else "not met", f"{gym['direct_share']:.1%}")]
    for other, client in ((UNROUTED_GYM, "the Gym client"), (UNROUTED, "the plain pooled client")):
        if "per_second" in rows.get(other, {}):
            unrouted = ratio(gym["per_second"], rows[other]["per_second"])
            checks.append((f"{pattern} client: Gym client throughput >= 1.0x routing off with {client}", "met" if unrouted >= 1.0 else "not met", fmt(unrouted, ".2f", "x")))
    off = rows.get(UNROUTED_GYM, {})
    if gym.get("server_cpu_request_ms") is not None and off.get("server_cpu_request_ms") is not None:
        figure = (
            f"{gym['server_cpu_request_ms']:.3f} against {off['server_cpu_request_ms']:.3f} ms per request "
            f"({fmt(gym['server_cpu_ms'], '.2f')} against {fmt(off['server_cpu_ms'], '.2f')} ms per episode)"
        )
        met = gym["server_cpu_request_ms"] <= off["server_cpu_request_ms"]
        checks.append((f"{pattern} client: Gym client routed, server CPU per request <= routing off with the Gym client", "met" if met else "not met", figure))
    return checks


def hop_target(hop: dict | None) -> Check:
    name = f"forwarded/local p50 <= {TARGET_HOP_RATIO}x"
    if hop is None:
        return (name, "not measured", "section skipped")
    hop_ratio = ratio(hop[FORWARDED]["p50_ms"], hop[LOCAL]["p50_ms"])
    return (name, "met" if hop_ratio <= TARGET_HOP_RATIO else "not met", f"{hop_ratio:.2f}x")


def memory_target(memory: dict | None) -> Check:
    name = f"RSS growth <= {TARGET_RSS_MB:g} MB per worker over {memory['sessions'] if memory else 100_000} sessions"
    if memory is None:
        return (name, "not measured", "section skipped")
    worst = max(w["growth_mb"] for w in memory["workers"])
    return (name, "met" if worst <= TARGET_RSS_MB else "not met", f"worst worker {worst:+.2f} MB")


def cpu_target(cpu: dict | None) -> Check:
    name = f"CPU-bound: 2 workers >= {TARGET_CPU_SCALE}x 1 worker"
    if cpu is None:
        return (name, "not measured", "section skipped")
    return (name, "met" if cpu["scale"] >= TARGET_CPU_SCALE else "not met", f"{cpu['scale']:.2f}x")


def startup_target(startup: dict | None) -> Check:
    name = f"{TARGET_START_WORKERS}-worker counter: start until every worker serves <= {TARGET_START_RATIO}x the baseline's"
    ratios = (startup or {}).get("ratios", {})
    if TARGET_START_WORKERS not in ratios:
        return (name, "not measured", f"needs --baseline and {TARGET_START_WORKERS} in --startup-workers")
    trees = list(startup["trees"].values())
    seconds = [tree[TARGET_START_WORKERS]["seconds"] for tree in trees[:2]]
    measured = ratios[TARGET_START_WORKERS]["seconds"]
    cpu = fmt(ratios[TARGET_START_WORKERS]["cpu_s"], ".2f", "x")
    figure = f"{measured:.2f}x ({seconds[0]:.1f} s against {seconds[1]:.1f} s; its CPU {cpu})"
    return (name, "met" if measured <= TARGET_START_RATIO else "not met", figure)


def hosts_targets(hosts: dict | None) -> list[Check]:
    """Issue 20: every episode right through round robin over the replicas (with the throughput and server CPU
    per episode against cookie-insert, which have no target of their own), and Gym's client's direct hits."""
    correct = "3 hosts x 2 workers behind round robin: 100% of episodes correct"
    direct = f"Gym client across hosts: direct hits on the owner host >= {TARGET_DIRECT_SHARE:.0%} of non-first requests"
    if hosts is None or "skipped" in hosts:
        why = "section skipped" if hosts is None else f"skipped: {hosts['skipped']}"
        return [(correct, "not measured", why), (direct, "not measured", why)]
    rows = hosts["rows"]
    cookie = rows[COOKIE_INSERT]
    checks = []
    for name in (ROUND_ROBIN, GYM):
        row = rows[name]
        figure = (
            f"{name}: {row['good']}/{row['total']}; {fmt(ratio(row['per_second'], cookie['per_second']), '.2f', 'x')} cookie-insert's "
            f"episodes/s, {fmt(ratio(row['server_cpu_ms'], cookie['server_cpu_ms']), '.2f', 'x')} its server CPU per episode"
        )
        checks.append((correct, "met" if row["good"] == row["total"] else "not met", figure))
    gym = rows[GYM]
    share = ratio(gym["owner_host"], gym["requests"])
    checks.append((direct, "met" if share is not None and share >= TARGET_DIRECT_SHARE else "not met", f"{gym['owner_host']}/{gym['requests']} ({fmt(share, '.1%')})"))
    return checks
