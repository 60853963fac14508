"""Adoption, in one place: every way a worker takes a session up from the store, and the lost-session policy of durable sessions.

A session is taken up when its owner is dead (the router asks ``owner_gone``), when a request names a
session the store holds for no live worker (``take_up``: restored by ``gym sessions restore``, or its
owner's lease expired), and when the idle sweep ends a dead owner's forgotten row (``sweep_orphans``).
Each goes through ``adopt``, which does all that taking a session over means: the claim (a
compare-and-set on owner and revision: of several workers racing, one wins), the state and the request
ids its row remembers held in memory (``DurableSessions.hold``), the session live in the lifecycle, and
the request's cookie naming this worker (and, in a replica set, this replica) from its reply on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.applied import remembered
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.durable.store import StoredSession, StoreUnavailable
from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.durable.replies import not_taken_up, owned_elsewhere, replayed
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.metrics.meters import METERS
from nemo_gym.routing.lost import Decision, ForwardTo, Reply, ServeHere
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS
from nemo_gym.sessions.replies import lost_session, retry_later, session_gone
from nemo_gym.sessions.worker import OWNER_KEY, is_worker_id

logger = logging.getLogger(__name__)


class Adopter:
    """A ``LostSessionPolicy``, and what the write-through asks before serving a session it may not hold.

    For a dead owner (``owner_gone``) the store says who holds the session now. Nobody (it ended, or
    the server keeps no durable state for it): 410, as without durability. A live worker that adopted it
    already (the request came with an MCP token, which still names the dead owner): forward it there. A
    dead worker, or none (a row ``gym sessions restore`` left): this worker adopts it, and the request is
    served here. A tombstone (the session ended): 410 saying why, or, for the request that ended it sent
    again with its id (``request``), its stored reply. ``is_alive`` is the transport's.

    With owner leases (a store shared across hosts, ``durable.lease``), the kernel's word counts only for
    an owner of this worker's liveness domain (as above); an owner elsewhere is dead once its lease has
    expired (the claim checks it), and one whose lease is live holds the session still: 503, the cookie
    naming that owner (``owned_elsewhere``).

    ``replica``: this replica's keys in a session (``nemo_gym.routing.replica``), in a replica set.
    """

    def __init__(
        self,
        sessions: DurableSessions,
        lifecycle: SessionLifecycle,
        is_alive: Callable[[str], bool],
        replica: dict[str, str | int] | None = None,
    ) -> None:
        self.sessions = sessions
        self.lifecycle = lifecycle
        self.is_alive = is_alive
        self.replica = replica or {}
        self.orphans_looked_at = time.monotonic()

    async def adopt(self, stored: StoredSession, session: dict | None = None, owner_dead: bool = False, last_used: float | None = None) -> bool:
        """Take over a session as read from the store: claim its row, hold its state and request ids, count it
        live here (used at ``last_used``, epoch seconds; None: now), and make ``session`` (the request's, if
        one is being served) name this worker. ``owner_dead``: the kernel proved the stored owner dead (else,
        with leases, its lease must have expired). False if another worker took it first, or the owner's lease
        is live. Raises ``StoreUnavailable`` (the claim did not commit) or ``ValueError`` (the state does not
        load here); the session stays the store's then."""
        if not await self.sessions.store.claim(stored, self.sessions.owner, owner_dead):
            return False
        self.sessions.held_as_stored(stored)
        self.lifecycle.keep(stored.session_id, last_used)
        METERS.sessions_adopted.inc()
        if session is not None:
            self.name_this_worker(session)
        return True

    def name_this_worker(self, session: dict) -> None:
        """The session's cookie names this worker from this reply on (a no-op for the session the cookie names already)."""
        if session.get(OWNER_KEY) != self.sessions.owner:
            session[OWNER_KEY] = self.sessions.owner
            session.update(self.replica)

    async def owner_gone(self, owner: str, session: dict[str, Any], request: str | None = None) -> Decision:
        session_id = session_id_of(session)
        try:
            while (stored := await self.stored(session_id)) is not None and stored.owner != self.sessions.owner:
                if ended_detail(stored.state) is not None:
                    return Reply(after_the_end(stored, request))
                holder = None if self.sessions.lease is None or stored.owner is None else await self.sessions.holder(stored.owner)
                # Where the kernel's word counts: no leases (one host), or an owner of this worker's domain.
                local = self.sessions.lease is None or stored.owner is None or (holder is not None and holder.domain == self.sessions.lease.domain)
                alive = local and is_worker_id(stored.owner) and self.is_alive(stored.owner)
                if alive and stored.owner != owner:
                    return ForwardTo(stored.owner)
                if holder is not None and holder.live and (alive or not local):
                    return Reply(owned_elsewhere(session, holder))
                if await self.adopt(stored, session, owner_dead=local and not alive):
                    return ServeHere(adopted=True)
        except (StoreUnavailable, ValueError) as error:  # not claimed, or not loaded: the dead owner's still
            return Reply(not_taken_up(error, f"Session {session_id} of dead worker {owner}"))
        if stored is None:
            return Reply(lost_session(owner))
        self.name_this_worker(session)  # adopted here already: the cookie still named the dead owner
        return ServeHere()

    async def owner_died(self, owner: str, session: dict[str, Any], request: str | None = None) -> Reply:
        """The session is kept if it is durable: the caller may retry."""
        try:
            stored = await self.stored(session_id_of(session))
        except StoreUnavailable as error:
            return Reply(not_taken_up(error, f"Session of dead worker {owner}"))
        if stored is None:
            return Reply(lost_session(owner))
        if ended_detail(stored.state) is not None:
            return Reply(after_the_end(stored, request))
        return Reply(
            retry_later(
                f"Worker {owner}, which owned this session, died while handling this request. The session's "
                "state is kept as of its last reply; whether this request took effect is unknown. Retry it."
            )
        )

    async def take_up(self, session: dict, request: str | None = None) -> Response | LeaseHolder | None:
        """Before serving a request that names ``session`` (its cookie's or its token's), with the id ``request``:
        None to serve it, else the reply it gets instead (its stored reply, if its session ended with it
        already), or the lease of the worker that holds it. A session this worker does not hold is adopted if
        the store has it owned by no worker (restored by ``gym sessions restore``), or, with leases, by a worker
        whose lease has expired; for one another worker holds under a live lease, that worker's lease (the
        caller answers 503 naming it, ``owned_elsewhere``, or sends the request there). Only that miss reads
        the store, so a held session's requests read nothing. A stored state that does not load here is a 500
        on each request, never a new session."""
        session_id = session[SESSION_ID_KEY]
        try:
            while not self.sessions.holds(session_id) and (stored := await self.sessions.store.read(session_id)) is not None:
                if ended_detail(stored.state) is not None:
                    applied = None if request is None else remembered(stored.state, request)
                    return None if applied is None else replayed(applied)  # else the lifecycle answers for it
                if stored.owner not in (None, self.sessions.owner):
                    if self.sessions.lease is None:
                        return None
                    holder = await self.sessions.holder(stored.owner)
                    if holder is not None and holder.live:
                        return holder
                await self.adopt(stored, session)
        except (StoreUnavailable, ValueError) as error:  # not claimed, or not loaded: it stays in the store
            return not_taken_up(error, f"Session {session_id}, restored into the store")
        if self.sessions.holds(session_id):
            self.name_this_worker(session)
        return None

    async def sweep_orphans(self, limit: float, reason: EndReason) -> None:
        """End the stored sessions of dead owners last used more than ``limit`` seconds ago, adopting each
        first so that its hook runs here (at most once per ``limit``: one query of the store each time)."""
        if time.monotonic() - self.orphans_looked_at < limit:
            return
        self.orphans_looked_at = time.monotonic()
        for row in await self.sessions.store.unused_since(time.time() - limit):
            dead = is_worker_id(row.owner) and row.owner != self.sessions.owner and not self.is_alive(row.owner)
            if not dead or ended_detail(row.state) is not None:
                continue
            try:
                adopted = await self.adopt(row, last_used=row.expires_at - SESSION_MAX_AGE_SECONDS)
            except (StoreUnavailable, ValueError) as error:
                logger.warning("the idle session %s of dead worker %s could not be taken over to end it: %s", row.session_id, row.owner, error)
                continue
            if adopted:
                await self.lifecycle.end(row.session_id, reason)

    async def stored(self, session_id: str | None) -> StoredSession | None:
        return None if session_id is None else await self.sessions.store.read(session_id)


def after_the_end(tombstone: StoredSession, request: str | None) -> Response:
    """For a request of an ended session: its stored reply, if it is the one that ended it (a verify sent
    again), else 410 saying how the session ended."""
    applied = None if request is None else remembered(tombstone.state, request)
    return session_gone(ended_detail(tombstone.state)) if applied is None else replayed(applied)


def session_id_of(session: dict[str, Any]) -> str | None:
    session_id = session.get(SESSION_ID_KEY)
    return session_id if isinstance(session_id, str) else None
