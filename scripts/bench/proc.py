"""What Linux's /proc says of a process: its children, CPU seconds, resident memory and Unix sockets."""

from __future__ import annotations

import os
from pathlib import Path

# Of the fields after the command name in /proc/<pid>/stat (the name, in parentheses, may hold spaces and
# parentheses itself): user and system CPU of the process, then of its children that have ended and been reaped.
UTIME, STIME, CUTIME, CSTIME = 11, 12, 13, 14


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``: its children, theirs, and so on."""
    found = []
    pending = child_pids(pid)
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(child_pids(child))
    return found


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line that follow the command name."""
    return stat.rsplit(")", 1)[1].split()


def cpu_ticks(stat: str, fields: tuple[int, ...]) -> int:
    values = stat_fields(stat)
    return sum(int(values[field]) for field in fields)


def read_stat(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text()


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of one process."""
    stat = read_stat(pid)
    ticks = os.sysconf("SC_CLK_TCK")
    return cpu_ticks(stat, (UTIME,)) / ticks, cpu_ticks(stat, (STIME,)) / ticks


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def tree_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process and all it started: its own, its live descendants', and
    those of its children that have ended (a worker uvicorn replaced, once reaped, counts in its parent's)."""
    ticks = cpu_ticks(read_stat(pid), (UTIME, STIME, CUTIME, CSTIME))
    for child in descendants(pid):
        try:
            ticks += cpu_ticks(read_stat(child), (UTIME, STIME, CUTIME, CSTIME))
        except OSError:  # ended since: its time is in its parent's reaped children once reaped
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def listening_sockets(pid: int) -> set[str]:
    """Paths of the Unix sockets a process holds open (its private socket, for a routed worker)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    paths = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[6] in inodes:
            paths.add(parts[7])
    return paths


def private_socket(pid: int) -> str | None:
    """The private socket a routed worker serves (its abstract name, as /proc/net/unix shows it), or None."""
    for path in listening_sockets(pid):
        if Path(path).parent.name.startswith("ngw-") and path.endswith(".sock"):
            return path
    return None
