"""Where a new session should live: on the worker that has started the fewest, not on whichever accepted.

The kernel spreads connections over a server's workers unevenly, and a session lives where its first
request is served, so without help some workers hold several times the sessions of others. Each worker
publishes how many sessions it has started in a file of its own beside its socket, an 8-byte counter
it keeps mapped in memory; every worker maps its siblings' files too, so a placement decision reads a
few integers from memory and makes no system call. No table of sessions is kept anywhere.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import struct
import time
from collections import Counter
from collections.abc import Iterator

from nemo_gym.routing.liveness import is_alive

COUNT_SUFFIX = ".sessions"
COUNT = struct.Struct("q")
# A worker may have started this many sessions more than the least-loaded before new ones go elsewhere:
# enough to keep most first requests local, small against the ±10% a worker may stray from the mean.
SLACK = 2
# How often siblings that appeared or died are noticed.
REFRESH_SECONDS = 1.0


def count_path(socket_dir: str, worker_id: str) -> str:
    return os.path.join(socket_dir, worker_id + COUNT_SUFFIX)


def mapped(path: str, writable: bool) -> mmap.mmap:
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, COUNT.size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)


class Placement:
    """This worker's count of the sessions it started, and its view of its siblings' counts."""

    def __init__(self, socket_dir: str, worker_id: str, balance: bool = True) -> None:
        self.socket_dir = socket_dir
        self.worker_id = worker_id
        # Off, every new session starts where it arrives; the count is still published for siblings.
        self.balance = balance
        self.own: mmap.mmap | None = None
        self.siblings: dict[str, mmap.mmap] = {}
        # New sessions this worker is handing to each sibling right now, which its count does not show
        # yet: without them, a burst of new sessions would all go to the same least-loaded sibling.
        self.in_flight: Counter[str] = Counter()
        self.refreshed = 0.0

    def open(self) -> None:
        """Publish this worker's count, starting level with the least-loaded sibling (a replacement
        worker that started at 0 would otherwise take every new session until it caught up)."""
        self.refresh()
        path = count_path(self.socket_dir, self.worker_id)
        with open(path, "wb") as file:
            file.write(COUNT.pack(min(self.counts().values(), default=0)))
        self.own = mapped(path, writable=True)

    def close(self) -> None:
        for view in self.siblings.values():
            view.close()
        self.siblings.clear()
        if self.own is not None:
            self.own.close()
            self.own = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(count_path(self.socket_dir, self.worker_id))

    def started_one(self) -> None:
        if self.own is not None:
            COUNT.pack_into(self.own, 0, COUNT.unpack_from(self.own)[0] + 1)

    def counts(self) -> dict[str, int]:
        return {worker: COUNT.unpack_from(view)[0] for worker, view in self.siblings.items()}

    def target(self) -> str | None:
        """The sibling a new session should go to, or None to start it here."""
        if self.own is None or not self.balance:
            return None
        if time.monotonic() - self.refreshed > REFRESH_SECONDS:
            self.refresh()
        best, fewest = None, COUNT.unpack_from(self.own)[0] - SLACK
        for worker, view in self.siblings.items():
            count = COUNT.unpack_from(view)[0] + self.in_flight[worker]
            if count < fewest:
                best, fewest = worker, count
        return best

    @contextlib.contextmanager
    def handing_to(self, worker_id: str) -> Iterator[None]:
        self.in_flight[worker_id] += 1
        try:
            yield
        finally:
            self.in_flight[worker_id] -= 1

    def forget(self, worker_id: str) -> None:
        """A sibling found dead: place nothing more on it."""
        view = self.siblings.pop(worker_id, None)
        if view is not None:
            view.close()

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
                    self.siblings[worker] = mapped(path, writable=False)
        for worker in list(self.siblings):
            if worker not in present or not is_alive(self.socket_dir, worker):
                self.forget(worker)
