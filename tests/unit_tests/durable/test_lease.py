"""nemo_gym.durable.lease: a worker's owner lease, as the worker keeps it: valid for 0.9 of a lease after the
renewal was sent, renewed one at a time however many requests wait on it, a new incarnation after the first is a
lapse (``on_lapse`` runs), a store that fails leaves the lease invalid, and stopping lets the lease go.

The store here keeps leases in memory (``LeaseStore``'s four methods, checked against the protocol); the
PostgreSQL store's own lease semantics are tested in test_postgresql_store.py."""

from __future__ import annotations

import asyncio
import os

import pytest

from nemo_gym.durable.lease import VALID_SHARE, LeaseHolder, LeaseStore, OwnerLease, liveness_domain
from nemo_gym.durable.store import StoreTimedOut, StoreUnavailable
from tests.unit_tests.conformance import assert_implements

pytestmark = pytest.mark.anyio

WORKER = "0123456789abcdef"


class MemoryLeases:
    """Leases by worker; ``expire`` makes the next renewal a new incarnation, ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self.renewals = 0
        self.released: list[tuple[str, int]] = []
        self.down = False
        self.gate: asyncio.Event | None = None

    async def renew_lease(self, worker: str, incarnation: int | None, domain: str, keys: dict, seconds: float) -> int:
        if self.down:
            raise StoreUnavailable("store down")
        self.renewals += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.held.get(worker) != incarnation or incarnation is None:
            self.held[worker] = self.held.get(worker, 0) + 1
        return self.held[worker]

    async def lease_of(self, worker: str) -> LeaseHolder | None:
        return None

    async def owned(self, worker: str) -> set[str]:
        return set()

    async def release_lease(self, worker: str, incarnation: int) -> None:
        self.released.append((worker, incarnation))

    def expire(self, worker: str) -> None:
        self.held[worker] += 1


def lease(store: MemoryLeases, lapses: list, seconds: float = 60.0) -> OwnerLease:
    async def on_lapse() -> None:
        lapses.append(True)

    return OwnerLease(store, WORKER, "domain", {"nemo_gym_replica": "h:1"}, seconds, on_lapse)


def test_the_memory_store_is_a_lease_store():
    assert_implements(MemoryLeases, LeaseStore)


async def test_a_lease_is_invalid_until_renewed_then_valid_for_its_share_of_the_lease():
    store, lapses = MemoryLeases(), []
    owner = lease(store, lapses)
    assert not owner.valid()
    before = asyncio.get_running_loop().time()
    await owner.ensure()
    assert owner.valid() and owner.incarnation == 1 and lapses == []
    assert before + VALID_SHARE * 60.0 <= owner.valid_until <= asyncio.get_running_loop().time() + VALID_SHARE * 60.0
    await owner.ensure()
    assert store.renewals == 1  # still valid: not renewed again


async def test_requests_waiting_on_a_renewal_share_the_one_under_way():
    store, lapses = MemoryLeases(), []
    store.gate = asyncio.Event()
    owner = lease(store, lapses)
    waiting = [asyncio.create_task(owner.ensure()) for _ in range(5)]
    await asyncio.sleep(0.05)
    store.gate.set()
    await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert store.renewals == 1 and owner.valid()


async def test_a_new_incarnation_after_the_first_is_a_lapse_and_on_lapse_runs_once():
    store, lapses = MemoryLeases(), []
    owner = lease(store, lapses)
    await owner.renew()
    await owner.renew()
    assert (owner.incarnation, lapses) == (1, [])
    store.expire(WORKER)
    await owner.renew()
    assert (owner.incarnation, lapses) == (3, [True])


async def test_a_store_that_fails_raises_to_the_request_and_leaves_the_lease_invalid():
    store, lapses = MemoryLeases(), []
    store.down = True
    owner = lease(store, lapses)
    with pytest.raises(StoreUnavailable):
        await owner.ensure()
    assert not owner.valid() and owner.renewing is None
    store.down = False
    await owner.ensure()
    assert owner.valid()


async def test_start_survives_a_store_down_and_keeps_renewing_until_stop_lets_the_lease_go():
    store, lapses = MemoryLeases(), []
    store.down = True
    owner = lease(store, lapses, seconds=0.3)
    await owner.start()
    assert owner.incarnation is None
    store.down = False
    for _ in range(100):
        if store.renewals >= 2:
            break
        await asyncio.sleep(0.05)
    assert store.renewals >= 2 and owner.incarnation == 1
    await owner.stop()
    assert store.released == [(WORKER, 1)] and owner.keeper.cancelled()


class SlowLeases(MemoryLeases):
    """Leases that expire by this store's clock ``seconds`` after their renewal (a renewal past that is a new
    incarnation); renewal number ``slow`` takes ``stall`` seconds and then times out."""

    def __init__(self, slow: int, stall: float) -> None:
        super().__init__()
        self.slow, self.stall = slow, stall
        self.expires: dict[str, float] = {}

    async def renew_lease(self, worker: str, incarnation: int | None, domain: str, keys: dict, seconds: float) -> int:
        self.renewals += 1
        if self.renewals == self.slow:
            await asyncio.sleep(self.stall)
            raise StoreTimedOut("the store did not answer in time", sent=True)
        now = asyncio.get_running_loop().time()
        if incarnation is None or self.held.get(worker) != incarnation or now > self.expires[worker]:
            self.held[worker] = self.held.get(worker, 0) + 1
        self.expires[worker] = now + seconds
        return self.held[worker]


async def test_a_renewal_the_store_timed_out_is_followed_by_the_next_at_once_so_one_slow_answer_lapses_nothing():
    """Renewals every third of a 3 s lease (the start's, then the keeper's at once and every second); the one sent at
    1 s takes 1.5 s and times out: the next is sent then (2.5 s), inside the lease, not a third of a lease later
    (3.5 s, past it: a lapse)."""
    store, lapses = SlowLeases(slow=3, stall=1.5), []
    owner = lease(store, lapses, seconds=3.0)
    await owner.start()
    try:
        for _ in range(200):
            if store.renewals >= 4:
                break
            await asyncio.sleep(0.05)
        assert store.renewals >= 4 and (owner.incarnation, lapses) == (1, [])
    finally:
        await owner.stop()


async def test_stopping_a_lease_never_taken_releases_nothing():
    store = MemoryLeases()
    await lease(store, []).stop()
    assert store.released == []


def test_the_liveness_domain_names_the_kernel_the_network_namespace_and_the_socket_directory():
    domain = liveness_domain("/tmp/ngw-x")
    assert domain.endswith(f"/net:{os.stat('/proc/self/ns/net').st_ino}/tmp/ngw-x")
    assert liveness_domain("/tmp/ngw-y") != domain
