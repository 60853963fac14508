"""Durable sessions, side by side: counter episodes at 4 routed workers, in memory vs written through.

Starts two counter instances (one with ``durable_sessions: false``), alternates runs of the same
episodes (seed, +1, +2, verify) against each, prints medians and the ratio, then the store's size
after 100,000 ended sessions written as the counter writes them (three writes, then the verify's delete).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from nemo_gym import config as gym_config
from nemo_gym.durable.sqlite_store import SQLiteStore
from nemo_gym.process.launcher import Launcher
from scripts.bench.client import counter_episode
from scripts.bench.driving import alternate
from scripts.bench.figures import median
from scripts.bench.servers import resource_server

COUNTER = "example_session_state_mgmt"


def counter(durable: bool, workers: int) -> dict:
    """With the benchmark's own secret, by which it reads the owner in each cookie."""
    return resource_server(COUNTER, num_workers=workers, durable_sessions=durable)


def throughput(args: argparse.Namespace, state_dir: str) -> None:
    config = {"in_memory": counter(False, args.workers), "durable": counter(True, args.workers)}
    instances = gym_config.parse(config)
    with Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": state_dir}):
        targets = {f"{args.workers} workers, routed, {name.replace('_', '-')}": instance.url for name, instance in instances.items()}
        runs = asyncio.run(alternate(targets, counter_episode, args, args.episodes, args.concurrency))
    per_second = {name: median([run.per_second for run in each]) for name, each in runs.items()}
    for name, each in runs.items():
        good = sum(run.good for run in each)
        total = sum(run.total for run in each)
        p50 = median([run.p50_ms for run in each])
        print(f"{name:32} {good}/{total} reward 1.0  {per_second[name]:7.0f} episodes/s  p50 {p50:.1f} ms")
    memory, durable = per_second.values()
    print(f"durable / in memory: {durable / memory:.2f}x")


def store_size(sessions: int, state_dir: str) -> None:
    store = SQLiteStore(Path(state_dir) / "sessions" / "size.sqlite3")
    started = time.perf_counter()
    for _ in range(sessions):
        session_id, owner = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        for count in ("0", "1", "3"):
            store.write(session_id, owner, count)
        store.delete(session_id)
    seconds = time.perf_counter() - started
    print(
        f"store after {sessions} ended sessions: file {store.path.stat().st_size / 1024:.0f} KiB, "
        f"file + write-ahead log {store.size_bytes() / 1024:.0f} KiB; {seconds / sessions / 4 * 1e6:.0f} us per write or delete"
    )
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per run")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=100_000, help="ended sessions for the store-size figure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nemo_gym_bench_durable_") as state_dir:
        throughput(args, state_dir)
        store_size(args.sessions, state_dir)


if __name__ == "__main__":
    main()
