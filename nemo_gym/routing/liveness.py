"""Whether a worker is alive, as the kernel vouches for it, never as a failed connect suggests.

Each worker holds an exclusive ``flock`` on a file of its own beside its socket for as long as it
serves. The kernel drops the lock when the process ends, however it ends, so a lock that can be
taken means the worker is dead; a worker that is merely busy (its socket's backlog full) still holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os

LOCK_SUFFIX = ".lock"


def lock_path(socket_dir: str, worker_id: str) -> str:
    return os.path.join(socket_dir, worker_id + LOCK_SUFFIX)


class LifeLock:
    """The lock a worker holds from the moment it serves its sessions until it stops."""

    def __init__(self, socket_dir: str, worker_id: str) -> None:
        self.path = lock_path(socket_dir, worker_id)
        self.fd: int | None = None

    def hold(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None


def is_held(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def is_alive(socket_dir: str, worker_id: str) -> bool:
    """True while the worker's process lives and serves (its lock is held); False once it is gone."""
    return is_held(lock_path(socket_dir, worker_id))


def live_workers(socket_dir: str) -> int:
    """How many workers serve from this socket directory now: the launcher's readiness check."""
    return sum(is_held(path) for path in glob.glob(os.path.join(glob.escape(socket_dir), "*" + LOCK_SUFFIX)))
