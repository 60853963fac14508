"""The lifecycle and the store: a dead owner's stored session that no request reaches is ended as idle by a live worker
once its last use is older than the timeout (adopted first, so its hook runs once); a session the store holds for another
worker ends here as a conflict, its row left to that worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import StoredSession
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS
from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.lifecycle.cap import LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.registry import EndReason
from tests.full_filesystem import full, needs_mount
from tests.unit_tests.durable.filling import commit_until_refused

pytestmark = pytest.mark.anyio

ME, DEAD, LIVE = "a" * 16, "d" * 16, "f" * 16
TIMEOUT = 60.0


def row(session_id: str, owner: str | None, used_seconds_ago: float) -> StoredSession:
    return StoredSession(session_id, owner, 1, "5", time.time() - used_seconds_ago + SESSION_MAX_AGE_SECONDS)


def recorded() -> tuple[list[tuple[str, EndReason]], Callable[[str, EndReason], Awaitable[None]]]:
    """A hook that records each call, and its record."""
    ends: list[tuple[str, EndReason]] = []

    async def hook(session_id: str, reason: EndReason) -> None:
        ends.append((session_id, reason))

    return ends, hook


class Resources(SessionStates):
    """Counts whose sessions each stand for something outside memory (as a sandbox does): ``released`` lists the
    sessions whose state was ended, which releases that."""

    def __init__(self) -> None:
        super().__init__(int)
        self.released: list[str] = []

    def end(self, session_id: str) -> None:
        if session_id in self:
            self.released.append(session_id)
        super().end(session_id)


async def one_saved_session(store, hook, count: int) -> tuple[SessionStates, DurableSessions, SessionLifecycle]:
    """This worker's lifecycle, holding session "s" with ``count`` saved to the store."""
    counters = SessionStates(int)
    durable = DurableSessions(store, counters, ME)
    lifecycle = SessionLifecycle(hook, TIMEOUT, LiveCount(None, None), [], durable, ME)
    assert lifecycle.admit("s") is None
    counters["s"] = count
    await durable.save(["s"])
    return counters, durable, lifecycle


async def test_only_a_dead_owners_row_idle_past_the_timeout_is_ended_once_through_the_hook(store):
    store.import_sessions([row("stale", DEAD, 2 * TIMEOUT), row("fresh", DEAD, 1), row("live", LIVE, 2 * TIMEOUT), row("restored", None, 2 * TIMEOUT)])
    ends, hook = recorded()
    counters = SessionStates(int)
    lifecycle = SessionLifecycle(hook, TIMEOUT, LiveCount(None, None), [], DurableSessions(store, counters, ME), ME)
    adopter = Adopter(lifecycle.durable, lifecycle, {LIVE}.__contains__)
    lifecycle.open(adopter.sweep_orphans)
    adopter.orphans_looked_at = 0.0
    await lifecycle.sweep()
    assert ends == [("stale", EndReason.IDLE)]
    assert "idle for 120 s" in ended_detail((await store.read("stale")).state)
    assert {session_id: (await store.read(session_id)).state for session_id in ("fresh", "live", "restored")} == dict.fromkeys(("fresh", "live", "restored"), "5")
    assert "stale" not in counters
    adopter.orphans_looked_at = 0.0
    await lifecycle.sweep()
    assert len(ends) == 1
    await lifecycle.close()


async def test_a_session_the_store_holds_for_another_worker_ends_here_as_a_conflict_and_its_row_is_left(store):
    ends, hook = recorded()
    counters, durable, lifecycle = await one_saved_session(store, hook, 1)
    assert await store.claim(await store.read("s"), LIVE)  # another worker took it over
    counters["s"] = 2
    with pytest.raises(Exception, match="belongs to another worker"):
        await durable.save(["s"])
    for _ in range(10):
        await asyncio.sleep(0)
    assert ends == [("s", EndReason.CONFLICT)]
    assert "s" not in counters and not lifecycle.registry.is_live("s")
    stored = await store.read("s")
    assert (stored.owner, stored.state) == (LIVE, "1")


async def test_a_stopping_worker_ends_its_in_memory_sessions_as_stop_and_leaves_its_durable_ones_for_a_restart(store):
    ends, hook = recorded()
    in_memory = SessionLifecycle(hook, TIMEOUT, LiveCount(None, None), [])
    durable = SessionLifecycle(hook, TIMEOUT, LiveCount(None, None), [], DurableSessions(store, SessionStates(int), ME), ME)
    for lifecycle, sessions in ((in_memory, ["m1", "m2"]), (durable, ["d1"])):
        lifecycle.open()
        for session_id in sessions:
            assert lifecycle.admit(session_id) is None
        await lifecycle.close()
    assert sorted(ends) == [("m1", EndReason.STOP), ("m2", EndReason.STOP)]
    assert not in_memory.registry.is_live("m1") and "its server stopped" in in_memory.registry.ended("m1")


@needs_mount
async def test_a_tombstone_the_full_disk_refused_is_written_by_the_next_sweep_once_there_is_room(tmpfs, tmpfs_store):
    ends, hook = recorded()
    counters, durable, lifecycle = await one_saved_session(tmpfs_store, hook, 5)
    with full(tmpfs):
        await commit_until_refused(tmpfs_store)
        assert await lifecycle.end("s", EndReason.CLOSE)
        assert (await tmpfs_store.read("s")).state == "5"  # refused: the row still holds the state
    # Were the worker SIGKILLed now, an adopter would bring the ended session back: the sweep writes it.
    await lifecycle.sweep()
    assert ends == [("s", EndReason.CLOSE)]
    assert "ended by /close_session" in ended_detail((await tmpfs_store.read("s")).state)


async def test_a_session_another_worker_took_is_forgotten_here_and_what_it_stands_for_is_left_to_that_worker(store):
    ends, hook = recorded()
    resources = Resources()
    durable = DurableSessions(store, resources, ME)
    lifecycle = SessionLifecycle(hook, TIMEOUT, LiveCount(None, None), [], durable, ME)
    assert lifecycle.admit("s") is None
    resources["s"] = 1
    await durable.save(["s"])
    assert await store.claim(await store.read("s"), LIVE)  # another worker took it over: the sandbox is its own now
    resources["s"] = 2
    with pytest.raises(Exception, match="belongs to another worker"):
        await durable.save(["s"])
    for _ in range(10):
        await asyncio.sleep(0)
    assert ends == [("s", EndReason.CONFLICT)] and "s" not in resources and resources.released == []
