"""The SQLite store's own promises: its write lock waited for off the event loop, expiry purged, its size, its
files (one that is not a usable store refused, naming it and what to do; all 0600), a full file system."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.durable import sqlite_store
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.sqlite_store import SQLiteStore, store_path
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import SessionTaken, StoreError, StoreUnavailable
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS
from nemo_gym.process.launcher import LaunchError, Launcher
from nemo_gym.process.run import check_store
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.full_filesystem import full, needs_mount
from tests.unit_tests.durable.filling import WORKER, commit_until_refused

DEAD = "0" * 16


def test_a_worker_cannot_write_a_session_another_worker_owns(store):
    store.write("s", "a" * 16, "1")
    with pytest.raises(SessionTaken):
        store.write("s", "b" * 16, "2")
    assert asyncio.run(store.read("s")).state == "1"


def test_rows_expire_with_the_cookie(store, monkeypatch):
    store.write("s", DEAD, "1")
    later = time.time() + SESSION_MAX_AGE_SECONDS + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert asyncio.run(store.read("s")) is None
    store.purge_expired()
    assert store.db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


@contextlib.contextmanager
def held_by_another_process(store: SQLiteStore) -> Iterator[None]:
    """The store's write lock, taken as another worker would: on a descriptor of its own."""
    other = os.open(f"{store.path}.lock", os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(other)


@pytest.mark.anyio
async def test_while_another_worker_holds_the_store_the_loop_serves_on_and_saves_return_once_committed(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, "a" * 16)
    counters["s"] = 1
    with held_by_another_process(store):
        first = asyncio.ensure_future(sessions.save(["s"]))
        await asyncio.sleep(0.05)
        again = asyncio.ensure_future(sessions.save(["s"]))  # the same state, still on its way to the store
        await asyncio.sleep(0.05)  # the loop runs: the lock is waited for in a thread
        assert not first.done() and not again.done() and await store.read("s") is None
    await asyncio.wait_for(asyncio.gather(first, again), 10)
    assert (await store.read("s")).state == "1"


def test_the_store_stays_under_a_megabyte_as_sessions_end(store):
    for _ in range(20_000):
        session_id = uuid.uuid4().hex
        store.write(session_id, DEAD, "1")
        store.write(session_id, DEAD, "2")
        store.delete(session_id)
    assert store.path.stat().st_size <= 1 << 20


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def wrong_schema(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, payload BLOB)")
        db.commit()


def directory(path: Path) -> None:
    path.mkdir()


def immutable(path: Path) -> None:
    SQLiteStore(path).close()
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
            SQLiteStore(path)
    message = str(error.value)
    assert f"the session store {path} cannot be used" in message
    assert "move it aside" in message


def test_the_store_its_log_and_its_lock_are_readable_by_their_owner_only(tmp_path: Path):
    path = tmp_path / "sessions" / "counter.sqlite3"
    store = SQLiteStore(path)
    store.write("s", None, "1")
    try:
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.lock")]
        assert {file.name: file.stat().st_mode & 0o777 for file in files} == {file.name: 0o600 for file in files}
    finally:
        store.close()


def test_a_store_left_0644_by_an_older_version_is_made_0600(tmp_path: Path):
    path = tmp_path / "counter.sqlite3"
    SQLiteStore(path).close()
    path.chmod(0o644)
    SQLiteStore(path).close()
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


@needs_mount
@pytest.mark.anyio
async def test_a_commit_the_full_file_system_refuses_names_it_as_the_cause(tmpfs_store, tmpfs):
    with full(tmpfs):
        refused = await commit_until_refused(tmpfs_store)
    assert "full" in str(refused.__cause__)


@needs_mount
@pytest.mark.anyio
async def test_a_store_that_cannot_commit_is_reported_once_per_interval_and_once_when_it_commits_again(tmpfs_store, tmpfs, caplog, monkeypatch):
    monkeypatch.setattr(sqlite_store, "FAILURE_LOG_INTERVAL_SECONDS", 3600)
    caplog.set_level(logging.WARNING, logger=sqlite_store.__name__)
    with full(tmpfs):
        await commit_until_refused(tmpfs_store)
        for _ in range(20):
            with pytest.raises(StoreUnavailable):
                await tmpfs_store.commit(WORKER, {"kept": "2"})
    await tmpfs_store.commit(WORKER, {"kept": "3"})
    reports = [(record.levelno, record.getMessage()) for record in caplog.records if record.name == sqlite_store.__name__]
    assert [level for level, _ in reports] == [logging.ERROR, logging.WARNING]
    assert "cannot commit" in reports[0][1] and "20 more writes had failed" in reports[1][1]


def counter_config(session_store: Path):
    return CounterServer.validate_config("counter", {"host": "127.0.0.1", "port": 1, "num_workers": 2, "session_store": str(session_store)})


def test_a_durable_server_opens_the_store_its_session_store_setting_names(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_STATE_DIR", str(tmp_path / "state"))
    elsewhere = tmp_path / "elsewhere.sqlite3"
    check_store(CounterServer, counter_config(elsewhere), "counter")
    assert elsewhere.exists() and not store_path("counter").exists()
    with bad_store(tmp_path / "bad.sqlite3", "garbage") as bad:
        with pytest.raises(StoreError, match=f"the session store {bad} cannot be used"):
            check_store(CounterServer, counter_config(bad), "counter")


def overflow_pages(path: Path) -> int:
    """The pages of the store file that hold the rest of a row too long for its table page (SQLite's dbstat)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT count(*) FROM dbstat WHERE pagetype = 'overflow'").fetchone()[0]


def test_a_row_remembering_a_verify_reply_of_two_kilobytes_takes_no_overflow_page(store):
    """A row with the requests it remembers is often over a kilobyte (a verify's reply, ``durable.applied``):
    kept whole in its table's page, each write of it writes no page of its own for the rest."""
    for index in range(40):
        store.write(f"s{index}", WORKER, "x" * 2600)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert overflow_pages(store.path) == 0


def test_a_store_made_without_rowids_by_an_earlier_version_is_read_and_written_alike(tmp_path: Path):
    path = tmp_path / "counter.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(sqlite_store.SCHEMA.replace(");\nCREATE INDEX", ") WITHOUT ROWID;\nCREATE INDEX", 1))
    store = SQLiteStore(path)
    try:
        store.write("s", WORKER, "1")
        store.write("s", WORKER, "x" * 2600)
        with pytest.raises(SessionTaken):
            store.write("s", "b" * 16, "2")
        stored = asyncio.run(store.read("s"))
        assert (stored.owner, stored.revision, stored.state) == (WORKER, 2, "x" * 2600)
        assert [row.session_id for row in store.export()] == ["s"]
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert "WITHOUT ROWID" in db.execute("SELECT sql FROM sqlite_master WHERE name = 'sessions'").fetchone()[0]
