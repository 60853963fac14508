"""The per-instance directory that holds every sandbox: a locked subdirectory per live worker, swept once its worker is gone.

Layout: ``<root>/worker-*/sandbox-*/repo``. A worker holds an exclusive ``flock`` on its own directory
for its whole life, so a directory whose lock can be taken belongs to a worker that is gone (killed with
SIGKILL, say, or stopped): it is swept, mounts and all, when any worker of the instance starts or stops.
A sweep spares the sandboxes that ``kept`` names (by ``worker-*/sandbox-*``): those of durable sessions,
which another worker adopts, or the server after a restart, where they are (``reattach``); a gone
worker's directory goes once nothing in it is kept. Taking a worker directory and sweeping both happen
under a lock on the root itself, so a starting worker is never swept between making its directory and
locking it. The last worker to stop removes the root, unless durable sandboxes are left in it.

Jailed, each sandbox has a cgroup of its own (``cgroups.py``), named for it: made with the sandbox (and again
when it is re-attached), removed with it, and swept when its sandbox is no longer on disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from resources_servers.swe_rebench.cgroups import Cgroups
from resources_servers.swe_rebench.sandbox import Sandbox, Task
from resources_servers.swe_rebench.tmpfs import mount_tmpfs, remove_tree

# Each jailed sandbox runs as a uid of its own drawn from here (far above real users and the usual
# subordinate-id ranges), so the process cap of one sandbox is never spent by another.
SANDBOX_UIDS = range(2**30, 2**31)
# A sandbox's name under the root, as ``make`` gives it (``mkdtemp`` draws from letters, digits and ``_``).
SANDBOX_NAME = re.compile(r"worker-[a-z0-9_]+/sandbox-[a-z0-9_]+")


class SandboxGone(ValueError):
    """A sandbox named for re-attaching is not there, or is not a sandbox of this root."""


def is_sandbox_name(name: str) -> bool:
    return SANDBOX_NAME.fullmatch(name) is not None


class SandboxRoot:
    def __init__(
        self, path: Path, disk_bytes: int | None, kept: Callable[[], Collection[str]] = frozenset, cgroups: Cgroups | None = None
    ) -> None:
        """``disk_bytes``: each sandbox is a tmpfs of that size owned by a uid of its own; None: a plain directory.
        ``kept``: the names (``worker-*/sandbox-*``) of the sandboxes sweeps spare. ``cgroups``: where each
        sandbox gets a cgroup of its own (made with it, removed with it, swept with it); None: no cgroups."""
        self.path = path
        self.disk_bytes = disk_bytes
        self.kept = kept
        self.cgroups = cgroups
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
        """Give up this worker's directory and sweep it with those of gone workers; the root too, once nothing is in it."""
        with self.locked():
            if self.worker_lock is not None:
                os.close(self.worker_lock)
                self.worker_dir = self.worker_lock = None
            self.sweep()
            with contextlib.suppress(OSError):
                self.path.rmdir()
            if self.cgroups is not None:
                self.cgroups.close()

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
            if self.cgroups is not None:
                sandbox.cgroup = self.cgroups.make(self.name_of(sandbox))
        except BaseException:
            sandbox.remove()
            raise
        return sandbox

    def reattach(self, name: str, task: Task) -> Sandbox:
        """The sandbox ``name`` made earlier, by this worker or another, maybe before a restart; ``SandboxGone`` if it
        is not there. Only a directory of this root is taken, and, jailed, only a sandbox's tmpfs, whose owner is the
        uid its commands run as: a forged name can neither reach outside the root nor pick the uid."""
        if not is_sandbox_name(name):
            raise SandboxGone(f"{name!r} is not a sandbox of this server's root {self.path} (worker-*/sandbox-*); refused")
        root = self.path / name
        if root.resolve() != root:
            raise SandboxGone(f"{name} leads out of this server's root {self.path} through a symlink; refused")
        if not (root / "repo").is_dir() or (root / "repo").is_symlink():
            raise SandboxGone(
                f"sandbox {name} is gone from {self.path} on this host: it was removed, its tmpfs was lost with a reboot, or it is "
                "on the disk of another host (a sandbox is reachable only on the host that made it, and a store shared "
                "across hosts lets a host whose sandbox root does not hold it take the session over)"
            )
        sandbox = Sandbox(task, root)
        if self.disk_bytes is not None:
            owner = root.stat().st_uid
            if not os.path.ismount(root) or owner not in SANDBOX_UIDS:
                raise SandboxGone(f"{name} in {self.path} is not a jailed sandbox (a tmpfs owned by a sandbox uid); refused")
            sandbox.uid = owner
        if self.cgroups is not None:
            sandbox.cgroup = self.cgroups.make(name)
        return sandbox

    def name_of(self, sandbox: Sandbox) -> str:
        """``worker-*/sandbox-*``: the sandbox's name under the root (what the store keeps, what its cgroup is named for)."""
        return sandbox.root.relative_to(self.path).as_posix()

    def sweep(self) -> None:
        """Remove the directories of workers that are gone (those whose lock nobody holds), sparing kept sandboxes."""
        kept = set(self.kept())
        for entry in self.path.iterdir():
            if not entry.is_dir() or entry.is_symlink():
                continue
            lock = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            else:
                self.empty(entry, kept)
            finally:
                os.close(lock)
        if self.cgroups is not None:
            self.cgroups.sweep(lambda: {path.relative_to(self.path).as_posix() for path in self.path.glob("worker-*/sandbox-*")})

    def empty(self, worker_dir: Path, kept: set[str]) -> None:
        """Remove a gone worker's directory but for its kept sandboxes."""
        spared = {name.partition("/")[2] for name in kept if name.partition("/")[0] == worker_dir.name}
        if not spared:
            remove_tree(worker_dir)
            return
        for sandbox in worker_dir.iterdir():
            if sandbox.name not in spared:
                remove_tree(sandbox)

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
