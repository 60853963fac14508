"""Section 4, CPU-bound scale: throughput at 2 workers over 1 when each verify burns CPU."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from scripts.bench.client import bench_episode
from scripts.bench.driving import alternate
from scripts.bench.figures import fmt, log, median, ratio, render_table
from scripts.bench.processes import REPLACED_WARNING, replaced, settled_workers
from scripts.bench.servers import BENCH_SERVE, Servers, bench_server, write_config


def cpu_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log(f"4. CPU-bound scale: verify burns {args.verify_cpu_ms} ms of CPU")
    settings = {"verify_cpu_ms": args.verify_cpu_ms}
    config = {
        "bench_cpu_1w": bench_server(num_workers=1, **settings),
        "bench_cpu_2w": bench_server(num_workers=2, **settings),
    }
    instances, config_path = write_config(log_dir, "cpu", config)
    with Servers(log_dir) as servers:
        for instance in instances.values():
            servers.start(instance, config_path, module=BENCH_SERVE)
        servers.wait_ready()
        workers = {name: settled_workers(servers.pid(name), instance.num_workers, routed=True) for name, instance in instances.items()}
        targets = {"1 worker": instances["bench_cpu_1w"].url, "2 workers": instances["bench_cpu_2w"].url}
        runs = asyncio.run(alternate(targets, bench_episode, args, args.cpu_episodes, args.cpu_concurrency))
        warnings = [REPLACED_WARNING.format(name) for name, pids in workers.items() if replaced(servers.pid(name), pids)]
    result = {name: {"per_second": median([r.per_second for r in rs]), "good": median([r.good for r in rs])} for name, rs in runs.items()}
    result["scale"] = ratio(result["2 workers"]["per_second"], result["1 worker"]["per_second"])
    result["warnings"] = warnings
    return result


def cpu_table(result: dict, args: argparse.Namespace) -> str:
    rows = [[name, fmt(result[name]["per_second"], ".1f"), f"{result[name]['good']:.0f}/{args.cpu_episodes}"] for name in ("1 worker", "2 workers")]
    rows.append(["2 workers / 1 worker", fmt(result["scale"], ".2f", "x"), ""])
    title = (
        f"4. CPU-bound scale: seed + verify burning {args.verify_cpu_ms:g} ms CPU, {args.cpu_episodes} episodes per run "
        f"at concurrency {args.cpu_concurrency}, medians of {args.runs} runs"
    )
    return f"{title}\n{render_table(['configuration', 'episodes/s', 'verified'], rows)}"


