"""Section 3, memory: each routed worker's resident memory before and after many new sessions on routes that store nothing."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from scripts.bench.client import VERIFY_BODY, EpisodeClient, bench_episode
from scripts.bench.driving import drive
from scripts.bench.figures import fmt, log, render_table
from scripts.bench.proc import cpu_seconds, private_socket, rss_bytes
from scripts.bench.processes import REPLACED_WARNING, replaced, settled_workers
from scripts.bench.servers import BENCH_SERVE, Servers, bench_server, owner_of, write_config


async def measure_memory(args: argparse.Namespace, url: str, pids: list[int], socket_of: dict[int, str]) -> dict:
    await drive(bench_episode, url, args.memory_warmup, args.concurrency)
    before = {pid: rss_bytes(pid) for pid in pids}
    cpu_before = {pid: cpu_seconds(pid) for pid in pids}
    owned: Counter[str] = Counter()

    async def counted_episode(client: EpisodeClient, url: str) -> Any:
        cookies: dict[str, str] = {}
        await client.post(f"{url}/seed_session", {}, cookies)
        owned[owner_of(cookies, "bench_mem")] += 1
        reply = await client.post(f"{url}/verify", VERIFY_BODY, cookies)
        return reply.get("reward")

    started = time.perf_counter()
    run = await drive(counted_episode, url, args.sessions, args.concurrency)
    seconds = time.perf_counter() - started
    after = {pid: rss_bytes(pid) for pid in pids}
    workers = []
    for pid in pids:
        worker_id = Path(socket_of[pid]).stem
        workers.append({
            "pid": pid,
            "sessions": owned.get(worker_id, 0),
            "cpu_s": cpu_seconds(pid) - cpu_before[pid],
            "rss_before_mb": before[pid] / 2**20,
            "rss_after_mb": after[pid] / 2**20,
            "growth_mb": (after[pid] - before[pid]) / 2**20,
        })
    return {"sessions": args.sessions, "good": run.good, "errors": run.errors, "seconds": seconds, "workers": workers}

def memory_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log(f"3. memory: {args.sessions} sessions over {args.memory_workers} routed workers")
    instances, config_path = write_config(log_dir, "memory", {"bench_mem": bench_server(num_workers=args.memory_workers)})
    with Servers(log_dir) as servers:
        servers.start(instances["bench_mem"], config_path, module=BENCH_SERVE)
        servers.wait_ready()
        pids = settled_workers(servers.pid("bench_mem"), args.memory_workers, routed=True)
        socket_of = {pid: private_socket(pid) or "?" for pid in pids}
        result = asyncio.run(measure_memory(args, instances["bench_mem"].url, pids, socket_of))
        result["warnings"] = [REPLACED_WARNING.format("the server")] if replaced(servers.pid("bench_mem"), pids) else []
        return result


def memory_table(result: dict, args: argparse.Namespace) -> str:
    rows = [
        [
            str(w["pid"]),
            str(w["sessions"]),
            fmt(w["cpu_s"], ".1f"),
            fmt(w["rss_before_mb"], ".1f"),
            fmt(w["rss_after_mb"], ".1f"),
            fmt(w["growth_mb"], "+.2f"),
        ]
        for w in result["workers"]
    ]
    header = ["worker pid", "sessions owned", "CPU s", "RSS before MB", "RSS after MB", "growth MB"]
    title = (
        f"3. Memory: {result['sessions']} new sessions (POST /seed_session storing nothing, then /verify with the cookie, "
        f"routed to the owner) over {args.memory_workers} workers in {result['seconds']:.0f} s; "
        f"{result['good']}/{result['sessions']} verified, {result['errors']} errors"
    )
    return f"{title}\n{render_table(header, rows)}"
