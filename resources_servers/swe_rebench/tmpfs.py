"""Size-capped tmpfs mounts (mount(2) and umount2(2) through libc), the disk cap of a jailed sandbox."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from pathlib import Path

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
# Empty files cost no blocks; without an inode cap they could still fill memory.
MAX_INODES = 65536

libc = ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(path: Path, size_bytes: int, uid: int) -> None:
    """Mount a tmpfs of ``size_bytes`` at ``path``, owned by ``uid`` (and its group) alone."""
    options = f"size={size_bytes},nr_inodes={MAX_INODES},mode=0700,uid={uid},gid={uid}"
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"cannot mount a tmpfs at {path}: {os.strerror(error)}")


def unmount(path: Path) -> None:
    """Detach the mount at ``path`` (lazily, so a process still inside cannot keep it busy)."""
    if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"cannot unmount {path}: {os.strerror(error)}")


def mounts_under(directory: Path) -> list[Path]:
    """Mount points at or below ``directory``, deepest first."""
    inside = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = Path(unescape(line.split()[4]))
            if point == directory or point.is_relative_to(directory):
                inside.append(point)
    return sorted(inside, key=lambda point: len(point.parts), reverse=True)


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), field)


def remove_tree(directory: Path) -> None:
    """Remove ``directory`` and everything in it, unmounting what is mounted below it first."""
    for point in mounts_under(directory):
        unmount(point)
    shutil.rmtree(directory, ignore_errors=True)
