"""A small tmpfs of a test's own (root only), and a way to leave it without a free block for a while."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

CAN_MOUNT = os.geteuid() == 0 and shutil.which("mount") is not None
needs_mount = pytest.mark.skipif(not CAN_MOUNT, reason="mounting a tmpfs needs root")


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``path`` as a tmpfs of ``size`` (as mount reads it: "8m"), unmounted at the end."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)]).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


@contextlib.contextmanager
def full(directory: Path) -> Iterator[None]:
    """The file system of ``directory`` without a free block while the block runs; emptied after."""
    filler = directory / "filler"
    try:
        with open(filler, "wb", buffering=0) as out:
            for chunk in (1 << 20, 1 << 12):
                with contextlib.suppress(OSError):
                    while True:
                        out.write(b"\0" * chunk)
        with pytest.raises(OSError) as no_room, open(filler, "ab", buffering=0) as out:
            out.write(b"\0" * 4096)
        assert no_room.value.errno == errno.ENOSPC
        yield
    finally:
        filler.unlink(missing_ok=True)
