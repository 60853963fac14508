"""One worker's durable sessions: written when changed, group-committed, and undone when a commit fails
(taking sessions over from the store is tests/unit_tests/durable/test_adoption.py's)."""

from __future__ import annotations

import asyncio

import pytest

from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import SessionStore, SessionTaken, StoreUnavailable
from tests.full_filesystem import full, needs_mount
from tests.unit_tests.durable.filling import MAX_WRITES, STATE, WORKER

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
