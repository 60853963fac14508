"""Adoption's decisions, in process: a real store, a worker's durable sessions, and a transport's
``is_alive`` played by the test (which workers are alive is all the policy asks of a transport)."""

from __future__ import annotations

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import SessionStore, StoredSession, StoreUnavailable
from nemo_gym.routing.lost import ForwardTo, LostSessionPolicy, ServeHere
from nemo_gym.routing.worker import OWNER_KEY
from tests.unit_tests.protocols import assert_implements
from tests.unit_tests.replies import answered

pytestmark = pytest.mark.anyio

ME, DEAD, OTHER_DEAD, LIVE = "a" * 16, "d" * 16, "e" * 16, "f" * 16


@pytest.fixture
def counters() -> SessionStates[int]:
    return SessionStates(int)


@pytest.fixture
def adopter(store, counters) -> Adopter:
    return Adopter(DurableSessions(store, counters, ME), {LIVE}.__contains__)


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
    assert await adopter.owner_gone(DEAD, named("s")) == ServeHere()
    assert counters["s"] == 41 and adopter.sessions.holds("s")
    assert ((await store.read("s")).owner, (await store.read("s")).revision) == (ME, 4)


async def test_a_session_another_live_worker_adopted_already_is_forwarded_there_and_not_claimed(adopter, store, counters):
    stored(store, "s", LIVE)
    assert await adopter.owner_gone(DEAD, named("s")) == ForwardTo(LIVE)
    assert (await store.read("s")).owner == LIVE and "s" not in counters


@pytest.mark.parametrize("owner", [OTHER_DEAD, None], ids=["another dead worker", "no worker (restored)"])
async def test_a_session_whose_stored_owner_is_dead_or_none_is_claimed_here(adopter, store, counters, owner):
    stored(store, "s", owner)
    assert await adopter.owner_gone(DEAD, named("s")) == ServeHere()
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
