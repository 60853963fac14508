"""The store's files: one that is not a usable store is refused, naming it and what to do; all are 0600."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.durable.sqlite_store import SessionStore, StoreError
from nemo_gym.launcher import LaunchError, Launcher


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def wrong_schema(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, payload BLOB)")
        db.commit()


def directory(path: Path) -> None:
    path.mkdir()


def immutable(path: Path) -> None:
    SessionStore(path).close()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root and a filesystem with inode flags")


BAD_STORES: dict[str, Callable[[Path], None]] = {"garbage": garbage, "wrong schema": wrong_schema, "a directory": directory, "immutable": immutable}


@contextlib.contextmanager
def bad_store(path: Path, kind: str) -> Iterator[Path]:
    """``path`` made into the kind of bad store; an immutable file is made mutable again afterwards."""
    path.parent.mkdir(parents=True, exist_ok=True)
    BAD_STORES[kind](path)
    try:
        yield path
    finally:
        if kind == "immutable":
            subprocess.run(["chattr", "-i", str(path)], check=False)


@pytest.mark.parametrize("kind", BAD_STORES)
def test_a_file_that_is_not_a_usable_store_is_refused_naming_it_and_what_to_do(tmp_path: Path, kind: str):
    with bad_store(tmp_path / "counter.sqlite3", kind) as path:
        with pytest.raises(StoreError) as error:
            SessionStore(path)
    message = str(error.value)
    assert f"the session store {path} cannot be used" in message
    assert "move it aside" in message


def test_the_store_its_log_and_its_lock_are_readable_by_their_owner_only(tmp_path: Path):
    path = tmp_path / "sessions" / "counter.sqlite3"
    store = SessionStore(path)
    store.write("s", None, "1")
    try:
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.lock")]
        assert {file.name: file.stat().st_mode & 0o777 for file in files} == {file.name: 0o600 for file in files}
    finally:
        store.close()


def test_a_store_left_0644_by_an_older_version_is_made_0600(tmp_path: Path):
    path = tmp_path / "counter.sqlite3"
    SessionStore(path).close()
    path.chmod(0o644)
    SessionStore(path).close()
    assert path.stat().st_mode & 0o777 == 0o600


# Far longer than a refusal takes: the start must end on the refusal, not on running out of time.
START_TIMEOUT_SECONDS = 300


@pytest.mark.parametrize("kind", BAD_STORES)
def test_a_durable_server_with_a_bad_store_refuses_to_start_at_once_naming_the_file(tmp_path: Path, kind: str):
    counter = "example_session_state_mgmt"
    instances = gym_config.parse({counter: {"resources_servers": {counter: {"entrypoint": "app.py", "num_workers": 2}}}})
    launcher = Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": str(tmp_path)})
    with bad_store(tmp_path / "sessions" / f"{counter}.sqlite3", kind) as path:
        try:
            with pytest.raises(LaunchError) as error:
                launcher.start(timeout=START_TIMEOUT_SECONDS)
        finally:
            launcher.stop()  # a start that was not refused leaves no server behind
    message = str(error.value)
    assert f"server '{counter}' cannot start: the session store {path} cannot be used" in message
    assert "move it aside" in message
    assert "did not have every worker serving" not in message
