"""Section 1, counter episodes: each configuration's throughput, latency, placement spread and CPU per episode.

Counter episodes (seed 0, +1, +2, verify 3) against the counter at 1 worker, at 4 workers routed (in memory,
with hand-off, the default, and forwarding every hop instead; placed, durable, and played by Gym's own client),
at 4 workers with routing off, and HAProxy in front of 4
single-worker instances. With a baseline, every row runs for both trees, side by side in the same rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nemo_gym import config as gym_config
from scripts.bench.client import GymEpisodeClient, counter_episode
from scripts.bench.driving import PATTERNS, Run, alternate
from scripts.bench.figures import fmt, log, median, ratio, render_table
from scripts.bench.haproxy import HAPROXY_INSTALL, HAProxy
from scripts.bench.processes import REPLACED_WARNING, replaced, settled_workers
from scripts.bench.servers import COUNTER, Servers, Tree, resource_server, write_config

ONE_WORKER = "1 worker"
ROUTED = "4 workers, routed"
ROUTED_FORWARDED = "4 workers, routed, hand-off off"
ROUTED_GYM = "4 workers, routed, Gym client"
ROUTED_DURABLE = "4 workers, routed, durable"
ROUTED_PLACED = "4 workers, routed, placed"
UNROUTED = "4 workers, routing off"
UNROUTED_GYM = "4 workers, routing off, Gym client"
HAPROXY = "HAProxy + 4 x 1 worker"


@dataclass(frozen=True)
class Row:
    """A configuration: the instance its episodes go to, and whether Gym's own client plays them."""

    instance: str
    gym: bool = False


# In table order, with the short names ``--rows`` takes. HAProxy's row goes to its own four backends.
ROWS = {
    "one": (ONE_WORKER, Row("counter_1w")),
    "routed": (ROUTED, Row("counter_4w")),
    "forwarded": (ROUTED_FORWARDED, Row("counter_4w_forwarded")),
    "placed": (ROUTED_PLACED, Row("counter_4w_placed")),
    "gym": (ROUTED_GYM, Row("counter_4w", gym=True)),
    "durable": (ROUTED_DURABLE, Row("counter_4w_durable")),
    "off": (UNROUTED, Row("counter_4w_off")),
    "off-gym": (UNROUTED_GYM, Row("counter_4w_off", gym=True)),
    "haproxy": (HAPROXY, Row("counter_b")),
}
BACKENDS = [f"counter_b{i}" for i in range(4)]
INSTANCES = {
    "counter_1w": resource_server(COUNTER, num_workers=1),
    # In memory, as the 1-worker and HAProxy rows are; the durable row pays the store's writes too.
    "counter_4w": resource_server(COUNTER, num_workers=4, durable_sessions=False),
    "counter_4w_forwarded": resource_server(COUNTER, num_workers=4, durable_sessions=False, hand_off=False),
    "counter_4w_placed": resource_server(COUNTER, num_workers=4, durable_sessions=False, place_sessions=True),
    "counter_4w_durable": resource_server(COUNTER, num_workers=4),
    "counter_4w_off": resource_server(COUNTER, num_workers=4, route_sessions=False),
    **{backend: resource_server(COUNTER, num_workers=1) for backend in BACKENDS},
}


def instance_name(tree: Tree, instance: str) -> str:
    return f"{tree.label}_{instance}"


def row_name(label: str, tree: Tree, trees: list[Tree]) -> str:
    """A row's name in the runs: its label, and with a baseline the tree it ran from."""
    return label if len(trees) == 1 else f"{label} ({tree.label})"


