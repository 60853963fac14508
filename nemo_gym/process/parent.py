"""A process that dies with its parent (Linux's ``PR_SET_PDEATHSIG``), and a process's children.

The launcher names itself in ``NEMO_GYM_PARENT_PID`` for each process it starts; such a process calls
``follow_parent()`` first thing: the kernel sends it SIGTERM when the launcher's thread that started
it ends, for any reason (SIGKILL included), so it stops as it would on ``gym env start`` stopping
(and if the launcher is already gone, it stops at once). A multi-worker server's workers get SIGKILL
when their server process ends (``nemo_gym.process.run``). Elsewhere than Linux this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from nemo_gym.env import PARENT_PID_ENV

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int) -> None:
    """``signum`` to this process when its parent (the thread that started it) ends."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


def follow_parent() -> None:
    """SIGTERM when the launcher that named itself in the environment ends (the name is not handed on)."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if not parent:
        return
    die_with_parent(signal.SIGTERM)
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGTERM)


def children(pid: int) -> set[int]:
    """The live children of process ``pid``, started by any of its threads (Linux's /proc; elsewhere none)."""
    found: set[int] = set()
    for listed in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.update(int(child) for child in listed.read_text().split())
        except OSError:  # the thread ended
            continue
    return found
