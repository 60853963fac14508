"""Session cookies: the signed cookie that holds a request's session, and the step that gives every session an id."""

from __future__ import annotations

import json
import uuid
from base64 import b64decode, b64encode
from collections.abc import Iterable
from typing import Any

from itsdangerous import BadSignature, TimestampSigner
from starlette.datastructures import MutableHeaders
from starlette.middleware.sessions import Session
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.sessions.worker import OWNER_KEY

# Starlette's default, which upstream keeps: 14 days.
SESSION_MAX_AGE_SECONDS = 14 * 24 * 60 * 60
# Set in the ASGI scope by the router: the session it read from the request's cookie (None: the request has
# no session cookie, or one that does not verify), so that the session layer does not read it again.
SESSION_READ_SCOPE_KEY = "nemo_gym.session_read"
# On a forwarded request, the forwarding worker's reading of the session cookie (its JSON; ``null``: no cookie
# that verifies), taken as read where only a sibling or a credentialed replica can send it (``transport.private_server``).
SESSION_READ_HEADER = b"x-nemo-gym-session-read"


def encoded_reading(session: dict | None) -> bytes:
    """A worker's reading of a request's session as it goes to a sibling: a forward's header, a hand-off's message."""
    return json.dumps(session).encode()


def decoded_reading(data: bytes) -> dict | None:
    """What ``encoded_reading`` made; ValueError for anything else (not JSON, nested past the parser, not an object or null)."""
    try:
        session = json.loads(data)
    except RecursionError as error:
        raise ValueError("a reading nested deeper than the JSON parser goes") from error
    if session is not None and not isinstance(session, dict):
        raise ValueError(f"a reading is a JSON object or null, not {type(session).__name__}")
    return session


def session_cookie_name(instance_name: str) -> str:
    """Each server signs its own cookie, so an agent can carry the cookies of every server a session touches."""
    return f"{instance_name}_session"


class SessionCookie:
    """The app's session layer: the session a signed cookie holds, in ``scope["session"]``; sent back when it changed.

    The cookie is Starlette's ``SessionMiddleware`` cookie, as upstream's servers send it: the session as
    base64 JSON, signed with a timestamp (itsdangerous), with the same attributes; a cleared session
    deletes it. It is read once per request on a host: the router in front of the app leaves its reading in
    the scope (``SESSION_READ_SCOPE_KEY``), and a sibling's private socket the forwarding router's
    (``routing.transport.private_server``); without either (routing off) it is read here.
    """

    def __init__(self, app: ASGIApp, secret_key: str, session_cookie: str, max_age: int = SESSION_MAX_AGE_SECONDS) -> None:
        self.app = app
        self.signer = TimestampSigner(secret_key)
        self.session_cookie = session_cookie
        self.max_age = max_age
        self.attributes = f"path=/; Max-Age={max_age}; httponly; samesite=lax"
        self.deletion = f"{session_cookie}=null; path=/; expires=Thu, 01 Jan 1970 00:00:00 GMT; httponly; samesite=lax"

    def read(self, headers: Iterable[tuple[bytes, bytes]]) -> dict[str, Any] | None:
        """The session in the request's first Cookie header (the one Starlette reads); None without one that verifies."""
        header = next((value for name, value in headers if name == b"cookie"), None)
        value = None if header is None else cookie_parser(header.decode("latin-1")).get(self.session_cookie)
        return None if value is None else self.load(value)

    def load(self, value: str) -> dict[str, Any] | None:
        """The session a session cookie's value holds; None if it does not verify."""
        try:
            return json.loads(b64decode(self.signer.unsign(value.encode("utf-8"), max_age=self.max_age)))
        except BadSignature:
            return None

    def signed(self, session: dict[str, Any]) -> str:
        return self.signer.sign(b64encode(json.dumps(session).encode("utf-8"))).decode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        loaded = scope.pop(SESSION_READ_SCOPE_KEY) if SESSION_READ_SCOPE_KEY in scope else self.read(scope["headers"])
        scope["session"] = Session(loaded or {})

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                session: Session = scope["session"]
                message.setdefault("headers", [])
                headers = MutableHeaders(scope=message)
                if session.accessed:
                    headers.add_vary_header("Cookie")
                if session.modified and session:
                    headers.append("Set-Cookie", f"{self.session_cookie}={self.signed(session)}; {self.attributes}")
                elif session.modified and loaded is not None:
                    headers.append("Set-Cookie", self.deletion)
            await send(message)

        await self.app(scope, receive, send_with_cookie)


# Set in the ASGI scope of a request whose session this middleware has just made (no store can hold it yet).
NEW_SESSION_SCOPE_KEY = "nemo_gym.new_session"


class SessionIdMiddleware:
    """Sits inside SessionCookie and makes sure every session has a ``session_id``.

    A request on one of ``start_paths`` (``/seed_session``, an agent's ``/run``) starts a new session,
    whatever its cookie names (a live session, an ended one, one whose owner is gone, none that
    verifies): a client that keeps one cookie jar across rollouts seeds each in a session of its own.
    It writes the id back on every request, so every reply carries the session cookie (Starlette
    sends one only for a changed session): a client that replaces its cookies with each reply's,
    as upstream NeMo Gym's agents do, keeps its session. With several workers it also stamps the
    session with its owner, this worker, when the session has none yet: a new session, or one minted
    by a single-worker server, which this worker adopts; in a replica set, with its replica too
    (``replica``: its keys, ``nemo_gym.routing.replica``).
    """

    def __init__(
        self, app: ASGIApp, owner: str | None = None, replica: dict[str, str | int] | None = None, start_paths: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.owner = owner
        self.replica = replica
        self.start_paths = start_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            session = scope["session"]
            if scope.get("path") in self.start_paths:  # (the router's probe for a reply's cookie has no path)
                session.clear()
            session_id = session.get(SESSION_ID_KEY)
            if not session_id:
                session_id = uuid.uuid4().hex
                scope[NEW_SESSION_SCOPE_KEY] = True
            session[SESSION_ID_KEY] = session_id  # written back every time, so every reply sets the cookie
            if self.owner is not None and OWNER_KEY not in session:
                session[OWNER_KEY] = self.owner
                if self.replica is not None:
                    session.update(self.replica)
        await self.app(scope, receive, send)
