"""The middleware that writes each session's changed state to the store before its reply starts."""

from __future__ import annotations

from itsdangerous import URLSafeSerializer
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.store import StoreUnavailable
from nemo_gym.metrics.meters import session_ended
from nemo_gym.routing.lost import RETRY_AFTER_SECONDS
from nemo_gym.routing.worker import OWNER_KEY
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY
from nemo_gym.sessions.token import TOKEN_HEADER_KEY, is_mcp_path, read_token


def store_unavailable(error: StoreUnavailable) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        content={
            "detail": f"This request changed the session, and the change could not be stored ({error}), so it did not "
            "take effect: the session is as of its last successful reply. Retry later."
        },
    )


def not_taken_up(error: StoreUnavailable | ValueError, session: str) -> JSONResponse:
    """The reply for a stored session this worker could not take over: its claim could not commit (503,
    retry), or its state does not load here (500, naming ``session``)."""
    if isinstance(error, StoreUnavailable):
        return store_unavailable(error)
    return JSONResponse(status_code=500, content={"detail": f"{session}: its stored state does not load here: {error}"})


class WriteThrough:
    """Sits inside SessionIdMiddleware, so the session id is known.

    A request's sessions are its cookie's and, on ``/mcp``, its token's (a tool call runs with that
    one). When the reply starts, each is written if its state changed, and committed (with the writes
    of other requests finishing meanwhile), before the caller can see the reply: nothing acknowledged
    is lost with the worker. A 2xx reply on one of ``end_paths`` ends the cookie's session (counted as
    ended for the path's name, ``verify``: ``nemo_gym.metrics``). A cookie that names another owner for
    a session this worker holds (it adopted the session from a dead one) is stamped with this worker, so
    the reply's Set-Cookie names it. A session it does not hold is
    taken up from the store first if it was restored there and no worker has it yet.

    A write the store cannot commit (``StoreUnavailable``) replaces the app's reply with a 503 and
    Retry-After, sent through the session layer, so it carries the session's cookie; the sessions are
    back to their stored state (``DurableSessions``), so nothing unstored is acknowledged.
    """

    def __init__(self, app: ASGIApp, sessions: DurableSessions, end_paths: frozenset[str], tokens: URLSafeSerializer) -> None:
        self.app = app
        self.sessions = sessions
        self.end_paths = end_paths
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = scope["session"]
        session_id = session[SESSION_ID_KEY]
        if not self.sessions.holds(session_id) and NEW_SESSION_SCOPE_KEY not in scope:
            try:
                await self.sessions.take_up(session_id)
            except (StoreUnavailable, ValueError) as error:  # not claimed, or not loaded: it stays in the store
                await not_taken_up(error, f"Session {session_id}, restored into the store")(scope, receive, send)
                return
        if session.get(OWNER_KEY) != self.sessions.owner and self.sessions.holds(session_id):
            session[OWNER_KEY] = self.sessions.owner
        touched = [session_id, *self.token_session(scope)]
        ends = scope["path"] in self.end_paths

        refused = False

        async def send_after_writing(message: Message) -> None:
            nonlocal refused
            if refused:
                return  # the app's reply, in place of which the 503 went
            if message["type"] == "http.response.start":
                if ends and 200 <= message["status"] < 300:
                    self.sessions.end(session_id)
                    session_ended(scope["path"].lstrip("/"))
                try:
                    await self.sessions.save(touched)
                except StoreUnavailable as error:
                    refused = True
                    await store_unavailable(error)(scope, receive, send)
                    return
            await send(message)

        await self.app(scope, receive, send_after_writing)

    def token_session(self, scope: Scope) -> list[str]:
        """The session of the request's token (the first header, as the MCP endpoint reads it), on ``/mcp``."""
        if not is_mcp_path(scope["path"]):
            return []
        token = next((value for name, value in scope["headers"] if name == TOKEN_HEADER_KEY), None)
        payload = None if token is None else read_token(self.tokens, token.decode("latin-1"))
        return [] if payload is None else [payload[SESSION_ID_KEY]]
