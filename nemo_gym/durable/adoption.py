"""The lost-session policy of durable sessions: a dead owner's session is taken over from the store, instead of 410."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.store import StoredSession, StoreUnavailable
from nemo_gym.durable.write_through import not_taken_up
from nemo_gym.routing.lost import Decision, ForwardTo, Reply, ServeHere, lost_session, retry_later
from nemo_gym.routing.worker import is_worker_id


class Adopter:
    """A ``LostSessionPolicy``: the router asks it only when a request's owner is dead.

    The store says who holds the session now. Nobody (it ended, or the server keeps no durable state
    for it): 410, as without durability. A live worker that adopted it already (the request came with
    an MCP token, which still names the dead owner): forward it there. A dead worker, or none (a row
    ``gym sessions restore`` left): this worker claims the row (a compare-and-set on owner and revision;
    of several racing, one wins, and the others find the winner on their next read), restores the
    state, and the request is served here. ``is_alive`` is the transport's.

    With owner leases (a store shared across hosts, ``durable.lease``), the kernel's word counts only for
    an owner of this worker's liveness domain (as above); an owner elsewhere is dead once its lease has
    expired (the claim checks it), and one whose lease is live holds the session still: the request is
    served here, where the write-through answers 503 with the cookie naming that owner.
    """

    def __init__(self, sessions: DurableSessions, is_alive: Callable[[str], bool]) -> None:
        self.sessions = sessions
        self.is_alive = is_alive

    async def owner_gone(self, owner: str, session: dict[str, Any]) -> Decision:
        session_id = session_id_of(session)
        try:
            while (stored := await self.stored(session_id)) is not None and stored.owner != self.sessions.owner:
                holder = None if self.sessions.lease is None or stored.owner is None else await self.sessions.holder(stored.owner)
                # Where the kernel's word counts: no leases (one host), or an owner of this worker's domain.
                local = self.sessions.lease is None or stored.owner is None or (holder is not None and holder.domain == self.sessions.lease.domain)
                alive = local and is_worker_id(stored.owner) and self.is_alive(stored.owner)
                if alive and stored.owner != owner:
                    return ForwardTo(stored.owner)
                if holder is not None and holder.live and (alive or not local):
                    return ServeHere()  # held under a live lease: the write-through answers 503 naming the holder
                if await self.sessions.adopt(stored, owner_dead=local and not alive):
                    break
        except (StoreUnavailable, ValueError) as error:  # not claimed, or not loaded: the dead owner's still
            return Reply(not_taken_up(error, f"Session {session_id} of dead worker {owner}"))
        if stored is None:
            return Reply(lost_session(owner))
        return ServeHere()

    async def owner_died(self, owner: str, session: dict[str, Any]) -> Reply:
        """The session is kept if it is durable: the caller may retry."""
        try:
            stored = await self.stored(session_id_of(session))
        except StoreUnavailable as error:
            return Reply(not_taken_up(error, f"Session of dead worker {owner}"))
        if stored is None:
            return Reply(lost_session(owner))
        return Reply(
            retry_later(
                f"Worker {owner}, which owned this session, died while handling this request. The session's "
                "state is kept as of its last reply; whether this request took effect is unknown. Retry it."
            )
        )

    async def stored(self, session_id: str | None) -> StoredSession | None:
        return None if session_id is None else await self.sessions.store.read(session_id)


def session_id_of(session: dict[str, Any]) -> str | None:
    session_id = session.get(SESSION_ID_KEY)
    return session_id if isinstance(session_id, str) else None
