"""Where a new session should live: on the worker that has started the fewest, not on whichever accepted.

The kernel spreads connections over a server's workers unevenly, and a session lives where its first
request is served, so without help some workers hold several times the sessions of others. Each worker
has an 8-byte counter of the sessions started on it, in a file of its own beside its socket that every
sibling keeps mapped in memory. A decision reads a few integers from memory; the worker that decides
adds one to the chosen worker's counter at once (under that file's lock), so a burst of new sessions
arriving together spreads out instead of all going to the same least-loaded worker. No table of
sessions is kept anywhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import mmap
import os
import struct
import time

from nemo_gym.routing.liveness import is_alive

COUNT_SUFFIX = ".sessions"
COUNT = struct.Struct("q")
# A worker keeps its new sessions while it has started at most this many more than the least-loaded:
# the totals stay this close, so the sessions of any stretch of time spread evenly too.
SLACK = 2
# How often siblings that died are noticed while all are present.
REFRESH_SECONDS = 1.0


def count_path(socket_dir: str, worker_id: str) -> str:
    return os.path.join(socket_dir, worker_id + COUNT_SUFFIX)


class SessionCount:
    """One worker's counter, mapped in memory; ``add`` holds the file's lock, as every writer does."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self.view = mmap.mmap(self.fd, COUNT.size)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def value(self) -> int:
        return COUNT.unpack_from(self.view)[0]

    def add(self, amount: int) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            COUNT.pack_into(self.view, 0, self.value + amount)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.view.close()
        os.close(self.fd)


class Placement:
    """This worker's session counter and its siblings', and the choice of where a new session starts."""

    def __init__(self, socket_dir: str, worker_id: str, num_workers: int, balance: bool = True) -> None:
        self.socket_dir = socket_dir
        self.worker_id = worker_id
        self.num_workers = num_workers
        # Off, every new session starts where it arrives.
        self.balance = balance
        self.own: SessionCount | None = None
        self.siblings: dict[str, SessionCount] = {}
        self.refreshed = 0.0

    def open(self) -> None:
        """Publish this worker's counter, starting level with the least-loaded sibling (a replacement
        worker that started at 0 would otherwise take every new session until it caught up)."""
        self.refresh()
        path = count_path(self.socket_dir, self.worker_id)
        with open(path, "wb") as file:
            file.write(COUNT.pack(min(self.counts().values(), default=0)))
        self.own = SessionCount(path)

    def close(self) -> None:
        for count in self.siblings.values():
            count.close()
        self.siblings.clear()
        if self.own is not None:
            self.own.close()
            self.own = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(count_path(self.socket_dir, self.worker_id))

    def counts(self) -> dict[str, int]:
        return {worker: count.value for worker, count in self.siblings.items()}

    def choose(self) -> str | None:
        """Where the next new session starts, counted there at once: a sibling's ID, or None for here."""
        if self.own is None:
            return None
        target = self.least_loaded() if self.balance else None
        (self.own if target is None else self.siblings[target]).add(1)
        return target

    def least_loaded(self) -> str | None:
        # While a sibling is missing (starting, or replacing a dead one), look for it at every decision.
        if len(self.siblings) < self.num_workers - 1 or time.monotonic() - self.refreshed > REFRESH_SECONDS:
            self.refresh()
        counts = {worker: count.value for worker, count in self.siblings.items()}
        if not counts:
            return None
        least = min(counts, key=counts.__getitem__)
        return least if self.own.value - counts[least] > SLACK else None

    def taken_back(self, worker_id: str) -> None:
        """A session meant for a sibling starts here after all (the sibling was dead or too busy)."""
        count = self.siblings.get(worker_id)
        if count is not None:
            count.add(-1)
        if not is_alive(self.socket_dir, worker_id):
            self.forget(worker_id)
        self.own.add(1)

    def forget(self, worker_id: str) -> None:
        count = self.siblings.pop(worker_id, None)
        if count is not None:
            count.close()

    def refresh(self) -> None:
        self.refreshed = time.monotonic()
        present = set()
        for path in glob.glob(os.path.join(glob.escape(self.socket_dir), "*" + COUNT_SUFFIX)):
            worker = os.path.basename(path)[: -len(COUNT_SUFFIX)]
            if worker == self.worker_id:
                continue
            present.add(worker)
            if worker not in self.siblings and is_alive(self.socket_dir, worker):
                with contextlib.suppress(FileNotFoundError, ValueError):
                    self.siblings[worker] = SessionCount(path)
        for worker in list(self.siblings):
            if worker not in present or not is_alive(self.socket_dir, worker):
                self.forget(worker)
