"""The session store and a worker's durable sessions on a file system that fills up (a tmpfs; root only)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym.durable import sqlite_store as store_module
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.sqlite_store import SessionStore, StoreUnavailable
from tests.full_filesystem import full, mounted_tmpfs, needs_mount

pytestmark = needs_mount

WORKER = "0123456789abcdef"
STATE = "x" * 3000  # a few pages' worth of log per write, so the log soon needs blocks the file system lacks
MAX_WRITES = 10_000  # a bound, never an expectation


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path, "2m") as path:
        yield path


@pytest.fixture
def store(directory: Path) -> Iterator[SessionStore]:
    opened = SessionStore(directory / "counter.sqlite3")
    yield opened
    opened.close()


def write_until_refused(store: SessionStore) -> StoreUnavailable:
    for number in range(MAX_WRITES):
        try:
            store.write(f"s{number}", WORKER, f'"{STATE}{number}"')
        except StoreUnavailable as refused:
            return refused
    raise AssertionError(f"{MAX_WRITES} writes fitted on the full file system")


def test_a_commit_the_full_file_system_refuses_raises_store_unavailable_and_the_store_writes_again_once_there_is_room(store, directory):
    store.write("kept", WORKER, "1")
    with full(directory):
        refused = write_until_refused(store)
        assert "full" in str(refused.__cause__)
        with pytest.raises(StoreUnavailable):
            store.write("kept", WORKER, "2")
        assert store.read("kept").state == "1"
    store.write("kept", WORKER, "3")
    assert store.read("kept").state == "3"


def test_a_store_that_cannot_commit_is_reported_once_per_interval_and_once_when_it_commits_again(store, directory, caplog, monkeypatch):
    monkeypatch.setattr(store_module, "FAILURE_LOG_INTERVAL_SECONDS", 3600)
    caplog.set_level(logging.WARNING, logger=store_module.__name__)
    with full(directory):
        write_until_refused(store)
        for _ in range(20):
            with pytest.raises(StoreUnavailable):
                store.write("kept", WORKER, "2")
    store.write("kept", WORKER, "3")
    reports = [(record.levelno, record.getMessage()) for record in caplog.records if record.name == store_module.__name__]
    assert [level for level, _ in reports] == [logging.ERROR, logging.WARNING]
    assert "cannot commit" in reports[0][1] and "20 more writes had failed" in reports[1][1]


@pytest.mark.anyio
async def test_a_session_whose_write_cannot_commit_is_back_in_memory_to_what_the_store_holds(store, directory):
    states = SessionStates(str)
    sessions = DurableSessions(store, states, WORKER)
    states["old"] = "0"
    await sessions.save(["old"])
    with full(directory):
        for number in range(MAX_WRITES):
            states["old"] = f"{STATE}{number}"
            try:
                await sessions.save(["old"])
            except StoreUnavailable:
                break
        else:
            raise AssertionError(f"{MAX_WRITES} writes fitted on the full file system")
        assert states.export("old") == store.read("old").state != f'"{STATE}{number}"'  # the refused state is undone
        states["new"] = STATE
        with pytest.raises(StoreUnavailable):
            await sessions.save(["new"])
        assert "new" not in states and store.read("new") is None
    states["old"] += "!"
    await sessions.save(["old"])
    assert store.read("old").state == states.export("old")


def test_a_dead_owners_session_whose_claim_cannot_commit_stays_the_dead_owners_and_out_of_memory(store, directory):
    dead = "f" * 16
    store.write("orphan", dead, "7")
    states = SessionStates(int)
    sessions = DurableSessions(store, states, WORKER)
    with full(directory):
        write_until_refused(store)
        with pytest.raises(StoreUnavailable):
            sessions.adopt(store.read("orphan"))
        assert "orphan" not in states and not sessions.holds("orphan")
    assert (store.read("orphan").owner, store.read("orphan").state) == (dead, "7")
    assert sessions.adopt(store.read("orphan")) and states["orphan"] == 7
