"""The session store: write-through guarded by owner, group commits, one winner of a takeover race, expiry, size."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.sqlite_store import SESSION_MAX_AGE_SECONDS, SessionStore, SessionTaken

DEAD = "0" * 16
RACERS = 8
ROWS = 20


@pytest.fixture
def store(tmp_path: Path):
    opened = SessionStore(tmp_path / "counter.sqlite3")
    yield opened
    opened.close()


def claim_rows(path: Path, me: str, start: multiprocessing.Barrier, results: multiprocessing.Queue) -> None:
    store = SessionStore(path)
    rows = [store.read(f"s{number}") for number in range(ROWS)]
    start.wait()
    results.put([me if store.claim(row, me) else None for row in rows])


def test_of_workers_racing_to_adopt_a_session_exactly_one_wins(tmp_path: Path):
    path = tmp_path / "counter.sqlite3"
    store = SessionStore(path)
    for number in range(ROWS):
        store.write(f"s{number}", DEAD, "0")
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(RACERS), context.Queue()
    racers = [context.Process(target=claim_rows, args=(path, f"{n:016x}", start, results)) for n in range(1, RACERS + 1)]
    for racer in racers:
        racer.start()
    claims = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=30)
    for number in range(ROWS):
        winners = [claimed[number] for claimed in claims if claimed[number] is not None]
        assert len(winners) == 1, (number, winners)
        row = store.read(f"s{number}")
        assert (row.owner, row.revision) == (winners[0], 2)


def test_a_worker_cannot_write_a_session_another_worker_owns(store):
    store.write("s", "a" * 16, "1")
    with pytest.raises(SessionTaken):
        store.write("s", "b" * 16, "2")
    assert store.read("s").state == "1"


def test_a_claim_on_a_row_that_changed_since_it_was_read_fails(store):
    store.write("s", DEAD, "1")
    seen = store.read("s")
    store.write("s", DEAD, "2")
    assert not store.claim(seen, "b" * 16)
    assert store.claim(store.read("s"), "b" * 16)


def test_rows_expire_with_the_cookie(store, monkeypatch):
    store.write("s", DEAD, "1")
    later = time.time() + SESSION_MAX_AGE_SECONDS + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert store.read("s") is None
    store.purge_expired()
    assert store.db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


@pytest.mark.anyio
async def test_a_request_that_changes_nothing_writes_nothing(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, "a" * 16)
    counters["s"] = 1
    await sessions.save(["s"])
    await sessions.save(["s"])
    assert store.read("s").revision == 1
    counters["s"] += 1
    await sessions.save(["s"])
    assert (store.read("s").revision, store.read("s").state) == (2, "2")


@pytest.mark.anyio
async def test_a_state_the_server_dropped_deletes_its_row(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, "a" * 16)
    counters["s"] = 1
    await sessions.save(["s"])
    counters.pop("s")
    await sessions.save(["s"])
    assert store.read("s") is None


@contextlib.contextmanager
def held_by_another_process(store: SessionStore) -> Iterator[None]:
    """The store's write lock, taken as another worker would: on a descriptor of its own."""
    other = os.open(f"{store.path}.lock", os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(other)


def counting_transactions(store: SessionStore) -> list[dict]:
    """Every group ``write_all`` commits, in order (a spy on the real method)."""
    groups: list[dict] = []
    write_all = store.write_all

    def counted(owner, states):
        groups.append(dict(states))
        return write_all(owner, states)

    store.write_all = counted
    return groups


@pytest.mark.anyio
async def test_writes_of_requests_finishing_in_one_loop_turn_are_committed_in_one_transaction(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, "a" * 16)
    groups = counting_transactions(store)
    for number in range(5):
        counters[f"s{number}"] = number
    await asyncio.gather(*(sessions.save([f"s{number}"]) for number in range(5)))
    assert groups == [{f"s{number}": str(number) for number in range(5)}]
    assert [store.read(f"s{number}").state for number in range(5)] == [str(number) for number in range(5)]


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
        assert not first.done() and not again.done() and store.read("s") is None
    await asyncio.wait_for(asyncio.gather(first, again), 10)
    assert store.read("s").state == "1"


@pytest.mark.anyio
async def test_a_save_of_a_session_another_worker_owns_raises_and_the_rest_of_its_group_is_written(store):
    store.write("theirs", "b" * 16, "9")
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, "a" * 16)
    counters["theirs"], counters["mine"] = 1, 2
    saved = await asyncio.gather(sessions.save(["theirs"]), sessions.save(["mine"]), return_exceptions=True)
    assert isinstance(saved[0], SessionTaken) and saved[1] is None
    assert (store.read("theirs").state, store.read("mine").state) == ("9", "2")
    assert not sessions.holds("theirs") and sessions.holds("mine")


def test_an_adopted_session_is_back_in_memory_as_stored(store):
    store.write("s", DEAD, "41")
    counters = SessionStates(int)
    assert DurableSessions(store, counters, "b" * 16).adopt(store.read("s"))
    assert counters["s"] == 41 and store.read("s").owner == "b" * 16


def test_the_store_stays_under_a_megabyte_as_sessions_end(store):
    for _ in range(20_000):
        session_id = uuid.uuid4().hex
        store.write(session_id, DEAD, "1")
        store.write(session_id, DEAD, "2")
        store.delete(session_id)
    assert store.path.stat().st_size <= 1 << 20
