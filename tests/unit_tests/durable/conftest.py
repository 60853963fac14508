"""The durable tests' SQLite stores: in the test's directory, or on a small tmpfs of its own that fills up (root only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym.durable.sqlite_store import SQLiteStore
from tests.full_filesystem import mounted_tmpfs


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "counter.sqlite3")
    yield opened
    opened.close()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (the tests that use it are marked ``needs_mount``)."""
    with mounted_tmpfs(tmp_path, "2m") as path:
        yield path


@pytest.fixture
def tmpfs_store(tmpfs: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(tmpfs / "counter.sqlite3")
    yield opened
    opened.close()
