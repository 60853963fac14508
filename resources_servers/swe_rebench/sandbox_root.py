"""The per-instance directory that holds every sandbox: a locked subdirectory per live worker, swept once its worker is gone.

Layout: ``<root>/worker-*/sandbox-*/repo``. A worker holds an exclusive ``flock`` on its own directory
for its whole life, so a directory whose lock can be taken belongs to a worker that is gone (killed with
SIGKILL, say): it is swept, mounts and all, when any worker of the instance starts or stops. Taking a
worker directory and sweeping both happen under a lock on the root itself, so a starting worker is never
swept between making its directory and locking it. The last worker to stop removes the root.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

from resources_servers.swe_rebench.sandbox import Sandbox, Task
from resources_servers.swe_rebench.tmpfs import mount_tmpfs, remove_tree

# Each jailed sandbox runs as a uid of its own drawn from here (far above real users and the usual
# subordinate-id ranges), so the process cap of one sandbox is never spent by another.
SANDBOX_UIDS = range(2**30, 2**31)


class SandboxRoot:
    def __init__(self, path: Path, disk_bytes: int | None) -> None:
        """``disk_bytes``: each sandbox is a tmpfs of that size owned by a uid of its own; None: a plain directory."""
        self.path = path
        self.disk_bytes = disk_bytes
        self.worker_dir: Path | None = None
        self.worker_lock: int | None = None

    def open(self) -> None:
        """Sweep what gone workers left, then take this worker's own directory, locked until ``close``."""
        with self.locked():
            self.sweep()
            self.worker_dir = Path(tempfile.mkdtemp(prefix="worker-", dir=self.path))
            self.worker_lock = os.open(self.worker_dir, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(self.worker_lock, fcntl.LOCK_EX)

    def close(self) -> None:
        """Remove this worker's directory and whatever gone workers left; the root too, once nothing is in it."""
        with self.locked():
            if self.worker_dir is not None:
                remove_tree(self.worker_dir)
                os.close(self.worker_lock)
                self.worker_dir = self.worker_lock = None
            self.sweep()
            with contextlib.suppress(OSError):
                self.path.rmdir()

    def make(self, task: Task) -> Sandbox:
        if self.worker_dir is None:
            raise RuntimeError("the sandbox root is not open: sandboxes are made only while the server runs")
        root = Path(tempfile.mkdtemp(prefix="sandbox-", dir=self.worker_dir))
        sandbox = Sandbox(task, root)
        try:
            if self.disk_bytes is not None:
                sandbox.uid = SANDBOX_UIDS.start + secrets.randbelow(len(SANDBOX_UIDS))
                mount_tmpfs(root, self.disk_bytes, sandbox.uid)
            sandbox.repo.mkdir()
            if sandbox.uid is not None:
                os.chown(sandbox.repo, sandbox.uid, sandbox.uid)
        except BaseException:
            sandbox.remove()
            raise
        return sandbox

    def sweep(self) -> None:
        """Remove the directories of workers that are gone: those whose lock nobody holds."""
        for entry in self.path.iterdir():
            if not entry.is_dir() or entry.is_symlink():
                continue
            lock = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            else:
                remove_tree(entry)
            finally:
                os.close(lock)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the root's lock. A root removed while this waited for it is made again and locked afresh."""
        while True:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            held = os.fstat(lock)
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                break
            os.close(lock)
        try:
            yield
        finally:
            os.close(lock)
