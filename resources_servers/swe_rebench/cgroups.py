"""A cgroup per sandbox: the memory and the number of processes of all of a sandbox's commands together are capped.

Both layouts are supported. cgroup v1 (this project's machines): a directory per sandbox in the ``memory``
and in the ``pids`` hierarchy (``memory.limit_in_bytes``, ``pids.max``). cgroup v2: one directory in the
unified hierarchy (``memory.max``, ``memory.swap.max``, ``pids.max``, and ``memory.oom.group``, so an
out-of-memory kill takes all of the sandbox's processes at once; v1 has no such switch and kills the
largest). By default the sandbox cgroups go below the server's own cgroup in each hierarchy (so whatever
caps the server caps its sandboxes too), as ``<parent>/swe_rebench-<hash of the sandbox root and its file system>/<worker>.<sandbox>``;
``cgroup_parent`` names another parent (on v2 it must hold no processes of its own, the kernel's rule for
a cgroup whose children get controllers).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resources_servers.swe_rebench.tmpfs import unescape

REMOVE_ATTEMPTS = 50


class CgroupError(RuntimeError):
    """Sandbox cgroups cannot be made here; the message says why and what to do."""


@dataclass(frozen=True)
class Usage:
    """Counters read before and after a command: out-of-memory kills, refused forks."""

    oom_kills: int
    refused_forks: int


@dataclass(frozen=True)
class SandboxCgroup:
    """One sandbox's cgroup: a directory per hierarchy (one on v2; memory and pids on v1)."""

    version: int
    dirs: tuple[Path, ...]

    @property
    def memory_dir(self) -> Path:
        return self.dirs[0]

    @property
    def pids_dir(self) -> Path:
        return self.dirs[-1]

    def join_files(self) -> list[str]:
        """The files a process writes ``0`` to, to move itself in. On v1, ``tasks``: moving the writing thread
        itself (a single-threaded launcher) skips the kernel's global lock that a ``cgroup.procs`` write takes
        and waits on (about 10 ms a command on a loaded machine); v2 has only ``cgroup.procs``."""
        name = "cgroup.procs" if self.version == 2 else "tasks"
        return [str(directory / name) for directory in self.dirs]

    def usage(self) -> Usage:
        if self.version == 2:
            oom = counter(self.memory_dir / "memory.events", "oom_kill")
        else:
            oom = counter(self.memory_dir / "memory.oom_control", "oom_kill")
        return Usage(oom, counter(self.pids_dir / "pids.events", "max"))

    def peak_memory_bytes(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return int((self.memory_dir / name).read_text())

    def remove(self) -> None:
        """Kill what is left inside, then remove the directories (the kernel refuses while a process is in one)."""
        for directory in self.dirs:
            remove_cgroup(directory)


class Cgroups:
    """Where one instance's sandbox cgroups go, and the caps each gets."""

    def __init__(self, version: int, parents: tuple[Path, ...], instance: str, memory_bytes: int, processes: int) -> None:
        self.version = version
        self.groups = tuple(parent / instance for parent in parents)
        self.memory_bytes = memory_bytes
        self.processes = processes

    @classmethod
    def for_root(cls, sandbox_root: Path, memory_bytes: int, processes: int, parent: str | None = None, proc: Path = Path("/proc")) -> Cgroups:
        """This host's layout (v1 when memory and pids hierarchies are mounted, else v2); ``CgroupError`` if neither works."""
        instance = instance_name(sandbox_root)
        mounts = cgroup_mounts(proc / "self" / "mountinfo")
        own = own_cgroups(proc / "self" / "cgroup")
        v1 = {controller: mounts[controller] for controller in ("memory", "pids") if controller in mounts}
        if len(v1) == 2:
            parents = tuple(
                Path(parent) / controller if parent else below(mounts[controller], own.get(controller, "/"))
                for controller in ("memory", "pids")
            )
            version = 1
        elif "" in mounts:
            parents = (Path(parent) if parent else below(mounts[""], own.get("", "/")),)
            version = 2
        else:
            raise CgroupError(
                "swe_rebench caps each sandbox with a cgroup and finds neither cgroup v1 memory and pids hierarchies "
                "nor a cgroup v2 hierarchy mounted (see /proc/self/mountinfo); mount them, or set unsafe_no_jail: true"
            )
        cgroups = cls(version, parents, instance, memory_bytes, processes)
        cgroups.prepare()
        return cgroups

    def prepare(self) -> None:
        """Make the instance's cgroup directories (on v2 with memory and pids for their children), or say why not."""
        for group in self.groups:
            try:
                group.mkdir(exist_ok=True)
                if self.version == 2:
                    missing = {"memory", "pids"} - set((group.parent / "cgroup.controllers").read_text().split())
                    if missing:
                        raise CgroupError(f"cgroup v2 at {group.parent} does not offer the {' and '.join(sorted(missing))} controller")
                    enable_controllers(group.parent)
                    enable_controllers(group)
            except OSError as error:
                raise CgroupError(
                    f"swe_rebench caps each sandbox with a cgroup (v{self.version}) and cannot make one in {group.parent}: {error}. "
                    "Run the server as root with the cgroup file system writable (in a container: --cgroupns=private and a "
                    "writable /sys/fs/cgroup; on cgroup v2, set cgroup_parent to a cgroup that holds no processes), "
                    "or set unsafe_no_jail: true"
                ) from None

    def make(self, name: str) -> SandboxCgroup:
        """The cgroup of the sandbox ``name`` (``worker-*/sandbox-*``), made with its caps if it is not there yet."""
        cgroup = SandboxCgroup(self.version, tuple(group / name.replace("/", ".") for group in self.groups))
        for directory in cgroup.dirs:
            directory.mkdir(exist_ok=True)
        if self.version == 2:
            write(cgroup.memory_dir / "memory.max", self.memory_bytes)
            write(cgroup.memory_dir / "memory.swap.max", 0, optional=True)
            write(cgroup.memory_dir / "memory.oom.group", 1)
        else:
            write(cgroup.memory_dir / "memory.limit_in_bytes", self.memory_bytes)
            # Set after the limit (it may not be below it); absent when the kernel does not account swap.
            write(cgroup.memory_dir / "memory.memsw.limit_in_bytes", self.memory_bytes, optional=True)
        write(cgroup.pids_dir / "pids.max", self.processes)
        return cgroup

    def sweep(self, live: Callable[[], set[str]]) -> None:
        """Remove the cgroups of sandboxes that are gone (``live``: the ``worker-*/sandbox-*`` names on disk).

        The cgroups are listed before the sandboxes, and a sandbox's directory is made before its cgroup:
        so a cgroup made by another worker meanwhile always has its sandbox in ``live``."""
        entries = []
        for group in self.groups:
            with contextlib.suppress(FileNotFoundError):
                entries += [entry for entry in group.iterdir() if entry.is_dir()]
        names = {name.replace("/", ".") for name in live()}
        for entry in entries:
            if entry.name not in names:
                remove_cgroup(entry)

    def close(self) -> None:
        """Remove the instance's own directories once no sandbox cgroup is left in them."""
        for group in self.groups:
            with contextlib.suppress(OSError):
                group.rmdir()


def instance_name(sandbox_root: Path) -> str:
    """The instance's cgroup directory: one per sandbox root, so instances and test servers never share one.

    A root is its path on the file system it lies on (the device of its parent, or of the nearest ancestor
    there is): hosts and containers with a /tmp of their own share the machine's cgroups, and the same path
    there is another root. The root's own device is not used: it may be a mount point that comes and goes."""
    parent = next(directory for directory in sandbox_root.parents if directory.exists())
    return "swe_rebench-" + hashlib.sha256(f"{parent.stat().st_dev}:{sandbox_root}".encode()).hexdigest()[:12]


def enable_controllers(group: Path) -> None:
    enabled = set((group / "cgroup.subtree_control").read_text().split())
    if not {"memory", "pids"} <= enabled:
        (group / "cgroup.subtree_control").write_text("+memory +pids")


def write(path: Path, value: int, optional: bool = False) -> None:
    if optional and not path.exists():
        return
    path.write_text(str(value))


def counter(path: Path, key: str) -> int:
    """A ``key value`` line of a cgroup file (0 when the file or the key is absent)."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def remove_cgroup(directory: Path) -> None:
    """Remove a cgroup directory and its child cgroups, killing the processes left in them first."""
    if not directory.is_dir():
        return
    for child in [entry for entry in directory.iterdir() if entry.is_dir()]:
        remove_cgroup(child)
    for _ in range(REMOVE_ATTEMPTS):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            for pid in (directory / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.02)
    directory.rmdir()


def cgroup_mounts(mountinfo: Path) -> dict[str, tuple[Path, str]]:
    """The mounted hierarchies: for each v1 controller of interest, and for v2 (key ``""``), its mount point and root."""
    found: dict[str, tuple[Path, str]] = {}
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        kind, options = fields[separator + 1], fields[separator + 3].split(",")
        point, root = Path(unescape(fields[4])), unescape(fields[3])
        if kind == "cgroup2":
            found.setdefault("", (point, root))
        elif kind == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    found.setdefault(controller, (point, root))
    return found


def own_cgroups(cgroup_file: Path) -> dict[str, str]:
    """This process's cgroup in each hierarchy (``/proc/self/cgroup``), by controller; ``""`` for v2."""
    own: dict[str, str] = {}
    for line in cgroup_file.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def below(mount: tuple[Path, str], path: str) -> Path:
    """The directory of cgroup ``path`` in a hierarchy mounted at ``mount`` (whose root may be a cgroup itself)."""
    point, root = mount
    relative = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
    return point if relative in (".", "") else point / relative
