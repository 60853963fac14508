"""The live sessions of an instance's workers on one host, counted together, and the caps on them.

Each worker has an 8-byte counter of the sessions it holds live, a file of its own in the directory the
instance's workers share on this host (the placement counters' directory: ``routing.placement``'s
``SessionCount``); the count of the instance is the sum over the workers alive (the transport's
``is_alive``), so a dead worker's sessions stop counting with it (a durable one counts again on the worker
that adopts it). Admitting a session is one check-and-add under a lock on that directory itself, so of a burst of seeds spread over the workers exactly as many as the cap allows get in.
Without a shared directory (one worker), or without a cap (nothing reads the total then), the count is this process's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from nemo_gym.routing.placement import SessionCount
from nemo_gym.sessions.worker import is_worker_id

logger = logging.getLogger(__name__)

LIVE_SUFFIX = ".live"


@dataclass(frozen=True)
class Cap:
    """At most ``limit`` live sessions on the instance; ``detail`` names the setting, for the refusal."""

    limit: int
    detail: str


class LiveCount:
    def __init__(self, directory: str | None, worker_id: str | None, is_alive: Callable[[str], bool] = lambda worker: True) -> None:
        self.directory = directory if worker_id is not None else None
        self.worker_id = worker_id
        self.is_alive = is_alive
        self.local = 0
        self.own: SessionCount | None = None
        self.lock: int | None = None

    def open(self) -> None:
        """Publish this worker's counter (at 0: a new worker holds nothing yet)."""
        if self.directory is None:
            return
        path = os.path.join(self.directory, self.worker_id + LIVE_SUFFIX)
        try:
            self.lock = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self.own = SessionCount(path, initial=0)
        except OSError as error:
            logger.warning("worker %s counts its live sessions alone: cannot make %s: %s", self.worker_id, path, error)
            self.close()

    def close(self) -> None:
        if self.own is not None:
            self.own.close()
            self.own = None
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, self.worker_id + LIVE_SUFFIX))
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def total(self) -> int:
        """The live sessions of the instance's workers alive (this one's own alone when it shares no counter)."""
        if self.own is None:
            return self.local
        total = 0
        for path in glob.glob(os.path.join(glob.escape(self.directory), "*" + LIVE_SUFFIX)):
            worker = os.path.basename(path)[: -len(LIVE_SUFFIX)]
            if worker == self.worker_id:
                total += self.own.value or 0
            elif is_worker_id(worker) and self.is_alive(worker):
                with contextlib.suppress(OSError):
                    count = SessionCount(path)
                    try:
                        total += count.value or 0
                    finally:
                        count.close()
        return total

    def admit(self, caps: list[Cap]) -> Cap | None:
        """Count one more session here unless the instance holds as many as a cap allows: None if admitted, else that cap."""
        with self.locked():
            total = self.total()
            refused = next((cap for cap in caps if total >= cap.limit), None)
            if refused is None:
                self.add(1)
            return refused

    def add(self, amount: int) -> None:
        self.local = max(self.local + amount, 0)
        if self.own is not None:
            self.own.add(amount)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        if self.lock is None:
            yield
            return
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
