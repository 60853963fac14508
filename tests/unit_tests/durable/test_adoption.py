"""Adoption, in process: a real store, a worker's durable sessions and lifecycle, and a transport's
``is_alive`` played by the test (which workers are alive is all the policy asks of a transport). Whichever
path takes a session up (the router's policy, the write-through's miss, the idle sweep), it is claimed,
held with the request ids its row remembers, live in the lifecycle and named by the request's cookie."""

from __future__ import annotations

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.applied import Applied, wrap
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import SessionStore, StoredSession, StoreUnavailable
from nemo_gym.lifecycle.cap import LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.routing.lost import ForwardTo, LostSessionPolicy, Reply, ServeHere
from nemo_gym.routing.replica import REPLICA_KEY
from nemo_gym.sessions.worker import OWNER_KEY
from tests.full_filesystem import full, needs_mount
from tests.unit_tests.conformance import assert_implements
from tests.unit_tests.durable.filling import commit_until_refused
from tests.unit_tests.replies import answered

pytestmark = pytest.mark.anyio

ME, DEAD, OTHER_DEAD, LIVE, LIVE_ELSEWHERE = "a" * 16, "d" * 16, "e" * 16, "f" * 16, "c" * 16


@pytest.fixture
def counters() -> SessionStates[int]:
    return SessionStates(int)


async def no_hook(session_id: str, reason: EndReason) -> None:
    pass


@pytest.fixture
def lifecycle(store, counters) -> SessionLifecycle:
    return SessionLifecycle(no_hook, None, LiveCount(None, None), [], DurableSessions(store, counters, ME), ME)


@pytest.fixture
def adopter(lifecycle) -> Adopter:
    return Adopter(lifecycle.durable, lifecycle, {LIVE}.__contains__, {REPLICA_KEY: "h1:8000"})


def stored(store: SessionStore, session_id: str, owner: str | None, state: str = "41") -> None:
    store.import_sessions([StoredSession(session_id, owner, 3, state, 4e9)])


def named(session_id: str, owner: str = DEAD) -> dict:
    """The session a request names, as the router read it."""
    return {SESSION_ID_KEY: session_id, OWNER_KEY: owner}


def test_the_adopter_implements_the_lost_session_policy():
    assert_implements(Adopter, LostSessionPolicy)


async def test_a_session_the_store_does_not_hold_is_lost_410_naming_the_dead_owner(adopter):
    decision = await adopter.owner_gone(DEAD, named("s"))
    status, _, body = await answered(decision.response)
    assert status == 410 and DEAD in body["detail"]


async def test_a_dead_owners_session_is_claimed_restored_and_served_here(adopter, store, counters):
    stored(store, "s", DEAD)
    assert await adopter.owner_gone(DEAD, named("s")) == ServeHere(adopted=True)
    assert counters["s"] == 41 and adopter.sessions.holds("s")
    assert ((await store.read("s")).owner, (await store.read("s")).revision) == (ME, 4)


async def test_a_session_another_live_worker_adopted_already_is_forwarded_there_and_not_claimed(adopter, store, counters):
    stored(store, "s", LIVE)
    assert await adopter.owner_gone(DEAD, named("s")) == ForwardTo(LIVE)
    assert (await store.read("s")).owner == LIVE and "s" not in counters


@pytest.mark.parametrize("owner", [OTHER_DEAD, None], ids=["another dead worker", "no worker (restored)"])
async def test_a_session_whose_stored_owner_is_dead_or_none_is_claimed_here(adopter, store, counters, owner):
    stored(store, "s", owner)
    assert await adopter.owner_gone(DEAD, named("s")) == ServeHere(adopted=True)
    assert (await store.read("s")).owner == ME and counters["s"] == 41


async def test_a_session_this_worker_adopted_meanwhile_is_served_here_without_a_claim(adopter, store):
    stored(store, "s", ME)
    assert await adopter.owner_gone(DEAD, named("s")) == ServeHere()
    assert (await store.read("s")).revision == 3


