"""Where the logs of the servers and hosts of a failed test are kept: their folders go when the test's
servers stop, and a rare failure under load is traced only from what they said."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

FAILED_RUNS_DIR = Path(tempfile.gettempdir()) / "nemo_gym_failed_runs"


def keep_if_failed(session: pytest.Session, failed_before: int, name: str, keep: Callable[[Path], None]) -> None:
    """If a test of ``session`` failed since it counted ``failed_before``, ``keep(folder)`` copies the logs into a
    new folder of FAILED_RUNS_DIR named after ``name``, and the folder is printed."""
    if session.testsfailed <= failed_before:
        return
    FAILED_RUNS_DIR.mkdir(exist_ok=True)
    kept = Path(tempfile.mkdtemp(prefix=f"{name}_", dir=FAILED_RUNS_DIR))
    keep(kept)
    print(f"\nlogs of the servers of a failed test kept in {kept}")
