"""One worker's durable sessions: written when changed, group-committed, undone when a commit fails, dead
owners' sessions adopted, and a session restored into the store taken up on the first request it misses."""

from __future__ import annotations

import asyncio

import pytest

from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import SessionStore, SessionTaken, StoredSession, StoreUnavailable
from tests.full_filesystem import full, needs_mount
from tests.unit_tests.durable.filling import MAX_WRITES, STATE, WORKER, commit_until_refused

pytestmark = pytest.mark.anyio

ME, OTHER, DEAD = "a" * 16, "b" * 16, "0" * 16


async def test_a_request_that_changes_nothing_writes_nothing(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    counters["s"] = 1
    await sessions.save(["s"])
    await sessions.save(["s"])
    assert (await store.read("s")).revision == 1
    counters["s"] += 1
    await sessions.save(["s"])
    assert ((await store.read("s")).revision, (await store.read("s")).state) == (2, "2")


async def test_a_state_the_server_dropped_deletes_its_row(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    counters["s"] = 1
    await sessions.save(["s"])
    counters.pop("s")
    await sessions.save(["s"])
    assert await store.read("s") is None


def counting_commits(store: SessionStore) -> list[dict]:
    """Every group the store commits, in order (a spy on the real method)."""
    groups: list[dict] = []
    commit = store.commit

    async def counted(owner, states):
        groups.append(dict(states))
        return await commit(owner, states)

    store.commit = counted
    return groups


async def test_writes_of_requests_finishing_in_one_loop_turn_are_committed_in_one_transaction(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    groups = counting_commits(store)
    for number in range(5):
        counters[f"s{number}"] = number
    await asyncio.gather(*(sessions.save([f"s{number}"]) for number in range(5)))
    assert groups == [{f"s{number}": str(number) for number in range(5)}]
    assert [(await store.read(f"s{number}")).state for number in range(5)] == [str(number) for number in range(5)]


async def test_a_save_of_a_session_another_worker_owns_raises_and_the_rest_of_its_group_is_written(store):
    store.write("theirs", OTHER, "9")
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    counters["theirs"], counters["mine"] = 1, 2
    saved = await asyncio.gather(sessions.save(["theirs"]), sessions.save(["mine"]), return_exceptions=True)
    assert isinstance(saved[0], SessionTaken) and saved[1] is None
    assert ((await store.read("theirs")).state, (await store.read("mine")).state) == ("9", "2")
    assert not sessions.holds("theirs") and sessions.holds("mine")


async def test_an_adopted_session_is_back_in_memory_as_stored(store):
    store.write("s", DEAD, "41")
    counters = SessionStates(int)
    assert await DurableSessions(store, counters, OTHER).adopt(await store.read("s"))
    assert counters["s"] == 41 and (await store.read("s")).owner == OTHER


def restored(store: SessionStore, session_id: str, state: str) -> None:
    store.import_sessions([StoredSession(session_id, None, 7, state, 4e9)])


async def test_a_restored_session_is_claimed_and_held_by_the_worker_that_misses_it(store):
    restored(store, "s", "41")
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    await sessions.take_up("s")
    assert counters["s"] == 41 and sessions.holds("s")
    assert ((await store.read("s")).owner, (await store.read("s")).revision) == (ME, 8)


async def test_a_session_another_worker_owns_or_no_store_row_names_is_not_taken_up(store):
    store.write("theirs", OTHER, "5")
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    await sessions.take_up("theirs")
    await sessions.take_up("unknown")
    assert counters == {} and (await store.read("theirs")).owner == OTHER


async def test_a_restored_state_that_does_not_load_is_an_error_on_every_request_never_a_miss(store):
    restored(store, "s", '"not a count"')
    sessions = DurableSessions(store, SessionStates(int), ME)
    for _ in range(2):
        with pytest.raises(ValueError):
            await sessions.take_up("s")
    assert not sessions.holds("s")


@needs_mount
async def test_a_session_whose_write_cannot_commit_is_back_in_memory_to_what_the_store_holds(tmpfs_store, tmpfs):
    store = tmpfs_store
    states = SessionStates(str)
    sessions = DurableSessions(store, states, WORKER)
    states["old"] = "0"
    await sessions.save(["old"])
    with full(tmpfs):
        for number in range(MAX_WRITES):
            states["old"] = f"{STATE}{number}"
            try:
                await sessions.save(["old"])
            except StoreUnavailable:
                break
        else:
            raise AssertionError(f"{MAX_WRITES} writes fitted on the full file system")
        assert states.export("old") == (await store.read("old")).state != f'"{STATE}{number}"'  # the refused state is undone
        states["new"] = STATE
        with pytest.raises(StoreUnavailable):
            await sessions.save(["new"])
        assert "new" not in states and await store.read("new") is None
    states["old"] += "!"
    await sessions.save(["old"])
    assert (await store.read("old")).state == states.export("old")


@needs_mount
async def test_a_dead_owners_session_whose_claim_cannot_commit_stays_the_dead_owners_and_out_of_memory(tmpfs_store, tmpfs):
    store = tmpfs_store
    dead = "f" * 16
    store.write("orphan", dead, "7")
    states = SessionStates(int)
    sessions = DurableSessions(store, states, WORKER)
    with full(tmpfs):
        await commit_until_refused(store)
        with pytest.raises(StoreUnavailable):
            await sessions.adopt(await store.read("orphan"))
        assert "orphan" not in states and not sessions.holds("orphan")
    assert ((await store.read("orphan")).owner, (await store.read("orphan")).state) == (dead, "7")
    assert await sessions.adopt(await store.read("orphan")) and states["orphan"] == 7
