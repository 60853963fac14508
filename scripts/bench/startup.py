"""Section 5, start-up: from launching a server until every one of its workers serves, and the CPU it spent.

The counter (as shipped: durable sessions, routed) at each of ``--startup-workers`` worker counts, started
alone, ``--runs`` times; with a baseline, each count runs for both trees in turn, in a rotated order.
Ready is the launcher's readiness: every worker of a multi-worker server holds its life name, which it
takes at the very end of its start-up (its private socket already serving; uvicorn accepts on the shared
port right after), and ``GET /`` answers 200. That is no luck of which worker a connection reaches.
CPU is user + system time of the server's process, its live descendants and its reaped children (a worker
uvicorn replaced counts too), read from /proc the moment it is ready.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym import config as gym_config
from nemo_gym.process.launcher import default_start_timeout
from scripts.bench.figures import fmt, log, median, ratio, render_table
from scripts.bench.proc import tree_cpu_seconds
from scripts.bench.processes import current_workers, is_resource_tracker
from scripts.bench.servers import COUNTER, Servers, Tree, resource_server, write_config

POLL_SECONDS = 0.02


@dataclass
class Start:
    seconds: float
    cpu_s: float
    # Worker processes seen while it started: more than it asked for means uvicorn replaced some.
    workers_started: int


def time_start(tree: Tree, instance: gym_config.Instance, config_path: Path, log_dir: Path) -> Start:
    """Start the instance from ``tree``, wait until every worker serves, measure, stop it."""
    deadline = time.monotonic() + default_start_timeout({instance.name: instance})
    seen: set[int] = set()
    with Servers(log_dir) as servers:
        started = time.monotonic()
        server = servers.start(instance, config_path, tree)
        while not server.serves(f"{instance.url}/", servers.socket_dir(instance.name), instance.num_workers):
            seen.update(current_workers(server.pid))
            if time.monotonic() > deadline:
                raise RuntimeError(f"{instance.name} was not serving with {instance.num_workers} workers in time:\n{server.log_tail()}")
            time.sleep(POLL_SECONDS)
        seconds = time.monotonic() - started
        cpu_s = tree_cpu_seconds(server.pid)
        seen.update(current_workers(server.pid))
        # A child seen before its exec may have become the resource tracker since.
        started_workers = {child for child in seen if not is_resource_tracker(child)}
    return Start(seconds, cpu_s, len(started_workers) if instance.num_workers > 1 else 1)


def startup_section(args: argparse.Namespace, log_dir: Path) -> dict:
    counts = args.startup_workers
    log(f"5. start-up: the counter at {', '.join(map(str, counts))} workers, {args.runs} runs")
    config = {f"{tree.label}_counter_{count}w": resource_server(COUNTER, num_workers=count) for tree in args.trees for count in counts}
    instances, config_path = write_config(log_dir, "startup", config)
    starts: dict[str, dict[int, list[Start]]] = {tree.label: {count: [] for count in counts} for tree in args.trees}
    for round_ in range(args.runs):
        for count in counts:
            shift = round_ % len(args.trees)
            for tree in args.trees[shift:] + args.trees[:shift]:
                start = time_start(tree, instances[f"{tree.label}_counter_{count}w"], config_path, log_dir)
                starts[tree.label][count].append(start)
                log(f"  run {round_ + 1}/{args.runs} {count} workers, {tree.label}: {start.seconds:.1f} s, {start.cpu_s:.1f} s CPU")
    return summarize(starts, counts)


def summarize(starts: dict[str, dict[int, list[Start]]], counts: list[int]) -> dict[str, Any]:
    """Medians per tree and worker count, and with a baseline (the second tree) the current tree's over its."""
    result: dict[str, Any] = {"workers": counts, "trees": {}}
    for label, by_count in starts.items():
        result["trees"][label] = {
            count: {
                "seconds": median([start.seconds for start in each]),
                "cpu_s": median([start.cpu_s for start in each]),
                "all_seconds": [start.seconds for start in each],
                "workers_started": max(start.workers_started for start in each),
            }
            for count, each in by_count.items()
        }
    labels = list(starts)
    if len(labels) > 1:
        current, baseline = (result["trees"][label] for label in labels[:2])
        result["ratios"] = {
            count: {key: ratio(current[count][key], baseline[count][key]) for key in ("seconds", "cpu_s")} for count in counts
        }
    result["warnings"] = [
        f"WARNING: uvicorn replaced a worker of the {label} tree's {count}-worker counter while it started ({figures['workers_started']} workers started)"
        for label, by_count in result["trees"].items()
        for count, figures in by_count.items()
        if count > 1 and figures["workers_started"] > count
    ]
    return result


def startup_table(result: dict, args: argparse.Namespace) -> str:
    header = ["workers"]
    for tree in args.trees:
        header += [f"{tree.label} s", f"{tree.label} CPU s", f"{tree.label} CPU s/process"]
    if "ratios" in result:
        header += ["s current/baseline", "CPU current/baseline"]
    rows = []
    for count in result["workers"]:
        row = [str(count)]
        for tree in args.trees:
            figures = result["trees"][tree.label][count]
            processes = count + 1 if count > 1 else 1  # uvicorn's supervisor imports the server too
            row += [fmt(figures["seconds"], ".1f"), fmt(figures["cpu_s"], ".1f"), fmt(figures["cpu_s"] / processes, ".2f")]
        if "ratios" in result:
            row += [fmt(result["ratios"][count]["seconds"], ".2f", "x"), fmt(result["ratios"][count]["cpu_s"], ".2f", "x")]
        rows.append(row)
    title = (
        f"5. Start-up: the counter, from launching its server until every worker serves, medians of {args.runs} runs "
        "(CPU: user and system of the server's processes until then; per process: over the supervisor and its workers)"
    )
    trees = [f"   {tree.label}: {tree.root}" for tree in args.trees] if len(args.trees) > 1 else []
    return "\n".join([title, render_table(header, rows), *trees])
