"""Durable sessions, side by side: counter episodes at 4 routed workers, in memory vs written through.

Starts three counter instances, in memory (``durable_sessions: false``), durable on SQLite (the
default store) and durable on PostgreSQL (``session_store: postgresql://...``, a PostgreSQL this script
starts in a temporary directory with tests/postgres.py: root and Debian's postgresql needed, else the
row is left out and says why), alternates runs of the same episodes (seed, +1, +2, verify) against
each, prints medians, the ratios to in memory and the server CPU per request (the workers', and for
PostgreSQL its server processes' too), then the store's size after 100,000 ended sessions written as the
counter writes them (three writes, then the verify's delete).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from pathlib import Path

from nemo_gym import config as gym_config
from nemo_gym.durable.sqlite_store import SQLiteStore
from nemo_gym.process.launcher import Launcher
from scripts.bench.client import counter_episode
from scripts.bench.driving import alternate, drive
from scripts.bench.figures import median
from scripts.bench.proc import descendants
from scripts.bench.servers import resource_server
from tests.postgres import Postgres, PostgresUnavailable

COUNTER = "example_session_state_mgmt"
# seed, +1, +2, verify
REQUESTS_PER_EPISODE = 4


def server_pids(pid: int) -> list[int]:
    """A server's process and all it started (its workers; PostgreSQL's backends)."""
    return [pid, *descendants(pid)]


def counter(durable: bool, workers: int, **settings) -> dict:
    """With the benchmark's own secret, by which it reads the owner in each cookie."""
    return resource_server(COUNTER, num_workers=workers, durable_sessions=durable, **settings)


def throughput(args: argparse.Namespace, state_dir: str) -> None:
    config = {"in_memory": counter(False, args.workers), "durable_sqlite": counter(True, args.workers)}
    with contextlib.ExitStack() as stack:
        try:
            database = stack.enter_context(Postgres())
            config["durable_postgresql"] = counter(True, args.workers, session_store=database.dsn())
        except PostgresUnavailable as error:
            print(f"no PostgreSQL row: {error}")
            database = None
        instances = gym_config.parse(config)
        launcher = stack.enter_context(Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": state_dir}))
        label = {name: f"{args.workers} workers, routed, {name.replace('_', ' ')}" for name in instances}
        targets = {label[name]: instance.url for name, instance in instances.items()}
        for url in targets.values():  # every worker's connections made (PostgreSQL's backends started) before its processes are listed
            asyncio.run(drive(counter_episode, url, args.concurrency, args.concurrency))
        pids = {label[name]: server_pids(launcher.processes[name].pid) for name in instances}
        if database is not None:
            pids[label["durable_postgresql"]] += server_pids(database.process.pid)
        runs = asyncio.run(alternate(targets, counter_episode, args, args.episodes, args.concurrency, server_pids=pids))
    per_second = {name: median([run.per_second for run in each]) for name, each in runs.items()}
    memory = per_second[label["in_memory"]]
    for name, each in runs.items():
        good = sum(run.good for run in each)
        total = sum(run.total for run in each)
        p50 = median([run.p50_ms for run in each])
        cpu_ms = sum(run.server_cpu_s for run in each) / (total * REQUESTS_PER_EPISODE) * 1000
        print(
            f"{name:40} {good}/{total} reward 1.0  {per_second[name]:7.0f} episodes/s ({per_second[name] / memory:.2f}x in memory)"
            f"  p50 {p50:.1f} ms  server CPU {cpu_ms:.2f} ms per request"
        )


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
