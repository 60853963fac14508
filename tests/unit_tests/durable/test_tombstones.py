"""An ended durable session leaves a tombstone row, which no worker adopts and which answers 410 saying why;
a held row is rewritten as a use at most every refresh interval; a commit another worker owns is reported."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, strategies as st

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.applied import Applied, remembered, wrap
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import StoredSession
from nemo_gym.durable.tombstones import ended_detail, tombstone
from nemo_gym.lifecycle.cap import LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.routing.lost import Reply
from nemo_gym.sessions.worker import OWNER_KEY
from tests.unit_tests.durable.test_adoption import no_hook
from tests.unit_tests.replies import answered

pytestmark = pytest.mark.anyio

ME, DEAD, OTHER = "a" * 16, "d" * 16, "b" * 16


@given(st.text())
def test_a_tombstone_carries_its_detail_back(detail):
    assert ended_detail(tombstone(detail)) == detail


@given(st.one_of(st.integers(), st.text(), st.dictionaries(st.text(), st.integers())).map(lambda value: __import__("json").dumps(value)))
def test_no_other_state_is_a_tombstone(state):
    assert ended_detail(state) is None


async def test_an_ended_session_s_row_becomes_its_tombstone_and_later_saves_leave_it(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    counters["s"] = 3
    await sessions.save(["s"])
    sessions.end("s", "Session s ended by /close_session")
    await sessions.save(["s"])
    assert ended_detail((await store.read("s")).state) == "Session s ended by /close_session"
    assert "s" not in counters and not sessions.holds("s")
    await sessions.save(["s"])  # a later request's save (its 410) deletes nothing
    assert ended_detail((await store.read("s")).state) is not None


async def test_a_tombstone_is_never_taken_up_and_a_dead_owners_one_answers_410_with_its_detail(store):
    store.import_sessions([StoredSession("s", None, 1, tombstone("Session s ended: idle for 9 s"), 4e9)])
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    adopter = Adopter(sessions, SessionLifecycle(no_hook, None, LiveCount(None, None), [], sessions, ME), lambda worker: False)
    assert await adopter.take_up({SESSION_ID_KEY: "s", OWNER_KEY: ME}) is None
    assert not sessions.holds("s") and "s" not in counters
    store.import_sessions([StoredSession("t", DEAD, 1, tombstone("Session t ended with its /verify"), 4e9)])
    decision = await adopter.owner_gone(DEAD, {SESSION_ID_KEY: "t", OWNER_KEY: DEAD})
    assert isinstance(decision, Reply)
    status, _, body = await answered(decision.response)
    assert status == 410 and body["detail"] == "Session t ended with its /verify"
    assert "t" not in counters


async def test_an_unchanged_state_is_written_again_as_a_use_once_the_refresh_interval_passed(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME, refresh_seconds=0.2)
    counters["s"] = 1
    await sessions.save(["s"])
    first = await store.read("s")
    await sessions.save(["s"])
    assert (await store.read("s")).revision == first.revision
    await asyncio.sleep(0.25)
    await sessions.save(["s"])
    again = await store.read("s")
    assert again.revision == first.revision + 1 and again.expires_at > first.expires_at


async def test_a_session_another_worker_owns_at_a_commit_is_reported(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    taken: list[str] = []
    sessions.on_taken = taken.append
    counters["s"] = 1
    await sessions.save(["s"])
    assert await store.claim(await store.read("s"), OTHER)
    counters["s"] = 2
    with pytest.raises(Exception):
        await sessions.save(["s"])
    assert taken == ["s"]


async def test_a_tombstone_written_with_the_reply_of_the_request_that_ended_it_remembers_that_request(store):
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    counters["s"] = 3
    await sessions.save(["s"], Applied("increment", 200, (), b"{}"))
    sessions.end("s", "Session s ended with its /verify")
    verify = Applied("verify", 200, (("content-type", "application/json"),), b'{"reward": 1.0}')
    await sessions.save(["s"], verify)
    row = (await store.read("s")).state
    assert ended_detail(row) == "Session s ended with its /verify"
    assert (remembered(row, "verify"), remembered(row, "increment"), remembered(row, "other")) == (verify, Applied("increment", 200, (), b"{}"), None)
    assert not sessions.holds("s") and sessions.reply("s", "verify") is None  # the store's now: read from its row


@pytest.mark.parametrize("request_id, status", [("verify", 200), ("other", 410), (None, 410)])
async def test_a_dead_owners_tombstone_answers_the_request_that_ended_it_with_its_reply_and_any_other_410(store, request_id, status):
    verify = Applied("verify", 200, (("content-type", "application/json"),), b'{"reward": 1.0}')
    store.import_sessions([StoredSession("t", DEAD, 1, wrap(tombstone("Session t ended with its /verify"), [verify]), 4e9)])
    sessions = DurableSessions(store, SessionStates(int), ME)
    adopter = Adopter(sessions, SessionLifecycle(no_hook, None, LiveCount(None, None), [], sessions, ME), lambda worker: False)
    for decision in (await adopter.owner_gone(DEAD, {SESSION_ID_KEY: "t", OWNER_KEY: DEAD}, request_id), await adopter.owner_died(DEAD, {SESSION_ID_KEY: "t"}, request_id)):
        answered_status, headers, body = await answered(decision.response)
        assert answered_status == status
        assert body == ({"reward": 1.0} if status == 200 else {"detail": "Session t ended with its /verify"})
    replay = await adopter.take_up({SESSION_ID_KEY: "t", OWNER_KEY: ME}, request_id)
    assert (replay is None) == (status == 410) and not sessions.holds("t")
