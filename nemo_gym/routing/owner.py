"""Reading a request's owner worker from its signed session cookie or its MCP session token.

The router reads the session with the app's own session layer (``SessionCookie``, built with the app's
settings), and leaves what it read in the scope, so the app does not read the cookie again; the token
is the first ``X-NeMo-Gym-Session-Token`` header, as the MCP endpoint takes it. A request that names
its session twice, differently, is refused rather than routed by one reading and served by another.
"""

from __future__ import annotations

from typing import Any

from itsdangerous import URLSafeSerializer
from starlette.requests import cookie_parser
from starlette.types import Message, Receive, Scope, Send

from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.cookie import SESSION_READ_SCOPE_KEY, SessionCookie, SessionIdMiddleware
from nemo_gym.sessions.token import TOKEN_HEADER, TOKEN_HEADER_KEY, is_mcp_path, read_token


class AmbiguousSession(Exception):
    """The request names two different sessions in one header: routing by either would be a guess."""

    def __init__(self, header: str) -> None:
        super().__init__(header)
        self.header = header

    @property
    def detail(self) -> str:
        return (
            f"The {self.header} header names this server's session more than once, with different values "
            "(or outside the first Cookie header, which the server does not read): send exactly one."
        )


async def _nothing(scope: Scope, receive: Receive, send: Send) -> None:
    """The app behind a session layer the router only reads the cookie with (or signs a reply's with)."""


async def _reply_start(scope: Scope, receive: Receive, send: Send) -> None:
    """The app behind the cookie setter: a reply's start, to which the session layer adds the session's cookie."""
    await send({"type": "http.response.start", "status": 200, "headers": []})


def owner_of(session: dict | None) -> object | None:
    """The owner a session names (as ``named_session`` read it); None for none."""
    return None if session is None else session.get(OWNER_KEY)


class OwnerReader:
    """Finds the owner a request names, reading the session the way the app behind the router will.

    Returns None for a request that names no owner: no cookie or token, a bad signature, or a
    session minted without one. Such requests are handled locally.
    """

    def __init__(self, session_options: dict[str, Any], token_serializer: URLSafeSerializer) -> None:
        self.session_layer = SessionCookie(_nothing, **session_options)
        # The app's own session layer, in front of a bare reply: it signs the session as the app would.
        self.cookie_setter = SessionCookie(SessionIdMiddleware(_reply_start), **session_options)
        self.cookie_name = self.session_layer.session_cookie
        self.set_cookie_prefix = f"{self.cookie_name}=".encode()
        self.token_serializer = token_serializer

    def owner(self, scope: Scope) -> object | None:
        """The owner the request names; raises ``AmbiguousSession`` if it names two sessions."""
        return owner_of(self.named_session(scope))

    def named_session(self, scope: Scope) -> dict | None:
        """The session the request names: its token's payload or its cookie's session; None if neither.

        What the cookie holds is left in the scope for the app's session layer, which then need not read it."""
        cookie_headers: list[str] = []
        tokens: list[str] = []
        for name, value in scope["headers"]:
            if name == b"cookie":
                cookie_headers.append(value.decode("latin-1"))
            elif name == TOKEN_HEADER_KEY:
                tokens.append(value.decode("latin-1"))
        if len(tokens) > 1 and len(set(tokens)) > 1:
            raise AmbiguousSession(TOKEN_HEADER)
        # A request another replica forwarded here comes with its reading of the cookie (``transport.private_server``).
        read = SESSION_READ_SCOPE_KEY in scope
        cookie = self.session_cookie_value(cookie_headers)
        if cookie is None:
            scope[SESSION_READ_SCOPE_KEY] = None
        if tokens and (is_mcp_path(scope["path"]) or cookie is None):
            return read_token(self.token_serializer, tokens[0])
        if cookie is not None:
            session = scope[SESSION_READ_SCOPE_KEY] = scope[SESSION_READ_SCOPE_KEY] if read else self.session_layer.load(cookie)
            return session
        return None

    def session_cookie_value(self, cookie_headers: list[str]) -> str | None:
        """The session cookie's value the app will load (None: it will load none), after checking that it can load only one.

        Starlette reads the first Cookie header and, within it, the last occurrence of a name. Every
        occurrence is read here with Starlette's parser, chunk by chunk, to see whether they agree. The
        common request, one Cookie header that holds the name once, is parsed once, whole: its one
        occurrence lies in one chunk, which Starlette's parser reads alone as it reads it in the header.
        """
        if len(cookie_headers) == 1 and cookie_headers[0].count(self.cookie_name) == 1:
            return cookie_parser(cookie_headers[0]).get(self.cookie_name)
        # A header that does not hold the name at all cannot name the session: it is not parsed.
        values = {
            parsed[self.cookie_name]
            for header in cookie_headers
            if self.cookie_name in header
            for chunk in header.split(";")
            if self.cookie_name in (parsed := cookie_parser(chunk))
        }
        if not values:
            return None
        if len(values) > 1 or self.cookie_name not in cookie_parser(cookie_headers[0]):
            raise AmbiguousSession("Cookie")
        return values.pop()

    def keeping_session(self, scope: Scope, send: Send) -> Send:
        """``send`` for a reply that may be made on the owner's behalf (the router's 503 for a busy owner,
        say): a reply without the session's cookie gets it, signed as the app signs it, so a client that
        replaces its cookies with each reply's keeps its session. A 410 (the session is gone) gets none."""

        async def send_keeping(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] != 410 and not self.sets_cookie(message):
                message = {**message, "headers": [*message.get("headers", []), *await self.cookie_headers(scope)]}
            await send(message)

        return send_keeping

    def sets_cookie(self, message: Message) -> bool:
        return any(name.lower() == b"set-cookie" and value.startswith(self.set_cookie_prefix) for name, value in message.get("headers", []))

    async def cookie_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """The Set-Cookie the app's session layer would send for the session this request names (none if it names none)."""
        sent: list[Message] = []

        async def keep(message: Message) -> None:
            sent.append(message)

        probe = {"type": "http", "headers": scope["headers"]}
        if SESSION_READ_SCOPE_KEY in scope:
            probe[SESSION_READ_SCOPE_KEY] = scope[SESSION_READ_SCOPE_KEY]
        await self.cookie_setter(probe, _nothing, keep)
        return [(name, value) for name, value in sent[0]["headers"] if name == b"set-cookie"]
