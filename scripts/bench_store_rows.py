"""The SQLite store's cost of a row's size: counter episodes written by several processes, as rows that
remember their requests (``durable.applied``) and as the bare states and tombstone alone.

Each writer process commits groups of ``--group`` sessions, an episode's four rows in turn (seed 0, +1,
+2, the verify's tombstone), on the store file all share, as workers do (``SQLiteStore.commit``); the
two kinds of rows run in alternating rounds, each on a fresh file, and the median CPU per row write of
each (the writers' own, the waits for the write lock included) is printed with the file's size. A
remembered reply is the counter's (``{}``, ``{"success":true}``, and a verify reply of
``--verify-bytes``); a row past SQLite's local payload (about 1000 bytes in a 4 KiB page) spills into
an overflow page of its own. Timings are only printed, never asserted.

    python -m scripts.bench_store_rows --episodes 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from nemo_gym.durable.applied import Applied, wrap
from nemo_gym.durable.sqlite_store import SQLiteStore
from nemo_gym.durable.tombstones import tombstone

HEADERS = (("content-type", "application/json"),)


def episode_rows(remembering: bool, verify_bytes: int) -> list[str]:
    """The four rows of one episode, as the store holds them after each of its requests."""
    replies = [b"{}", b'{"success":true}', b'{"success":true}', b"x" * verify_bytes]
    contents = ["0", "1", "3", tombstone(f"Session {uuid.uuid4().hex} ended with its /verify; its state is gone. Seed a new session.")]
    if not remembering:
        return contents
    applied = [Applied(uuid.uuid4().hex, 200, HEADERS, body) for body in replies]
    return [wrap(content, applied[: index + 1]) for index, content in enumerate(contents)]


def writer(path: str, owner: str, rows: list[str], episodes: int, group: int, results: multiprocessing.Queue) -> None:
    store = SQLiteStore(Path(path))

    async def write() -> float:
        started, writes = time.process_time(), 0
        for _ in range(episodes // group):
            sessions = [uuid.uuid4().hex for _ in range(group)]
            for row in rows:
                await store.commit(owner, dict.fromkeys(sessions, row))
                writes += group
        return (time.process_time() - started) / writes

    results.put(asyncio.run(write()))
    store.close()


def round_of(remembering: bool, args: argparse.Namespace) -> tuple[float, int]:
    """CPU seconds per row write, over all writers, and the store's size after the round."""
    with tempfile.TemporaryDirectory(prefix="nemo_gym_bench_store_rows_") as directory:
        path = Path(directory) / "store.sqlite3"
        SQLiteStore(path).close()
        rows = episode_rows(remembering, args.verify_bytes)
        results: multiprocessing.Queue = multiprocessing.Queue()
        writers = [
            multiprocessing.Process(target=writer, args=(str(path), f"worker{index}", rows, args.episodes // args.writers, args.group, results))
            for index in range(args.writers)
        ]
        for process in writers:
            process.start()
        per_write = [results.get() for _ in writers]
        for process in writers:
            process.join()
        store = SQLiteStore(path)
        size = store.size_bytes()
        store.close()
        return statistics.mean(per_write), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per round, over all writers")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--group", type=int, default=25, help="sessions per commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--verify-bytes", type=int, default=1539, help="the verify reply's size (the counter's at 4 workers)")
    args = parser.parse_args()
    figures: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for remembering in figures:
            figures[remembering].append(round_of(remembering, args))
    for remembering, rounds in figures.items():
        sizes = [len(row) for row in episode_rows(remembering, args.verify_bytes)]
        print(
            f"{'remembering requests' if remembering else 'bare states':>21}: rows of {sizes} characters, "
            f"{statistics.median(cpu for cpu, _ in rounds) * 1e6:.1f} µs CPU per row write (median of {args.rounds}), "
            f"store {statistics.median(size for _, size in rounds) / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
