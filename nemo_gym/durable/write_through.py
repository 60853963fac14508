"""The middleware that writes each session's changed state to the store before its reply starts."""

from __future__ import annotations

from itsdangerous import URLSafeSerializer
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.applied import KEPT_BODY_BYTES, Applied, kept_headers
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.lease import LeaseHolder
from nemo_gym.durable.store import SessionTaken, StoreUnavailable
from nemo_gym.routing.lost import RETRY_AFTER_SECONDS, retry_later
from nemo_gym.routing.replica import FORWARD_PORT_KEY, REPLICA_KEY
from nemo_gym.routing.request_id import ID_HEADER_NAME, MAX_ID_LENGTH, request_id, valid_id
from nemo_gym.routing.worker import OWNER_KEY
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY
from nemo_gym.sessions.token import is_mcp_path, token_session_id


# On a reply sent again for a request applied already (as Stripe's API names it).
REPLAYED_HEADER = "Idempotent-Replayed"
# ``GET /``: whether this worker serves, whatever the store is doing (docs/durable-sessions.md "PostgreSQL hung").
LIVENESS_PATH = "/"


def store_unavailable(error: StoreUnavailable) -> JSONResponse:
    """503, saying only that the store is unavailable (where it is and what its driver said go to this
    worker's log: the store reports them, never to a client), and whether the change may have taken
    effect all the same: it did not if the store refused it or was never reached; it may have if the
    store did not answer in time."""
    if error.may_have_applied:
        outcome = ("the session store did not answer in time, so whether it took effect is unknown: it may be applied "
                   "when the store answers again. The session is served as of its last successful reply meanwhile")
    else:
        outcome = "the session store is unavailable, so it did not take effect: the session is as of its last successful reply"
    return JSONResponse(
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        content={"detail": f"This request changed the session, and the change could not be stored: {outcome}. Retry later."},
    )


def replayed(applied: Applied) -> Response:
    """The reply of a request its session applied already, sent again in place of running it a second time."""
    if applied.body is None:
        detail = f"This request ({ID_HEADER_NAME} {applied.request_id}) was applied already; its reply was too large to keep."
        return JSONResponse(status_code=applied.status, content={"detail": detail}, headers={REPLAYED_HEADER: "true"})
    headers = {name: value for name, value in applied.headers if name.lower() != "content-type"}
    media_type = next((value for name, value in applied.headers if name.lower() == "content-type"), None)
    return Response(applied.body, status_code=applied.status, headers={**headers, REPLAYED_HEADER: "true"}, media_type=media_type)


def in_flight(request: str) -> JSONResponse:
    detail = f"A request with {ID_HEADER_NAME} {request} is being served now; retry it once that one is answered."
    return JSONResponse(status_code=409, content={"detail": detail}, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def lease_not_renewed() -> JSONResponse:
    return retry_later(
        "This worker's owner lease could not be renewed (the session store is unavailable or did not answer in time), "
        "so it serves none of its sessions until it is: this request was not run. Retry it."
    )


def not_taken_up(error: StoreUnavailable | ValueError, session: str) -> JSONResponse:
    """The reply for a stored session this worker could not take over: its claim could not commit (503,
    retry), or its state does not load here (500, naming ``session``)."""
    if isinstance(error, StoreUnavailable):
        return store_unavailable(error)
    return JSONResponse(status_code=500, content={"detail": f"{session}: its stored state does not load here: {error}"})


def owned_elsewhere(session: dict, holder: LeaseHolder) -> JSONResponse:
    """The reply for a session another worker owns under a live lease: 503, and (sent through the session
    layer) the session's cookie naming that worker and its replica, where the retry goes."""
    for key in (REPLICA_KEY, FORWARD_PORT_KEY):
        session.pop(key, None)
    session.update({**holder.keys, OWNER_KEY: holder.worker})
    return retry_later(
        f"This session's owner in the store is worker {holder.worker} now (it took the session over while this "
        "worker's owner lease had expired); this request did not take effect here. Retry it: the cookie names that worker."
    )


class WriteThrough:
    """Sits inside SessionIdMiddleware, so the session id is known.

    A request's sessions are its cookie's and, on ``/mcp``, its token's (a tool call runs with that
    one). When the reply starts, each is written if its state changed, and committed (with the writes
    of other requests finishing meanwhile), before the caller can see the reply: nothing acknowledged
    is lost with the worker (a session that ended, ``nemo_gym.lifecycle``, is written as its tombstone). A cookie
    that names another owner for a session this worker holds (it adopted the session from a dead one)
    is stamped with this worker (and, in a replica set, this replica), so the reply's Set-Cookie names it. A session it does not hold is
    taken up from the store first if it was restored there and no worker has it yet.

    A write the store cannot commit (``StoreUnavailable``) replaces the app's reply with a 503 and
    Retry-After, sent through the session layer, so it carries the session's cookie; the sessions are
    back to their stored state (``DurableSessions``), so nothing unstored is acknowledged.

    With owner leases (a store shared across hosts, ``durable.lease``): a request waits for the lease to
    be valid first (503 if it cannot be renewed); a session another worker owns under a live lease gets
    503 with the cookie naming that worker (``owned_elsewhere``); so does a write the store refuses
    because another worker owns the row now (this worker's copy is dropped), and a request under way
    while the lease lapsed is refused unwritten (the lapse dropped what it served from).
    """

    def __init__(self, app: ASGIApp, sessions: DurableSessions, tokens: URLSafeSerializer, replica: dict[str, str | int] | None = None) -> None:
        """``replica``: this replica's keys in a session (``nemo_gym.routing.replica``), in a replica set."""
        self.app = app
        self.replica = replica or {}
        self.sessions = sessions
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
        if not self.sessions.holds(session_id) and NEW_SESSION_SCOPE_KEY not in scope:
            try:
                holder = await self.sessions.take_up(session_id)
            except (StoreUnavailable, ValueError) as error:  # not claimed, or not loaded: it stays in the store
                await not_taken_up(error, f"Session {session_id}, restored into the store")(scope, receive, send)
                return
            if holder is not None:
                await owned_elsewhere(session, holder)(scope, receive, send)
                return
        if session.get(OWNER_KEY) != self.sessions.owner and self.sessions.holds(session_id):
            session[OWNER_KEY] = self.sessions.owner
            session.update(self.replica)  # taken up from another replica's worker: the cookie names this replica now
        token_session = token_session_id(scope, self.tokens) if is_mcp_path(scope["path"]) else None
        if written_id is None:
            await self.app(scope, receive, self.writing(scope, receive, send, session, session_id, token_session, epoch, None))
            return
        request = written_id.decode()
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
                self.sessions.revert(touched)
                await (await self.moved(session, session_id))(scope, receive, send)
                return False
            try:
                await self.sessions.save(touched, reply)
            except StoreUnavailable as error:
                refused = True
                await store_unavailable(error)(scope, receive, send)
                return False
            except SessionTaken:
                if self.sessions.lease is None:
                    raise
                refused = True
                for touched_id in touched:
                    self.sessions.drop(touched_id)
                await (await self.moved(session, session_id))(scope, receive, send)
                return False
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
