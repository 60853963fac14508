"""The PostgreSQL store's own promises, on a real server: owner leases and fenced commits (``durable.lease``),
and its credentials (from the location, libpq's environment or a password file; never in ``location``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings

from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.lease import LeaseTerms
from nemo_gym.durable.postgresql_store import PostgreSQLStore
from nemo_gym.durable.states import SessionStates
from nemo_gym.durable.store import StoreError, open_store
from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.lifecycle.cap import LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.registry import EndReason
from tests.postgres import Postgres, postgres_or_skip
from tests.hostile_passwords import PASSWORDS, leaked, written_forms
from tests.unit_tests.durable.test_write_through import verifying
from tests.unit_tests.lifecycle.test_ending import Resources

PASSWORD = "unit-test:pass@word"
INSTANCE = "counter"
ME, OTHER = "a" * 16, "b" * 16
DOMAIN = "test-domain"
# Short leases: each test waits one out. Never an expectation of how fast anything is.
SHORT = 0.5
PAST = 0.8


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    with postgres_or_skip(password=PASSWORD) as postgres:
        yield postgres


@pytest.fixture
def database(server: Postgres) -> str:
    name = f"unit_{uuid.uuid4().hex[:12]}"
    server.psql(f"CREATE DATABASE {name}")
    return name


@pytest.fixture
def stores(server: Postgres, database: str) -> Iterator[tuple[PostgreSQLStore, PostgreSQLStore]]:
    """Two workers' connections to one store."""
    mine, theirs = (open_store(server.dsn(database=database), INSTANCE) for _ in range(2))
    yield mine, theirs
    mine.close()
    theirs.close()


@pytest.mark.anyio
async def test_a_session_is_claimed_from_a_live_lease_only_by_a_worker_that_knows_the_owner_dead(stores):
    mine, theirs = stores
    await mine.renew_lease(ME, None, DOMAIN, {}, SHORT)
    await mine.commit(ME, {"s": "1", "t": "1"})
    assert not await theirs.claim(await theirs.read("s"), OTHER)
    assert await theirs.claim(await theirs.read("t"), OTHER, owner_dead=True)
    await asyncio.sleep(PAST)
    assert await theirs.claim(await theirs.read("s"), OTHER)
    assert (await theirs.read("s")).owner == OTHER


@pytest.mark.anyio
async def test_a_worker_whose_lease_expired_commits_nothing_until_it_renews_and_then_gets_a_new_incarnation(stores):
    mine, _ = stores
    first = await mine.renew_lease(ME, None, DOMAIN, {}, SHORT)
    assert await mine.renew_lease(ME, first, DOMAIN, {}, SHORT) == first  # in time: the same lease
    await mine.commit(ME, {"s": "1"})
    await asyncio.sleep(PAST)
    assert await mine.commit(ME, {"s": "2", "new": "1"}) == {"s", "new"}
    assert (await mine.read("s")).state == "1" and await mine.read("new") is None
    assert await mine.renew_lease(ME, first, DOMAIN, {}, SHORT) != first
    assert await mine.commit(ME, {"s": "3"}) == set() and (await mine.read("s")).state == "3"


@pytest.mark.anyio
async def test_an_old_owners_writes_and_deletes_after_its_session_was_adopted_are_refused(stores):
    mine, theirs = stores
    incarnation = await mine.renew_lease(ME, None, DOMAIN, {}, SHORT)
    await mine.commit(ME, {"s": "1", "t": "1"})
    await asyncio.sleep(PAST)
    assert await theirs.claim(await theirs.read("s"), OTHER) and await theirs.claim(await theirs.read("t"), OTHER)
    await mine.renew_lease(ME, incarnation, DOMAIN, {}, SHORT)
    assert await mine.commit(ME, {"s": "stale", "t": None}) == {"s", "t"}
    assert ((await theirs.read("s")).state, (await theirs.read("t")).owner) == ("1", OTHER)


@pytest.mark.anyio
async def test_a_lease_names_its_domain_and_keys_and_is_live_until_it_expires_or_is_let_go(stores):
    mine, theirs = stores
    incarnation = await mine.renew_lease(ME, None, DOMAIN, {"nemo_gym_replica": "h:1"}, SHORT)
    held = await theirs.lease_of(ME)
    assert (held.worker, held.domain, held.keys, held.live) == (ME, DOMAIN, {"nemo_gym_replica": "h:1"}, True)
    await asyncio.sleep(PAST)
    assert not (await theirs.lease_of(ME)).live
    await mine.renew_lease(ME, incarnation, DOMAIN, {}, SHORT)
    await mine.release_lease(ME, await mine.renew_lease(ME, mine.fence, DOMAIN, {}, SHORT))
    assert await theirs.lease_of(ME) is None


@pytest.mark.anyio
async def test_a_worker_whose_lease_lapsed_keeps_the_sessions_still_its_own_and_drops_the_ones_adopted(stores):
    mine, theirs = stores
    counters = SessionStates(int)
    sessions = DurableSessions(mine, counters, ME, lease=LeaseTerms(DOMAIN, {}, SHORT))
    await sessions.lease.ensure()
    counters.update(kept=1, adopted=2)
    await sessions.save(["kept", "adopted"])
    await asyncio.sleep(PAST)
    assert not sessions.lease.valid()
    assert await theirs.claim(await theirs.read("adopted"), OTHER)
    epoch = sessions.epoch
    await sessions.ensure_lease()
    assert sessions.lease.valid() and sessions.epoch == epoch + 1
    assert dict(counters) == {"kept": 1} and sessions.holds("kept") and not sessions.holds("adopted")


