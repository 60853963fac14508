"""Owner leases: how a worker proves, to workers on any host, that it still owns its sessions.

With a store that workers on several hosts share (``postgresql_store``), a free ``flock`` or abstract
socket name proves a worker dead only to the workers of its own kernel and network namespace (its
``domain``). Everywhere else, a worker's ownership lasts as long as its lease: a row of the store (the
worker, an incarnation, its domain, the replica keys its cookies carry, an expiry by the store's clock)
that the worker renews every ``owner_lease_seconds / 3`` (setting ``owner_lease_seconds``, default 10).
A session whose owner's lease has expired may be claimed by any worker of any replica (the store's
compare-and-set on owner and revision, after it has locked the owner's lease row: a claim and a renewal
at once take turns, and the later sees the earlier's outcome); one whose owner is of this domain may be claimed as soon as the kernel says
the owner is dead, as on one host.

Fencing. Three rules keep one owner acknowledging writes to a session, even for a worker frozen (SIGSTOP,
a long pause, a partition) past its lease, whose sessions were meanwhile adopted:

1. A worker serves a session it holds only while its lease is valid by its own clock: ``valid_until``
   is when it sent its last successful renewal plus 0.9 of the lease, never later than the store's
   expiry, which the store set from the moment it got the renewal. Past it (a frozen worker wakes with
   its monotonic clock advanced), the request waits for a renewal first (``ensure``).
2. A renewal extends the lease only if it has not expired, in the store's clock; otherwise the worker
   gets a new incarnation and has lapsed (``on_lapse``): it drops from memory every session whose row
   no longer names it (another worker claimed it: its next request answers 503 with the cookie naming
   that worker); a row that still names it was never claimed (only its owner sets a row's owner to
   itself, and a claim restores memory from the row), so what it holds of that session is the latest.
   Requests under way across the lapse, and commits gathered before it, are refused (503) unwritten,
   and what they changed in memory is undone.
3. A commit writes a row only if the worker still owns it (so an adopter's claim makes the old owner's
   writes fail) and only while the lease of the incarnation it renewed last is unexpired (so a worker
   that lapsed writes nothing until it has renewed and dropped what others claimed); a group of
   writes gathered before a lapse is refused by the keeper itself (its epoch is past).

Why never two owners: a claim by another worker succeeds only if the owner's lease has expired at the
claim, in the store's clock. Leases only move forward, and a renewal checks the expiry only once it
holds the lease row's lock, after any claim that locked the row first (and a claim after a renewal
sees the renewed expiry), so a lease that expired at any moment before a renewal makes that renewal
lapse (rule 2). Before the lapse, the old owner's valid_until had passed (rule 1), so it served nothing
from memory after the expiry; its writes meanwhile fail on its expired lease or on the row's new owner
(rule 3). After the lapse it holds nothing the adopter holds. A read answered from memory before the expiry was true when it was made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from nemo_gym.durable.store import StoreUnavailable

logger = logging.getLogger(__name__)

# The default of the ``owner_lease_seconds`` setting.
OWNER_LEASE_SECONDS = 10.0
# Renewed every lease / RENEWALS_PER_LEASE, counted from each renewal's start: a renewal may fail (the store
# slow, or down for a moment) twice before the lease runs out.
RENEWALS_PER_LEASE = 3
# The share of the lease a worker counts as valid after sending a renewal (rule 1): below 1 for drift.
VALID_SHARE = 0.9
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class LeaseHolder:
    """A worker's lease as the store holds it: ``live`` is whether it is unexpired now, by the store's clock."""

    worker: str
    domain: str
    keys: dict
    live: bool


@runtime_checkable
class LeaseStore(Protocol):
    """A store shared across hosts: it keeps owner leases, and fences commits by the worker's lease."""

    async def renew_lease(self, worker: str, incarnation: int | None, domain: str, keys: dict, seconds: float) -> int:
        """Extend the lease of ``incarnation`` if it is unexpired, else take a new one: the incarnation held now."""

    async def lease_of(self, worker: str) -> LeaseHolder | None:
        """The worker's lease, or None (it never held one, or let it go)."""

    async def owned(self, worker: str) -> set[str]:
        """The sessions whose rows name ``worker`` as their owner now."""

    async def release_lease(self, worker: str, incarnation: int) -> None:
        """Let the lease go: the worker's sessions may be claimed at once."""


