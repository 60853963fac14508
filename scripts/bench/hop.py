"""Section 2, hop cost: a request to the worker that owns its session, to the other one (forwarded), and
straight to the owner's private socket (the owner's share of a forward), one request at a time."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp

from nemo_gym import config as gym_config
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir, socket_address
from scripts.bench.client import EpisodeClient
from scripts.bench.hand_off_floor import hand_off_floor
from scripts.bench.figures import fmt, log, median, percentile, ratio, render_table
from scripts.bench.proc import cpu_times
from scripts.bench.processes import Spawned
from scripts.bench.servers import BENCH_MODULE, COUNTER, COUNTER_MODULE, owner_of, resource_server, server_env, write_config

LOCAL = "local"
FORWARDED = "forwarded"
DIRECT = "owner's private socket"
# Passes per run of the hand-off's floor (``hand_off_floor``): about 0.15 s of CPU.
FLOOR_PASSES = 3000


async def measure_hops(args: argparse.Namespace, urls: list[str], socket_dir: str, pids: list[int]) -> dict:
    """One request at a time. Sessions a (owned by worker 0) and b (owned by worker 1)."""
    client = EpisodeClient()
    sessions: list[dict[str, str]] = []
    for url in urls:
        cookies: dict[str, str] = {}
        await client.post(f"{url}/seed_session", {"initial_count": 0}, cookies)
        sessions.append(cookies)
    owners = [owner_of(cookies, "hop") for cookies in sessions]
    if owners[0] == owners[1] or None in owners:
        raise RuntimeError(f"the two hop sessions should have different owners, got {owners}")
    # Straight to each owner's private socket: what the owner itself spends on a forwarded request.
    direct = [EpisodeClient(connector=aiohttp.UnixConnector(socket_address(socket_dir, owner))) for owner in owners]
    # Each kind alternates between the two sessions: (client, url, session index).
    kinds = {
        LOCAL: [(client, urls[0], 0), (client, urls[1], 1)],
        FORWARDED: [(client, urls[1], 0), (client, urls[0], 1)],
        DIRECT: [(direct[0], "http://owner", 0), (direct[1], "http://owner", 1)],
    }
    increments = [0, 0]
    per_run: dict[str, list[dict]] = {kind: [] for kind in kinds}
    blocks = max(1, args.hop_requests // args.hop_block)
    try:
        for _ in range(min(200, args.hop_requests) // 2):  # warm-up: every path, every connection
            for targets in kinds.values():
                for target_client, url, index in targets:
                    await target_client.post(f"{url}/increment_counter", {"count": 1}, sessions[index])
                    increments[index] += 1
        for round_ in range(args.runs):
            latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
            user: dict[str, float] = dict.fromkeys(kinds, 0.0)
            system: dict[str, float] = dict.fromkeys(kinds, 0.0)
            names = list(kinds)
            for block in range(blocks):
                shift = (round_ + block) % len(names)
                for kind in names[shift:] + names[:shift]:
                    user_before, system_before = map(sum, zip(*(cpu_times(pid) for pid in pids)))
                    for i in range(args.hop_block):
                        target_client, url, index = kinds[kind][i % 2]
                        started = time.perf_counter()
                        await target_client.post(f"{url}/increment_counter", {"count": 1}, sessions[index])
                        latencies[kind].append(time.perf_counter() - started)
                        increments[index] += 1
                    user_after, system_after = map(sum, zip(*(cpu_times(pid) for pid in pids)))
                    user[kind] += user_after - user_before
                    system[kind] += system_after - system_before
            for kind in kinds:
                per_run[kind].append({
                    "p50_ms": percentile(latencies[kind], 50) * 1000,
                    "p99_ms": percentile(latencies[kind], 99) * 1000,
                    "user_ms": user[kind] / len(latencies[kind]) * 1000,
                    "system_ms": system[kind] / len(latencies[kind]) * 1000,
                })
            log(f"  run {round_ + 1}/{args.runs}: " + ", ".join(f"{k} p50 {per_run[k][-1]['p50_ms']:.3f} ms" for k in kinds))
        # Every increment, local or forwarded, reached its session's state on its owner.
        counts = []
        for url, cookies in zip(urls, sessions):
            counts.append((await client.post(f"{url}/get_counter_value", {}, cookies))["count"])
    finally:
        await client.close()
        for each in direct:
            await each.close()
    result = {kind: {key: median([run[key] for run in runs]) for key in ("p50_ms", "p99_ms", "user_ms", "system_ms")} for kind, runs in per_run.items()}
    result["state_intact"] = counts == increments
    result["requests_per_run"] = blocks * args.hop_block
    return result


def hop_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log("2. hop cost: starting two workers of one server, each in its own process")
    _, config_path = write_config(log_dir, "hop", {"hop": resource_server(COUNTER, num_workers=2, durable_sessions=False)})
    socket_dir = make_socket_dir()
    ports = [gym_config.free_port(), gym_config.free_port()]
    workers: list[Spawned] = []
    try:
        for i, port in enumerate(ports):
            argv = [sys.executable, "-m", BENCH_MODULE, "worker", "--module", COUNTER_MODULE, "--port", str(port)]
            workers.append(Spawned(f"hop_worker_{i}", argv, log_dir, server_env(config_path, "hop", socket_dir)))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for worker, url in zip(workers, urls):
            worker.wait_ready(f"{url}/", socket_dir=socket_dir, workers=len(workers))
        result = asyncio.run(measure_hops(args, urls, socket_dir, [worker.pid for worker in workers]))
    finally:
        for worker in workers:
            worker.stop()
        remove_socket_dir(socket_dir)
    log("   the hand-off's floor: a bare connection passed between two processes")
    result["floor"] = median([hand_off_floor(max(FLOOR_PASSES, args.hop_requests))["total_us"] for _ in range(args.runs)])
    return result


def hop_table(result: dict, args: argparse.Namespace) -> str:
    local = result[LOCAL]
    extra_us = (result[FORWARDED]["user_ms"] + result[FORWARDED]["system_ms"] - local["user_ms"] - local["system_ms"]) * 1000
    rows = []
    for kind in (LOCAL, FORWARDED, DIRECT):
        row = result[kind]
        rows.append([
            kind,
            fmt(row["p50_ms"], ".3f"),
            fmt(row["p99_ms"], ".3f"),
            fmt(ratio(row["p50_ms"], local["p50_ms"]), ".2f", "x"),
            fmt(ratio(row["p99_ms"], local["p99_ms"]), ".2f", "x"),
            fmt(row["user_ms"], ".3f"),
            fmt(row["system_ms"], ".3f"),
        ])
    header = ["request", "p50 ms", "p99 ms", "p50 / local", "p99 / local", "user CPU ms", "system CPU ms"]
    title = (
        f"2. Hop cost: POST /increment_counter one at a time, {result['requests_per_run']} of each kind per run, "
        f"medians of {args.runs} runs"
    )
    notes = [
        "   local: to the worker that owns the session; forwarded: to the other worker, which forwards it;",
        "   owner's private socket: straight to the owner's Unix socket, the owner's share of a forward.",
        "   CPU: both workers' user and system (kernel) time per request, from /proc (10 ms ticks, summed over blocks).",
        f"   every increment reached its session's state: {'yes' if result['state_intact'] else 'NO'}",
        f"   forwarded: {extra_us:.0f} us more CPU than local per request. The floor of a hand-off on this stack, the public port's",
        "   other way to a sibling (a bare connection passed to another process and served there, nothing parsed,",
        f"   scripts/bench/hand_off_floor.py): {result['floor']:.0f} us of CPU, both processes.",
    ]
    return "\n".join([title, render_table(header, rows), *notes])
