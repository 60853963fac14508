"""The middleware that writes each session's changed state to the store before its reply starts."""

from __future__ import annotations

from itsdangerous import URLSafeSerializer
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.applied import KEPT_BODY_BYTES, Applied, kept_headers
from nemo_gym.durable.replies import in_flight, lease_not_renewed, owned_elsewhere, replayed, store_unavailable
from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.durable.store import SessionTaken, StoreUnavailable
from nemo_gym.sessions.replies import retry_later
from nemo_gym.routing.request_id import ID_HEADER_NAME, MAX_ID_LENGTH, request_id, valid_id
from nemo_gym.routing.to_holder import HOLDER_SCOPE_KEY
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY
from nemo_gym.sessions.token import is_mcp_path, token_session_id


# ``GET /``: whether this worker serves, whatever the store is doing (docs/durable-sessions.md "PostgreSQL hung").
LIVENESS_PATH = "/"


class WriteThrough:
    """Sits inside SessionIdMiddleware, so the session id is known.

    A request's sessions are its cookie's and, on ``/mcp``, its token's (a tool call runs with that
    one). When the reply starts, each is written if its state changed, and committed (with the writes
    of other requests finishing meanwhile), before the caller can see the reply: nothing acknowledged
    is lost with the worker (a session that ended, ``nemo_gym.lifecycle``, is written as its tombstone).
    First, the adopter (``durable.adoption``) takes up a session this worker does not hold if the store
    holds it for no live worker, and makes the cookie name this worker.

    A write the store cannot commit (``StoreUnavailable``) replaces the app's reply with a 503 and
    Retry-After, sent through the session layer, so it carries the session's cookie; the sessions are
    back to their stored state (``DurableSessions``), so nothing unstored is acknowledged. The same holds
    for a session the request ended (a verify): its end is finished (``SessionLifecycle.settle``) once
    the commit is done, before the reply starts, and taken back (``revive``) when the request is refused
    unwritten (not when the store's answer is unknown: that end stands, its tombstone written by the sweeps).

    With owner leases (a store shared across hosts, ``durable.lease``): a request waits for the lease to
    be valid first (503 if it cannot be renewed); a session another worker owns under a live lease gets
    503 with the cookie naming that worker (``owned_elsewhere``; one an MCP token names, which its client never gets
    again, is sent on to that worker instead, ``routing.to_holder``); so does a write the store refuses
    because another worker owns the row now (this worker's copy is dropped), and a request under way
    while the lease lapsed is refused unwritten (the lapse dropped what it served from).
    """

    def __init__(self, app: ASGIApp, adopter: Adopter, tokens: URLSafeSerializer) -> None:
        """``adopter``: this worker's, which takes up a session the store holds for no live worker first."""
        self.app = app
        self.adopter = adopter
        self.sessions = adopter.sessions
        self.lifecycle = adopter.lifecycle
        self.tokens = tokens
        # The requests being served now, by session and request id: a repeat meanwhile waits its turn (409).
        self.serving: set[tuple[str, str]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == LIVENESS_PATH:
            # A balancer's health check is answered by the worker alone, never waiting on the store.
            await self.app(scope, receive, send)
            return
        written_id = request_id(scope["headers"])
        if written_id is not None and not valid_id(written_id):
            detail = f"An {ID_HEADER_NAME} header must be 1 to {MAX_ID_LENGTH} printable ASCII characters, without spaces."
            await JSONResponse(status_code=400, content={"detail": detail})(scope, receive, send)
            return
        session = scope["session"]
        session_id = session[SESSION_ID_KEY]
        try:
            await self.sessions.ensure_lease()
        except StoreUnavailable:
            await lease_not_renewed()(scope, receive, send)
            return
        epoch = self.sessions.epoch
        request = None if written_id is None else written_id.decode()
        token_session = token_session_id(scope, self.tokens) if is_mcp_path(scope["path"]) else None
        # Each session the request names is taken up first if this worker does not hold it (the token's too: a tool call runs with it).
        instead = None if NEW_SESSION_SCOPE_KEY in scope else await self.adopter.take_up(session, request)
        if isinstance(instead, LeaseHolder):
            instead = owned_elsewhere(session, instead)  # the cookie names the holder, where the client's retry goes
        if instead is None and token_session not in (None, session_id):
            instead = await self.adopter.take_up({SESSION_ID_KEY: token_session}, request)
            if isinstance(instead, LeaseHolder):
                if HOLDER_SCOPE_KEY in scope:
                    scope[HOLDER_SCOPE_KEY] = (instead, receive)  # a token is never issued again: the request goes to the holder (``to_holder``)
                    return
                instead = owned_elsewhere({}, instead)
        if instead is not None:
            await instead(scope, receive, send)
            return
        if request is None:
            await self.app(scope, receive, self.writing(scope, receive, send, session, session_id, token_session, epoch, None))
            return
        # First: a request still being served may have its id in memory already, gathered for a commit that can still fail.
        if (session_id, request) in self.serving:
            await in_flight(request)(scope, receive, send)
            return
        for named in (session_id, token_session):
            if named is not None and (applied := self.sessions.reply(named, request)) is not None:
                await replayed(applied)(scope, receive, send)
                return
        self.serving.add((session_id, request))
        try:
            await self.app(scope, receive, self.writing(scope, receive, send, session, session_id, token_session, epoch, request))
        finally:
            self.serving.discard((session_id, request))

    def writing(self, scope: Scope, receive: Receive, send: Send, session: dict, session_id: str, token_session: str | None, epoch: int, request: str | None) -> Send:
        """The app's ``send``: before the reply goes out, its sessions' changed states are committed. With a
        request id, the reply is held until its body is whole (or over ``KEPT_BODY_BYTES``), so that it is
        committed with the states it answers."""
        refused = False
        start: Message | None = None
        body: list[bytes] = []
        size = 0

        async def committed(reply: Applied | None) -> bool:
            """Whether the request's changes are stored; if not, its refusal is sent in place of the reply."""
            nonlocal refused
            # Read again: the lifecycle gives a seed of an ended session a new id (the MCP endpoint clears a new session).
            current = session.get(SESSION_ID_KEY, session_id)
            touched = [current] if token_session is None else [current, token_session]
            if self.sessions.epoch != epoch:
                refused = True
                self.lifecycle.revive(touched)
                self.sessions.revert(touched)
                await (await self.moved(session, session_id))(scope, receive, send)
                return False
            try:
                await self.sessions.save(touched, reply)
            except StoreUnavailable as error:
                refused = True
                if not error.may_have_applied:
                    self.lifecycle.revive(touched)
                await store_unavailable(error)(scope, receive, send)
                return False
            except SessionTaken:
                if self.sessions.lease is None:
                    raise
                refused = True
                for touched_id in touched:
                    self.sessions.drop(touched_id)
                for revived in self.lifecycle.revive(touched):
                    self.lifecycle.taken(revived)  # ends here as a conflict: the session is the new owner's
                await (await self.moved(session, session_id))(scope, receive, send)
                return False
            if self.lifecycle.ending_with_request:
                await self.lifecycle.settle(touched)  # an end this request made finishes before its reply starts
            return True

        async def send_after_writing(message: Message) -> None:
            nonlocal start, size
            if refused:
                return  # the app's reply, in place of which the 503 went
            if request is None:
                if message["type"] == "http.response.start" and not await committed(None):
                    return
                await send(message)
                return
            if message["type"] == "http.response.start":
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            size += len(body[-1])
            more = message.get("more_body", False)
            if more and size <= KEPT_BODY_BYTES:
                return
            whole = None if more or size > KEPT_BODY_BYTES else b"".join(body)
            if not await committed(Applied(request, start["status"], kept_headers(start.get("headers", [])), whole)):
                return
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(body), "more_body": more})
            start = None

        return send_after_writing

    async def moved(self, session: dict, session_id: str) -> JSONResponse:
        """The reply for a request this worker may not acknowledge (its lease lapsed, or the store's row is
        another worker's): 503 naming the session's owner in the store now, if it holds a live lease."""
        try:
            stored = await self.sessions.store.read(session_id)
            holder = None if stored is None or stored.owner in (None, self.sessions.owner) else await self.sessions.holder(stored.owner)
        except StoreUnavailable as error:
            return store_unavailable(error)
        if holder is not None and holder.live:
            return owned_elsewhere(session, holder)
        return retry_later(
            f"This worker's owner lease of session {session_id} lapsed while it served this request, so the request "
            "did not take effect; the session is as the store holds it. Retry it."
        )