def liveness_domain(socket_dir: str) -> str:
    """Where the kernel proves this worker dead to others: its kernel (boot id), network namespace (abstract
    socket names are per namespace) and socket directory; a worker of another domain needs its lease."""
    boot = BOOT_ID.read_text().strip() if BOOT_ID.exists() else "unknown-boot"
    return f"{boot}/net:{os.stat('/proc/self/ns/net').st_ino}{socket_dir}"


@dataclass(frozen=True)
class LeaseTerms:
    """What a worker's owner lease is taken with (``OwnerLease``): its liveness domain, the keys its
    sessions carry besides the worker (its replica's), and how long a renewal lasts."""

    domain: str
    keys: dict
    seconds: float


class OwnerLease:
    """One worker's lease: renewed in the background (``keep``), checked before serving (``ensure``)."""

    def __init__(self, store: LeaseStore, worker: str, domain: str, keys: dict, seconds: float, on_lapse: Callable[[], Awaitable[None]]) -> None:
        self.store = store
        self.worker = worker
        self.domain = domain
        self.keys = keys
        self.seconds = seconds
        self.on_lapse = on_lapse
        self.incarnation: int | None = None
        self.valid_until = -math.inf
        self.renewing: asyncio.Task | None = None
        self.keeper: asyncio.Task | None = None

    def valid(self) -> bool:
        return asyncio.get_running_loop().time() < self.valid_until

    async def ensure(self) -> None:
        """Return once the lease is valid (renewing it first if need be); raises ``StoreUnavailable``."""
        if not self.valid():
            await self.renew()

    async def renew(self) -> None:
        """One renewal at a time: callers meanwhile wait for the one under way."""
        if self.renewing is None:
            self.renewing = asyncio.create_task(self.renew_once())
            self.renewing.add_done_callback(self.renewed)
        await asyncio.shield(self.renewing)

    def renewed(self, task: asyncio.Task) -> None:
        if self.renewing is task:
            self.renewing = None
        if not task.cancelled():
            task.exception()  # retrieved: the callers waiting on it get it

    async def renew_once(self) -> None:
        sent = asyncio.get_running_loop().time()
        held = await self.store.renew_lease(self.worker, self.incarnation, self.domain, self.keys, self.seconds)
        if held != self.incarnation:
            lapsed = self.incarnation is not None
            self.incarnation = held
            if lapsed:
                logger.warning("worker %s: its owner lease had expired; it keeps only the sessions whose rows still name it", self.worker)
                await self.on_lapse()
        self.valid_until = sent + VALID_SHARE * self.seconds

    async def keep(self) -> None:
        """Renew every third of the lease, counted from when the last renewal began: one the store did not answer
        in time (up to ``store_timeout_seconds``, most of a short lease) is followed by the next at once, while
        the lease may still run, not a third of a lease later."""
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            with contextlib.suppress(StoreUnavailable):  # the store reports it; the lease may still run
                await self.renew()
            await asyncio.sleep(max(0.0, began + self.seconds / RENEWALS_PER_LEASE - loop.time()))

    async def start(self) -> None:
        """Take the lease (a store down now is tried again by ``keep``), and keep renewing it."""
        with contextlib.suppress(StoreUnavailable):
            await self.renew()
        self.keeper = asyncio.create_task(self.keep())

    async def stop(self) -> None:
        """Stop renewing, and let the lease go, so other hosts may adopt this worker's sessions at once."""
        if self.keeper is not None:
            self.keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.keeper
        if self.incarnation is not None:
            with contextlib.suppress(StoreUnavailable):
                await self.store.release_lease(self.worker, self.incarnation)
