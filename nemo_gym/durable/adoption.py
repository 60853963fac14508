"""A dead owner's session, taken over from the store by the worker its request reached, instead of 410."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.store import StoredSession, StoreUnavailable
from nemo_gym.durable.write_through import not_taken_up
from nemo_gym.routing.forwarder import RETRY_AFTER_SECONDS, Forwarder, lost_session
from nemo_gym.routing.liveness import is_alive
from nemo_gym.routing.owner import OwnerReader
from nemo_gym.routing.worker import is_worker_id


class Adopter:
    """The forwarder calls it when a request's owner is dead; it runs only on that path.

    The store says who holds the session now. Nobody (it ended, or the server keeps no durable state
    for it): 410, as without durability. A live worker that adopted it already (the request came with
    an MCP token, which still names the dead owner): the request is forwarded there. A dead worker, or
    none (a row ``gym sessions restore`` left): this worker claims the row (a compare-and-set on owner
    and revision; of several racing, one wins, and the others find the winner on their next read),
    restores the state and serves the request.
    """

    def __init__(self, app: ASGIApp, sessions: DurableSessions, owners: OwnerReader, forwarder: Forwarder) -> None:
        self.app = app
        self.sessions = sessions
        self.owners = owners
        self.forwarder = forwarder

    async def take_over(self, dead_owner: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a request whose owner died before it was sent (its body is replayed by ``receive``)."""
        session_id = await self.session_id(scope)
        while (stored := await self.stored(session_id)) is not None and stored.owner != self.sessions.owner:
            if stored.owner != dead_owner and self.is_alive(stored.owner):
                await self.forwarder.forward(stored.owner, scope, receive, send)
                return
            try:
                if await self.sessions.adopt(stored):
                    break
            except (StoreUnavailable, ValueError) as error:  # not claimed, or not loaded: the dead owner's still
                await not_taken_up(error, f"Session {session_id} of dead worker {stored.owner}")(scope, receive, send)
                return
        if stored is None:
            await lost_session(dead_owner)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def interrupted(self, dead_owner: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a request whose owner died while it had it: the session is kept if it is durable."""
        if await self.stored(await self.session_id(scope)) is None:
            await lost_session(dead_owner)(scope, receive, send)
            return
        detail = (
            f"Worker {dead_owner}, which owned this session, died while handling this request. The session's "
            "state is kept as of its last reply; whether this request took effect is unknown. Retry it."
        )
        await JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}, content={"detail": detail})(scope, receive, send)

    async def session_id(self, scope: Scope) -> str | None:
        named = await self.owners.named_session(scope)
        session_id = None if named is None else named.get(SESSION_ID_KEY)
        return session_id if isinstance(session_id, str) else None

    async def stored(self, session_id: str | None) -> StoredSession | None:
        return None if session_id is None else await self.sessions.store.read(session_id)

    def is_alive(self, worker_id: str | None) -> bool:
        return is_worker_id(worker_id) and is_alive(self.forwarder.socket_dir, worker_id)
