"""Durable sessions, side by side: counter episodes at 4 routed workers, in memory vs written through.

Starts three counter instances, in memory (``durable_sessions: false``), durable on SQLite (the
default store) and durable on PostgreSQL (``session_store: postgresql://...``, a PostgreSQL this script
starts in a temporary directory with tests/postgres.py: root and Debian's postgresql needed, else the
row is left out and says why), alternates runs of the same episodes (seed, +1, +2, verify) against
each, prints medians, the ratios to in memory and the server CPU per request (the workers', and for
PostgreSQL its server processes' too), then the store's size after 100,000 ended sessions written as the
counter writes them (three writes, then the verify's delete).

With ``--baseline PATH`` (another checkout of this project, e.g. ``git worktree add /tmp/base <commit>``),
the three instances run from both trees, each server with its own tree's code, in the same rounds (one
PostgreSQL, an instance's rows apart from another's), and each store's row of this tree is also given
over the baseline's: throughput and server CPU per request.

    python -m scripts.bench_durable --baseline /tmp/base --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from pathlib import Path

from nemo_gym.durable.sqlite_store import SQLiteStore
from scripts.bench.client import counter_episode
from scripts.bench.driving import Run, alternate, drive
from scripts.bench.figures import median
from scripts.bench.proc import descendants
from scripts.bench.servers import COUNTER, CURRENT, Servers, Tree, resource_server, write_config
from tests.postgres import Postgres, PostgresUnavailable

# seed, +1, +2, verify
REQUESTS_PER_EPISODE = 4
IN_MEMORY = "in_memory"
STORES = ("durable_sqlite", "durable_postgresql")


def server_pids(pid: int) -> list[int]:
    """A server's process and all it started (its workers; PostgreSQL's backends)."""
    return [pid, *descendants(pid)]


def counter(durable: bool, workers: int, **settings) -> dict:
    """With the benchmark's own secret, by which it reads the owner in each cookie."""
    return resource_server(COUNTER, num_workers=workers, durable_sessions=durable, **settings)


def label(tree: Tree, trees: list[Tree], row: str) -> str:
    return row if len(trees) == 1 else f"{row} ({tree.label})"


def throughput(args: argparse.Namespace, log_dir: Path) -> dict[str, list[Run]]:
    """Each row's runs, by ``label``: in memory and each store, for each tree."""
    with contextlib.ExitStack() as stack:
        try:
            database = stack.enter_context(Postgres())
        except PostgresUnavailable as error:
            print(f"no PostgreSQL row: {error}")
            database = None
        rows = {IN_MEMORY: counter(False, args.workers), "durable_sqlite": counter(True, args.workers)}
        if database is not None:
            rows["durable_postgresql"] = counter(True, args.workers, session_store=database.dsn())
        named = {f"{tree.label}_{row}": (tree, row) for tree in args.trees for row in rows}
        instances, config_path = write_config(log_dir, "durable", {name: rows[row] for name, (_, row) in named.items()})
        servers = stack.enter_context(Servers(log_dir))
        for name, instance in instances.items():
            servers.start(instance, config_path, named[name][0])
        servers.wait_ready()
        targets = {label(tree, args.trees, row): instances[name].url for name, (tree, row) in named.items()}
        for url in targets.values():  # every worker's connections made (PostgreSQL's backends started) before its processes are listed
            asyncio.run(drive(counter_episode, url, args.concurrency, args.concurrency))
        pids = {label(tree, args.trees, row): server_pids(servers.pid(name)) for name, (tree, row) in named.items()}
        for tree in args.trees:
            if database is not None:
                pids[label(tree, args.trees, "durable_postgresql")] += server_pids(database.process.pid)
        return asyncio.run(alternate(targets, counter_episode, args, args.episodes, args.concurrency, server_pids=pids))


def cpu_ms(runs: list[Run]) -> float:
    """The server's CPU per request answered, over all of a row's runs."""
    return sum(run.server_cpu_s for run in runs) / sum(len(run.latencies) for run in runs) * 1000


def report(runs: dict[str, list[Run]], trees: list[Tree]) -> None:
    per_second = {name: median([run.per_second for run in each]) for name, each in runs.items()}
    for tree in trees:
        memory = per_second[label(tree, trees, IN_MEMORY)]
        for row in (IN_MEMORY, *STORES):
            name = label(tree, trees, row)
            if name not in runs:
                continue
            each = runs[name]
            good, total = sum(run.good for run in each), sum(run.total for run in each)
            p50 = median([run.p50_ms for run in each])
            print(
                f"{name:30} {good}/{total} reward 1.0  {per_second[name]:7.0f} episodes/s ({per_second[name] / memory:.2f}x in memory)"
                f"  p50 {p50:.1f} ms  server CPU {cpu_ms(each):.2f} ms per request"
                f"  runs {', '.join(f'{run.per_second:.0f}' for run in each)}"
            )
    if len(trees) > 1:
        current, baseline = trees[0], trees[1]
        print(f"\n{current.label} ({current.root}) over {baseline.label} ({baseline.root}):")
        for row in (IN_MEMORY, *STORES):
            new, old = label(current, trees, row), label(baseline, trees, row)
            if new not in runs:
                continue
            print(
                f"{row:30} throughput {per_second[new] / per_second[old]:.2f}x"
                f"  server CPU {cpu_ms(runs[new]):.2f} vs {cpu_ms(runs[old]):.2f} ms per request ({cpu_ms(runs[new]) - cpu_ms(runs[old]):+.2f})"
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
    parser.add_argument("--sessions", type=int, default=100_000, help="ended sessions for the store-size figure (0: none)")
    parser.add_argument("--baseline", type=Path, help="another checkout of this project, whose servers run side by side with this one's")
    args = parser.parse_args()
    args.trees = [CURRENT]
    if args.baseline is not None:
        if not (args.baseline / "nemo_gym").is_dir():
            parser.error(f"--baseline {args.baseline}: not a checkout of this project (no nemo_gym/ in it)")
        args.trees.append(Tree("baseline", args.baseline.resolve()))
    with tempfile.TemporaryDirectory(prefix="nemo_gym_bench_durable_") as log_dir:
        report(throughput(args, Path(log_dir)), args.trees)
        if args.sessions > 0:
            store_size(args.sessions, log_dir)


if __name__ == "__main__":
    main()