def episodes_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log("1. counter episodes: starting servers")
    labels = [label for key, (label, _) in ROWS.items() if key in args.rows]
    haproxy_binary = None if args.no_haproxy or HAPROXY not in labels else shutil.which("haproxy")
    config: dict[str, Any] = {}
    tree_of: dict[str, Tree] = {}
    for tree in args.trees:
        wanted = {row.instance for key, (label, row) in ROWS.items() if key in args.rows and label != HAPROXY}
        wanted |= set(BACKENDS) if haproxy_binary else set()
        for instance in sorted(wanted):
            name = instance_name(tree, instance)
            config[name] = INSTANCES[instance]
            tree_of[name] = tree
    instances, config_path = write_config(log_dir, "episodes", config)
    haproxies: list[HAProxy] = []
    with Servers(log_dir) as servers:
        try:
            for name, instance in instances.items():
                servers.start(instance, config_path, tree_of[name])
            servers.wait_ready()
            workers = {
                name: settled_workers(servers.pid(name), instance.num_workers, routed=instance.settings.get("route_sessions", True))
                for name, instance in instances.items()
                if instance.num_workers > 1
            }
            # Each server's supervisor and workers; for HAProxy's row, HAProxy and its backends.
            processes = {name: [servers.pid(name), *workers.get(name, [])] for name in instances}
            targets: dict[str, str] = {}
            server_pids: dict[str, list[int]] = {}
            gym_clients = {}
            for key, (label, row) in ROWS.items():
                if key not in args.rows or (label == HAPROXY and not haproxy_binary):
                    continue
                for tree in args.trees:
                    target = row_name(label, tree, args.trees)
                    if label == HAPROXY:
                        backends = [instance_name(tree, backend) for backend in BACKENDS]
                        haproxy = HAProxy(haproxy_binary, [instances[b].url for b in backends], gym_config.free_port(), log_dir, f"haproxy.{tree.label}")
                        haproxies.append(haproxy)
                        targets[target] = haproxy.url
                        server_pids[target] = [haproxy.process.pid, *(servers.pid(b) for b in backends)]
                        continue
                    name = instance_name(tree, row.instance)
                    targets[target] = instances[name].url
                    server_pids[target] = processes[name]
                    if row.gym:
                        gym_clients[target] = partial(GymEpisodeClient, instances, name)
            runs = {
                pattern: asyncio.run(alternate(targets, counter_episode, args, args.episodes, args.concurrency, pattern, gym_clients, server_pids))
                for pattern in args.patterns
            }
            warnings = [REPLACED_WARNING.format(name) for name, pids in workers.items() if replaced(servers.pid(name), pids)]
        finally:
            for haproxy in haproxies:
                haproxy.stop()
    result: dict[str, Any] = {"warnings": warnings}
    for tree in args.trees:
        key = "patterns" if tree is args.trees[0] else tree.label
        result[key] = {
            pattern: episode_rows({label: each[row_name(label, tree, args.trees)] for label in labels if row_name(label, tree, args.trees) in each}, labels, args)
            for pattern, each in runs.items()
        }
    return result