async def test_a_claim_lost_to_a_live_worker_is_forwarded_to_the_winner(adopter, store, counters, monkeypatch):
    stored(store, "s", DEAD)
    claim = store.claim

    async def raced(session: StoredSession, new_owner: str | None, owner_dead: bool = False) -> bool:
        monkeypatch.setattr(store, "claim", claim)
        assert await claim(session, LIVE)  # the winner's claim lands between this worker's read and its claim
        return await claim(session, new_owner)

    monkeypatch.setattr(store, "claim", raced)
    assert await adopter.owner_gone(DEAD, named("s")) == ForwardTo(LIVE)
    assert (await store.read("s")).owner == LIVE and "s" not in counters


async def test_a_claim_the_store_cannot_commit_is_a_503_with_retry_after_that_says_nothing_of_the_store(adopter, store, monkeypatch):
    stored(store, "s", DEAD)

    async def unavailable(session: StoredSession, new_owner: str | None, owner_dead: bool = False) -> bool:
        raise StoreUnavailable("database or disk is full")

    monkeypatch.setattr(store, "claim", unavailable)
    status, headers, body = await answered((await adopter.owner_gone(DEAD, named("s"))).response)
    assert (status, headers["retry-after"]) == (503, "1") and "session store is unavailable" in body["detail"] and "disk is full" not in body["detail"]
    assert (await store.read("s")).owner == DEAD


async def test_a_stored_state_that_does_not_load_here_is_a_500_naming_the_session(adopter, store):
    stored(store, "s", DEAD, state='"not a count"')
    status, _, body = await answered((await adopter.owner_gone(DEAD, named("s"))).response)
    assert status == 500 and "Session s" in body["detail"] and DEAD in body["detail"]


@pytest.mark.parametrize("session", [{}, {SESSION_ID_KEY: 7}], ids=["no session id", "not a string"])
async def test_a_session_without_a_usable_id_is_lost_410(adopter, session):
    status, _, _ = await answered((await adopter.owner_gone(DEAD, session)).response)
    assert status == 410


async def test_a_request_whose_owner_died_with_it_gets_503_retry_when_its_session_is_stored_and_410_when_not(adopter, store):
    stored(store, "s", DEAD)
    status, headers, body = await answered((await adopter.owner_died(DEAD, named("s"))).response)
    assert (status, headers["retry-after"]) == (503, "1") and DEAD in body["detail"]
    assert (await store.read("s")).owner == DEAD  # nothing is claimed for a request that may have taken effect
    status, _, _ = await answered((await adopter.owner_died(DEAD, named("gone"))).response)
    assert status == 410


async def test_a_session_the_router_adopts_is_live_here_at_once_and_its_cookie_names_this_worker_and_replica(adopter, store):
    stored(store, "s", DEAD)
    session = named("s")
    assert await adopter.owner_gone(DEAD, session) == ServeHere(adopted=True)
    assert adopter.lifecycle.registry.is_live("s") and adopter.lifecycle.count.total() == 1
    assert (session[OWNER_KEY], session[REPLICA_KEY]) == (ME, "h1:8000")


async def test_a_request_whose_cookie_still_names_the_dead_owner_of_a_session_adopted_here_gets_a_cookie_naming_this_worker(adopter, store):
    stored(store, "s", ME)
    session = named("s")
    assert await adopter.owner_gone(DEAD, session) == ServeHere()
    assert session[OWNER_KEY] == ME


async def test_an_adopted_session_answers_a_request_its_row_remembers_with_the_stored_reply(adopter, store):
    reply = Applied("key-1", 200, (("content-type", "application/json"),), b'{"count": 42}')
    stored(store, "s", DEAD, state=wrap("42", [reply]))
    assert await adopter.owner_gone(DEAD, named("s")) == ServeHere(adopted=True)
    assert adopter.sessions.reply("s", "key-1") == reply and adopter.sessions.reply("s", "key-2") is None


