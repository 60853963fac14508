"""Where a new session should live: on the worker that has started the fewest, not on whichever accepted.

The kernel spreads connections over a server's workers unevenly, and a session lives where its first
request is served, so without help some workers hold several times the sessions of others. Each worker
has an 8-byte counter of the sessions started on it, in a file of its own beside the others (in the
directory the server's workers share on this host, the one the transport is built with), that
every sibling keeps open and reads with ``pread`` (a mapping would fault, SIGBUS, once someone
truncated the file). The worker that decides adds one to the chosen worker's counter at once (under
that file's lock), so a burst of new sessions arriving together spreads out instead of all going to
the same least-loaded worker. No table of sessions is kept anywhere.

A counter that holds no count (cut short, grown, negative, beyond ``MAX_COUNT``) is set level with
the least-loaded by the next worker to place a session, its own or a sibling (its own may be given no
new session for a long while); a counter file replaced by one that is not a regular file is not opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import stat
import struct
import time
from collections.abc import Callable

from nemo_gym.sessions.worker import is_worker_id

logger = logging.getLogger(__name__)

COUNT_SUFFIX = ".sessions"
COUNT = struct.Struct("q")
# More than any worker starts (35 years of 1000 a second): a larger value is damage, not a count.
MAX_COUNT = 1 << 40
# A worker keeps its new sessions while it has started at most this many more than the least-loaded:
# the totals stay this close, so the sessions of any stretch of time spread evenly too.
SLACK = 2
# How often siblings that died are noticed while all are present.
REFRESH_SECONDS = 1.0


def count_path(directory: str, worker_id: str) -> str:
    return os.path.join(directory, worker_id + COUNT_SUFFIX)


def count_value(data: bytes) -> int | None:
    """The count a counter file's bytes hold, or None if they hold none."""
    if len(data) != COUNT.size:
        return None
    (value,) = COUNT.unpack(data)
    return value if 0 <= value <= MAX_COUNT else None


class SessionCount:
    """One worker's counter file, kept open; every writer holds the file's lock."""

    def __init__(self, path: str, initial: int | None = None) -> None:
        """Open the counter at ``path``, or with ``initial`` make it (it must not exist). A symlink, a
        directory or any file that is not a regular one is refused (``OSError``)."""
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        self.fd = os.open(path, flags | (os.O_CREAT | os.O_EXCL if initial is not None else 0), 0o600)
        try:
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            if initial is not None:
                self.set(initial)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def value(self) -> int | None:
        try:
            return count_value(os.pread(self.fd, COUNT.size + 1, 0))
        except OSError:
            return None

    def add(self, amount: int) -> None:
        """Add to a count; a counter that holds none is left for its worker to set."""
        with self.locked():
            value = self.value
            if value is not None:
                os.pwrite(self.fd, COUNT.pack(min(max(value + amount, 0), MAX_COUNT)), 0)

    def set(self, value: int) -> None:
        with self.locked():
            self.write(value)

    def repair(self, value: int) -> None:
        """Set a counter that holds no count to ``value``; one that holds a count is left as it is."""
        with self.locked():
            if self.value is None:
                self.write(value)

    def write(self, value: int) -> None:
        os.pwrite(self.fd, COUNT.pack(value), 0)
        os.ftruncate(self.fd, COUNT.size)

    @contextlib.contextmanager
    def locked(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)


class Placement:
    """This worker's session counter and its siblings', and the choice of where a new session starts.

    The counters are files in ``directory``; ``is_alive`` is the transport's (``Transport.is_alive``):
    a counter whose worker is dead is closed.
    """

    def __init__(self, directory: str, worker_id: str, num_workers: int, is_alive: Callable[[str], bool], balance: bool = True) -> None:
        self.directory = directory
        self.worker_id = worker_id
        self.is_alive = is_alive
        self.num_workers = num_workers
        # Off, every new session starts where it arrives.
        self.balance = balance
        self.own: SessionCount | None = None
        self.siblings: dict[str, SessionCount] = {}
        self.refreshed = 0.0

    def open(self) -> None:
        """Publish this worker's counter, starting level with the least-loaded sibling (a replacement
        worker that started at 0 would otherwise take every new session until it caught up). A worker
        that cannot (its directory removed) places nothing: its new sessions start where they arrive."""
        self.refresh()
        path = count_path(self.directory, self.worker_id)
        try:
            self.own = SessionCount(path, initial=self.level())
        except OSError as error:
            logger.warning("worker %s places no sessions: cannot make its counter %s: %s", self.worker_id, path, error)

    def close(self) -> None:
        for count in self.siblings.values():
            count.close()
        self.siblings.clear()
        if self.own is not None:
            self.own.close()
            self.own = None
            with contextlib.suppress(OSError):  # gone, or something else in its place
                os.unlink(count_path(self.directory, self.worker_id))

    def counts(self) -> dict[str, int]:
        """The siblings' counts, those that hold one."""
        counts = {worker: count.value for worker, count in self.siblings.items()}
        return {worker: value for worker, value in counts.items() if value is not None}

    def level(self) -> int:
        """Where a counter starts, or restarts: level with the least-loaded worker that holds a count."""
        counts = list(self.counts().values())
        own = self.own.value if self.own is not None else None
        return min(counts + ([own] if own is not None else []), default=0)

    def choose(self) -> str | None:
        """Where the next new session starts, counted there at once: a sibling's ID, or None for here.
        With balance off, here, uncounted: no worker of the server reads the counts (a lock and two system calls saved)."""
        if self.own is None or not self.balance:
            return None
        target = self.least_loaded()
        (self.own if target is None else self.siblings[target]).add(1)
        return target

    def least_loaded(self) -> str | None:
        # While a sibling is missing (starting, or replacing a dead one), look for it at every decision.
        if len(self.siblings) < self.num_workers - 1 or time.monotonic() - self.refreshed > REFRESH_SECONDS:
            self.refresh()
        level = self.level()
        for count in (self.own, *self.siblings.values()):
            count.repair(level)
        counts = self.counts()
        own = self.own.value
        if not counts or own is None:
            return None
        least = min(counts, key=counts.__getitem__)
        return least if own - counts[least] > SLACK else None

    def taken_back(self, worker_id: str) -> None:
        """A session meant for a sibling starts here after all (the sibling was dead or too busy)."""
        count = self.siblings.get(worker_id)
        if count is not None:
            count.add(-1)
        if not self.is_alive(worker_id):
            self.forget(worker_id)
        self.own.add(1)

    def forget(self, worker_id: str) -> None:
        count = self.siblings.pop(worker_id, None)
        if count is not None:
            count.close()

    def refresh(self) -> None:
        """Open the counters of siblings that started, and close those of siblings that died. A live
        sibling's counter stays open even if its file is deleted (by a cleaner of /tmp)."""
        self.refreshed = time.monotonic()
        for path in glob.glob(os.path.join(glob.escape(self.directory), "*" + COUNT_SUFFIX)):
            worker = os.path.basename(path)[: -len(COUNT_SUFFIX)]
            if worker != self.worker_id and is_worker_id(worker) and worker not in self.siblings and self.is_alive(worker):
                with contextlib.suppress(OSError):
                    self.siblings[worker] = SessionCount(path)
        for worker in list(self.siblings):
            if not self.is_alive(worker):
                self.forget(worker)