def episode_rows(runs: dict[str, list[Run]], labels: list[str], args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name in labels:
        if name not in runs:
            rows[name] = {"skipped": "haproxy not installed" if not args.no_haproxy else "--no-haproxy"}
            continue
        spreads = [run.spread for run in runs[name] if run.spread is not None]
        rows[name] = {
            "total": args.episodes,
            "good": median([run.good for run in runs[name]]),
            "good_all_runs": [run.good for run in runs[name]],
            "errors": median([run.errors for run in runs[name]]),
            "per_second": median([run.per_second for run in runs[name]]),
            "p50_ms": median([run.p50_ms for run in runs[name]]),
            "p99_ms": median([run.p99_ms for run in runs[name]]),
            "spread": max(spreads) if spreads else None,
            "direct_share": median_of([run.direct_share for run in runs[name]]),
            "client_cpu_ms": median([run.client_cpu_ms for run in runs[name]]),
            "server_cpu_ms": median_of([run.server_cpu_ms for run in runs[name]]),
            "server_cpu_request_ms": median_of([run.server_cpu_request_ms for run in runs[name]]),
        }
    return rows


def median_of(values: list[float | None]) -> float | None:
    """The median of the values measured, None if none was."""
    measured = [value for value in values if value is not None]
    return median(measured) if measured else None


def episodes_table(result: dict, args: argparse.Namespace) -> str:
    tables = []
    for tree in args.trees:
        key = "patterns" if tree is args.trees[0] else tree.label
        for pattern, rows_by_name in result[key].items():
            tables.append(pattern_table(pattern, rows_by_name, args, "" if len(args.trees) == 1 else f", {tree.label} tree {tree.root}"))
    if len(args.trees) > 1:
        for pattern in result["patterns"]:
            tables.append(comparison_table(pattern, result["patterns"][pattern], result[args.trees[1].label][pattern], args))
    return "\n\n".join(tables)


def pattern_table(pattern: str, rows_by_name: dict[str, Any], args: argparse.Namespace, tree: str) -> str:
    haproxy = rows_by_name.get(HAPROXY, {}).get("per_second")
    one = rows_by_name.get(ONE_WORKER, {}).get("per_second")
    unrouted_cpu = rows_by_name.get(UNROUTED, {}).get("server_cpu_request_ms")
    rows = []
    for name, row in rows_by_name.items():
        if "skipped" in row:
            reason = row["skipped"]
            hint = f"; install: {HAPROXY_INSTALL}" if reason == "haproxy not installed" else ""
            rows.append([name, f"skipped ({reason}{hint})", "", "", "", "", "", "", "", "", "", "", "", ""])
            continue
        rows.append([
            name,
            f"{row['good']:.0f}/{row['total']}",
            f"{row['errors']:.0f}",
            fmt(row["per_second"], ".0f"),
            fmt(row["p50_ms"], ".1f"),
            fmt(row["p99_ms"], ".1f"),
            "-" if row["spread"] is None else f"±{row['spread']:.0%}",
            "-" if row["direct_share"] is None else f"{row['direct_share']:.1%}",
            fmt(row["server_cpu_ms"], ".2f"),
            fmt(row["server_cpu_request_ms"], ".3f"),
            fmt(ratio(row["server_cpu_request_ms"], unrouted_cpu), ".2f", "x"),
            fmt(row["client_cpu_ms"], ".2f"),
            fmt(ratio(row["per_second"], haproxy), ".2f", "x"),
            fmt(ratio(row["per_second"], one), ".2f", "x"),
        ])
    header = [
        "configuration", "reward 1.0 / total", "errors", "episodes/s", "p50 ms", "p99 ms", "sessions/worker", "direct",
        "server CPU ms/ep", "server CPU ms/req", "CPU/req vs routing off", "client CPU ms/ep", "vs HAProxy", "vs 1 worker",
    ]
    title = (
        f"1{'ab'[PATTERNS.index(pattern)]}. Counter episodes, {pattern} client{tree}: {args.episodes} per run at concurrency "
        f"{args.concurrency}, medians of {args.runs} runs (sessions/worker: the owner furthest from the mean, worst run; "
        "direct: the Gym client's requests with a session that reached the owner's worker with no hop; "
        "CPU, user and system: the server's processes (HAProxy's included) per episode and per request answered, and the "
        "benchmark's own, the client; on a machine with few cores the two compete)"
    )
    return f"{title}\n{render_table(header, rows)}"


def comparison_table(pattern: str, current: dict[str, Any], baseline: dict[str, Any], args: argparse.Namespace) -> str:
    """Each row of the current tree over the same row of the baseline's."""
    keys = ("per_second", "p50_ms", "server_cpu_ms", "server_cpu_request_ms")
    rows = []
    for name, row in current.items():
        if "skipped" in row:
            continue
        rows.append([name, *(fmt(ratio(row[key], baseline[name][key]), ".2f", "x") for key in keys)])
    header = ["configuration", "episodes/s", "p50 ms", "server CPU ms/ep", "server CPU ms/req"]
    title = f"1{'ab'[PATTERNS.index(pattern)]}. Counter episodes, {pattern} client: current / baseline ({args.trees[1].root})"
    return f"{title}\n{render_table(header, rows)}"