async def test_a_session_another_host_holds_under_a_live_lease_is_answered_503_by_the_policy_naming_the_holder(adopter, store, monkeypatch):
    stored(store, "s", LIVE_ELSEWHERE)
    holder = LeaseHolder(LIVE_ELSEWHERE, "host-2", {REPLICA_KEY: "h2:8000"}, live=True)
    monkeypatch.setattr(adopter.sessions, "lease", Lease("host-1"))

    async def lease_of(worker: str) -> LeaseHolder:
        return holder

    monkeypatch.setattr(adopter.sessions, "holder", lease_of)
    session = named("s")
    decision = await adopter.owner_gone(DEAD, session)
    assert isinstance(decision, Reply)
    status, headers, body = await answered(decision.response)
    assert (status, headers["retry-after"]) == (503, "1") and LIVE_ELSEWHERE in body["detail"]
    assert (session[OWNER_KEY], session[REPLICA_KEY]) == (LIVE_ELSEWHERE, "h2:8000")
    assert (await store.read("s")).owner == LIVE_ELSEWHERE and not adopter.lifecycle.registry.is_live("s")


async def test_a_session_restored_into_the_store_is_adopted_before_its_first_request_is_served(adopter, store, counters):
    store.import_sessions([StoredSession("s", None, 7, "41", 4e9)])
    session = {SESSION_ID_KEY: "s", OWNER_KEY: ME}
    assert await adopter.take_up(session) is None
    assert counters["s"] == 41 and adopter.sessions.holds("s") and adopter.lifecycle.registry.is_live("s")
    assert ((await store.read("s")).owner, (await store.read("s")).revision) == (ME, 8)


async def test_a_session_another_worker_owns_or_no_store_row_names_is_not_taken_up(adopter, store, counters):
    stored(store, "theirs", LIVE)
    assert await adopter.take_up({SESSION_ID_KEY: "theirs"}) is None
    assert await adopter.take_up({SESSION_ID_KEY: "unknown"}) is None
    assert counters == {} and (await store.read("theirs")).owner == LIVE and len(adopter.lifecycle.registry) == 0


async def test_a_restored_state_that_does_not_load_is_a_500_on_every_request_never_a_new_session(adopter, store):
    store.import_sessions([StoredSession("s", None, 7, '"not a count"', 4e9)])
    for _ in range(2):
        status, _, body = await answered(await adopter.take_up({SESSION_ID_KEY: "s"}))
        assert status == 500 and "Session s" in body["detail"]
    assert not adopter.sessions.holds("s") and not adopter.lifecycle.registry.is_live("s")


async def test_a_session_adopted_twice_over_is_counted_live_once(adopter, store):
    stored(store, "s", DEAD)
    assert await adopter.owner_gone(DEAD, named("s")) == ServeHere(adopted=True)
    adopter.sessions.drop("s")  # a lapse dropped it; the row still names this worker
    assert await adopter.take_up(named("s", ME)) is None
    assert adopter.sessions.holds("s") and adopter.lifecycle.count.total() == 1


class Lease:
    """The part of an owner lease the policy reads: this worker's liveness domain."""

    def __init__(self, domain: str) -> None:
        self.domain = domain


@needs_mount
async def test_a_dead_owners_session_whose_claim_cannot_commit_stays_the_dead_owners_out_of_memory_and_not_live(tmpfs_store, tmpfs):
    counters = SessionStates(int)
    lifecycle = SessionLifecycle(no_hook, None, LiveCount(None, None), [], DurableSessions(tmpfs_store, counters, ME), ME)
    adopter = Adopter(lifecycle.durable, lifecycle, lambda worker: False)
    stored(tmpfs_store, "orphan", DEAD, "7")
    with full(tmpfs):
        await commit_until_refused(tmpfs_store)
        status, _, _ = await answered((await adopter.owner_gone(DEAD, named("orphan"))).response)
        assert status == 503 and "orphan" not in counters and not adopter.sessions.holds("orphan") and not lifecycle.registry.is_live("orphan")
    assert ((await tmpfs_store.read("orphan")).owner, (await tmpfs_store.read("orphan")).state) == (DEAD, "7")
    assert await adopter.owner_gone(DEAD, named("orphan")) == ServeHere(adopted=True) and counters["orphan"] == 7