@pytest.mark.anyio
async def test_a_verify_whose_commit_the_hung_store_left_unknown_ends_its_session_and_its_retry_under_its_id_gets_the_reward(server, database):
    """PostgreSQL frozen (SIGSTOP) while a verify commits, past the store's deadline: 503 saying whether it took
    effect is unknown, and the end stands (its hook ran once: it may be in the store); thawed, the verify sent
    again under its Idempotency-Key gets the first one's reward, the app not run again."""
    store = open_store(server.dsn(database=database), INSTANCE, timeout_seconds=1)
    counters = SessionStates(int)
    sessions = DurableSessions(store, counters, ME)
    hooked, served = [], []

    async def hook(session_id, reason):
        hooked.append((session_id, reason))

    async def hang_the_store():
        served.append(True)
        server.freeze()

    lifecycle = SessionLifecycle(hook, None, LiveCount(None, None), [], sessions, ME)
    assert lifecycle.admit("s") is None
    counters["s"] = 5
    await sessions.save(["s"])
    post_verify = verifying(sessions, lifecycle, during=hang_the_store)
    try:
        status, body = await post_verify("verify-once")
    finally:
        server.thaw()
    try:
        assert status == 503 and "unknown" in body["detail"], body
        assert hooked == [("s", EndReason.VERIFY)] and not lifecycle.registry.is_live("s")
        assert await post_verify("verify-once") == (200, {"reward": 5}) and served == [True] and len(hooked) == 1
    finally:
        await lifecycle.close()
        store.close()


@pytest.mark.anyio
async def test_a_worker_whose_lease_lapsed_forgets_the_sessions_adopted_meanwhile_and_leaves_what_they_stand_for_to_the_adopter(stores):
    mine, theirs = stores
    resources = Resources()
    sessions = DurableSessions(mine, resources, ME, lease=LeaseTerms(DOMAIN, {}, SHORT))
    await sessions.lease.ensure()
    resources.update(kept=1, adopted=2)
    await sessions.save(["kept", "adopted"])
    await asyncio.sleep(PAST)
    assert await theirs.claim(await theirs.read("adopted"), OTHER)
    await sessions.ensure_lease()
    assert dict(resources) == {"kept": 1} and resources.released == []


def test_the_location_shows_no_password_and_a_wrong_one_is_refused_without_showing_it(server: Postgres, database: str):
    store = open_store(server.dsn(database=database), INSTANCE)
    try:
        assert store.location == server.dsn(password="", database=database) and PASSWORD not in store.location
    finally:
        store.close()
    with pytest.raises(StoreError) as refused:
        open_store(server.dsn(password="wrong-secret", database=database), INSTANCE)
    assert "password authentication failed" in str(refused.value) and "wrong-secret" not in str(refused.value)


def test_the_password_may_come_from_libpqs_environment_or_a_password_file(server: Postgres, database: str, tmp_path: Path, monkeypatch):
    without = server.dsn(password="", database=database)
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    open_store(without, INSTANCE).close()
    monkeypatch.delenv("PGPASSWORD")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:*:{PASSWORD.replace(':', chr(92) + ':')}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    open_store(without, INSTANCE).close()
    monkeypatch.delenv("PGPASSFILE")
    with pytest.raises(StoreError):
        open_store(without, INSTANCE)


def test_an_unreachable_server_is_a_store_error_at_open(server: Postgres):
    with pytest.raises(StoreError, match="cannot be used"):
        open_store(f"postgresql://gym@127.0.0.1:1/{INSTANCE}", INSTANCE)


@settings(max_examples=60, deadline=None)
@given(PASSWORDS)
def test_no_password_of_printable_characters_is_in_the_location_or_the_error_of_a_store_that_is_down(password):
    # Nothing listens on port 1: libpq's connect is refused, as while the store is down; a location libpq
    # cannot read (a bad escape, a raw '@' or '/') is refused before it.
    for written in written_forms(password):
        with pytest.raises(StoreError) as refused:
            PostgreSQLStore(written, INSTANCE)
        assert not leaked(password, str(refused.value)), (written, str(refused.value))
        assert "cannot be used" in str(refused.value)


@pytest.mark.anyio
async def test_a_verify_served_while_the_lease_lapsed_is_refused_unwritten_and_its_session_lives_on_for_the_retry(stores):
    """A verify outlives this worker's lease, which another request renews meanwhile (a new incarnation: a lapse).
    Its 503 says the verify did not take effect, and it did not: no hook, no tombstone, the session still live
    here as the store holds it (its row still names this worker), so the retry scores and ends it once."""
    mine, _ = stores
    counters = SessionStates(int)
    sessions = DurableSessions(mine, counters, ME, lease=LeaseTerms(DOMAIN, {}, SHORT))
    hooked = []

    async def hook(session_id, reason):
        hooked.append((session_id, reason))

    lifecycle = SessionLifecycle(hook, None, LiveCount(None, None), [], sessions, ME)
    await sessions.ensure_lease()
    assert lifecycle.admit("s") is None
    counters["s"] = 5
    await sessions.save(["s"])
    lapses = []

    async def outlive_the_lease():
        if not lapses:
            await asyncio.sleep(PAST)
            epoch = sessions.epoch
            await sessions.ensure_lease()
            lapses.append(sessions.epoch - epoch)

    post_verify = verifying(sessions, lifecycle, during=outlive_the_lease)
    status, body = await post_verify()
    assert lapses == [1] and status == 503 and "did not take effect" in body["detail"], body
    assert hooked == [] and lifecycle.registry.is_live("s") and counters.get("s") == 5
    assert (await mine.read("s")).state == sessions.written["s"]
    assert await post_verify() == (200, {"reward": 5})
    assert hooked == [("s", EndReason.VERIFY)] and "ended with its /verify" in ended_detail((await mine.read("s")).state)
    await lifecycle.close()
