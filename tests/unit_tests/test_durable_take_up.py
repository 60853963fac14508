"""A worker takes up a session restored into the store (owned by no worker) on the first request it misses."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.sqlite_store import SessionStore, StoredSession

ME, OTHER = "a" * 16, "b" * 16


@pytest.fixture
def store(tmp_path: Path):
    opened = SessionStore(tmp_path / "counter.sqlite3")
    yield opened
    opened.close()


def restored(store: SessionStore, session_id: str, state: str) -> None:
    store.insert_all([StoredSession(session_id, None, 7, state, 4e9)])


def test_a_restored_session_is_claimed_and_held_by_the_worker_that_misses_it(store):
    restored(store, "s", "41")
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    sessions.take_up("s")
    assert counters["s"] == 41 and sessions.holds("s")
    assert (store.read("s").owner, store.read("s").revision) == (ME, 8)


def test_a_session_another_worker_owns_or_no_store_row_names_is_not_taken_up(store):
    store.write("theirs", OTHER, "5")
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    sessions.take_up("theirs")
    sessions.take_up("unknown")
    assert counters == {} and store.read("theirs").owner == OTHER


def test_a_restored_state_that_does_not_load_is_an_error_on_every_request_never_a_miss(store):
    restored(store, "s", '"not a count"')
    sessions = DurableSessions(store, SessionStates(int), ME)
    for _ in range(2):
        with pytest.raises(ValueError):
            sessions.take_up("s")
    assert not sessions.holds("s")
