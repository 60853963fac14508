"""The one way a session ends, whatever ends it, and the sweeper that ends the idle ones.

``SessionLifecycle.end`` ends a live session once: it leaves the live set (a tombstone in its place,
``registry``), stops counting toward the caps (``cap``) and as live in the metrics (``nemo_gym.metrics``:
ended by reason), the server's hook ``on_session_end(session_id, reason)`` runs (awaited; an error in it
is logged, and the session is ended all the same), then the framework drops the session's durable state,
and its row becomes a tombstone, written at once (close, idle, expiry; one the store refused is written
again by each sweep until it is) or, for a verify, with its reply (which the tombstone remembers by its
request id): that commit comes first, and the hook runs once it is done, so that a verify refused
unwritten ends nothing (``end``'s ``by_its_request``). A second end of the same session does nothing.

The sweeper runs in each worker, every quarter of ``session_idle_timeout_seconds`` (at most a minute): a
live session with no request for that long, and none being served, ends as idle. The clock is the owner's,
and the owner sees every request of its sessions (the router forwards them all to it); with the timeout
off (0 or null), a session ends as expired after the cookie's max age without a request.
A worker that stops ends the sessions only its memory holds, as ``stop``; durable ones wait in the store.
A round due after the worker was paused (a sleep that overran by more than a round) is skipped: the
requests that waited on the paused worker are read first, so none of their sessions ends as idle.

A durable session whose owner died and that no request has reached since sits in the store with no live
worker to time it: once per timeout each worker asks the store for the rows whose last write (their last
use, ``DurableSessions``) is older than the timeout (``SessionStore.unused_since``, one query, awaited) and,
of those whose owner is dead, adopts each (``Adopter.sweep_orphans``, given to ``open``: one compare-and-set,
of the workers racing, one wins) and ends it as idle, so its hook runs (swe_rebench's re-attached sandbox goes). A row restored by
``gym sessions restore`` (no owner) waits for its first request instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.store import SessionTaken, StoreUnavailable
from nemo_gym.lifecycle.cap import Cap, LiveCount
from nemo_gym.lifecycle.registry import EndReason, SessionRegistry
from nemo_gym.lifecycle.replies import end_detail
from nemo_gym.metrics.meters import METERS
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS

logger = logging.getLogger(__name__)

# The sweeper looks at most this seldom, and at least this often (so a short timeout in a test is kept to).
MAX_SWEEP_SECONDS = 60.0
MIN_SWEEP_SECONDS = 0.05

Hook = Callable[[str, EndReason], Awaitable[None]]
# Ends the stored sessions of dead owners idle past a limit (seconds), with a reason.
Orphans = Callable[[float, EndReason], Awaitable[None]]


class SessionLifecycle:
    def __init__(
        self,
        hook: Hook,
        idle_timeout: float | None,
        count: LiveCount,
        caps: list[Cap],
        durable: DurableSessions | None = None,
        worker_id: str | None = None,
    ) -> None:
        """``idle_timeout``: seconds without a request that end a session (None or 0: never; the cookie's max age then)."""
        self.hook = hook
        self.idle_timeout = idle_timeout or None
        self.count = count
        self.caps = caps
        self.durable = durable
        self.worker_id = worker_id
        self.registry = SessionRegistry()
        # Durable sessions ending with the request being served, until its commit settles: id -> (reason, detail).
        self.ending_with_request: dict[str, tuple[EndReason, str]] = {}
        self.sweeper: asyncio.Task | None = None
        self.orphans: Orphans | None = None
        if durable is not None:
            durable.on_taken = self.taken

    @property
    def sweep_seconds(self) -> float:
        return min(max((self.idle_timeout or SESSION_MAX_AGE_SECONDS) / 4, MIN_SWEEP_SECONDS), MAX_SWEEP_SECONDS)

    def admit(self, session_id: str) -> Cap | None:
        """Start a new session, live from now, unless a cap is reached: None if started, else that cap."""
        if self.caps:
            refused = self.count.admit(self.caps)
            if refused is not None:
                return refused
        else:
            self.count.add(1)
        self.registry.start(session_id)
        METERS.sessions_started.inc()
        METERS.live_sessions.inc()
        return None

    def keep(self, session_id: str, last_used: float | None = None) -> None:
        """Count a session that exists already (adopted from another worker, or taken up from the store) as live
        here, last used at ``last_used`` (epoch seconds; None: now). A session live here already stays as it is."""
        if self.registry.is_live(session_id):
            return
        self.count.add(1)
        self.registry.start(session_id, last_used)
        METERS.live_sessions.inc()

    async def end(self, session_id: str, reason: EndReason, by_its_request: bool = False) -> bool:
        """End the session if it is live (True): the hook, then its durable state dropped and its tombstone committed.
        Shielded: a request cancelled meanwhile (its caller gone) leaves the end to finish.

        ``by_its_request``: the request being served ends it (a verify). A durable session's end then waits on
        that request's commit, which writes the tombstone with its reply: ``settle`` finishes it once the
        commit is done (or may be), ``revive`` takes it back if the request is refused unwritten, so that
        a 503 saying the request did not take effect is true of the end too (no hook ran, nothing was dropped)."""
        now = time.time()
        idle_for = now - self.registry.last_used.get(session_id, now)
        detail = end_detail(session_id, reason, idle_for, self.idle_timeout, self.worker_id)
        if not self.registry.end(session_id, detail):
            return False
        if by_its_request and self.durable is not None:
            self.durable.end_with_request(session_id, detail)
            self.ending_with_request[session_id] = (reason, detail)
            return True
        await self.conclude(session_id, reason, detail)
        return True

    async def conclude(self, session_id: str, reason: EndReason, detail: str) -> None:
        """The end counted (caps, metrics), then its hook and its durable part (``finish``)."""
        self.count.add(-1)
        METERS.session_ended(reason)
        await asyncio.shield(asyncio.ensure_future(self.finish(session_id, reason, detail)))

    async def settle(self, session_ids: list[str]) -> None:
        """The commit of the request ending these sessions is done, or may be: their ends finish (hook, state dropped)."""
        for session_id in session_ids:
            if (pending := self.ending_with_request.pop(session_id, None)) is not None:
                await self.conclude(session_id, *pending)

    def revive(self, session_ids: list[str]) -> list[str]:
        """The request ending these sessions was refused unwritten: each goes on, live, as the store holds it.
        Returns the ones it revived."""
        revived = []
        for session_id in session_ids:
            if self.ending_with_request.pop(session_id, None) is not None:
                self.durable.resume(session_id)
                self.registry.start(session_id)
                revived.append(session_id)
        return revived

    async def finish(self, session_id: str, reason: EndReason, detail: str) -> None:
        try:
            await self.hook(session_id, reason)
        except Exception:
            logger.exception("on_session_end(%r, %r) raised; the session is ended all the same", session_id, str(reason))
        if self.durable is None:
            return
        if reason is EndReason.CONFLICT:
            self.durable.end(session_id)  # the row is the other worker's
            return
        self.durable.end(session_id, detail)
        if self.registry.busy.get(session_id):
            return  # ended by a request of its own (verify): its write-through writes the tombstone with that request's reply
        try:
            await self.durable.save([session_id])
        except Exception as error:  # the tombstone waits for the next sweep
            logger.error("session %s ended (%s) but its tombstone could not be written: %r", session_id, reason, error)

    def taken(self, session_id: str) -> None:
        """A commit found the session owned by another worker in the store: this worker's copy ends."""
        if self.registry.is_live(session_id):
            asyncio.get_running_loop().create_task(self.end(session_id, EndReason.CONFLICT))

    async def sweep(self) -> None:
        """End the sessions idle past the timeout (or, with none, past the cookie's max age)."""
        limit = self.idle_timeout or SESSION_MAX_AGE_SECONDS
        reason = EndReason.IDLE if self.idle_timeout else EndReason.EXPIRED
        for session_id in self.registry.idle(time.time() - limit):
            await self.end(session_id, reason)
        if self.durable is not None and self.durable.ending:
            await self.write_tombstones()
        if self.orphans is not None:
            await self.orphans(limit, reason)

    async def write_tombstones(self) -> None:
        """The tombstones a commit refused (a full disk, the store down), written again: until one is, the row
        holds the ended session's state, which an adopter would bring back were this worker to die."""
        try:
            await self.durable.save(list(self.durable.ending))
        except SessionTaken:
            pass  # another worker owns such a row now: the tombstone is not this worker's to write
        except StoreUnavailable as error:
            logger.warning("%d tombstones still wait to be written: %s", len(self.durable.ending), error)

    async def sweep_forever(self) -> None:
        while True:
            slept_from = time.monotonic()
            await asyncio.sleep(self.sweep_seconds)
            if time.monotonic() - slept_from > 2 * self.sweep_seconds:
                # The worker was paused (SIGSTOP, a long stall): the requests that queued up meanwhile are read
                # first, each a use of its session, so that no session is ended for the worker's own silence.
                continue
            try:
                await self.sweep()
            except Exception:
                logger.exception("the idle sweep failed; it runs again in %g s", self.sweep_seconds)

    def open(self, orphans: Orphans | None = None) -> None:
        """Start the sweeper; each round also runs ``orphans`` (durable sessions: ``Adopter.sweep_orphans``)."""
        self.orphans = orphans
        self.count.open()
        self.sweeper = asyncio.get_running_loop().create_task(self.sweep_forever())

    async def close(self) -> None:
        """The worker stops: the sweeper ends, and so do the sessions only its memory holds (as ``stop``,
        through the hook); durable sessions stay in the store for the next start."""
        if self.sweeper is not None:
            self.sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.sweeper
            self.sweeper = None
        if self.durable is None:
            for session_id in list(self.registry.last_used):
                await self.end(session_id, EndReason.STOP)
        self.count.close()
