"""The middleware that keeps each request's session alive, or answers for an ended one, or refuses a new one over a cap.

It sits inside the session layer and the durable write-through (so a session taken up from the store is
live by the time it looks), outside the app. For a request on a path of ``free_paths`` (liveness,
metrics, the close itself), or one no route of the app takes (the app answers 404 or 405: a stray
``/favicon.ico`` never counts toward a cap), it does nothing. Otherwise the request's session (its
cookie's; on ``/mcp`` its token's) is, in this order:

- ended, and remembered (a tombstone) and not held: 410 with why (a start path, ``/seed_session``, never
  gets here with an old session: the session layer gives it a new one, ``SessionIdMiddleware``);
- live (adopted ones too: ``durable.adoption`` makes a session live as it takes it over, even one
  ``gym sessions restore`` brought back from its end): served, and counted as used at its start and its end;
- new (no session before, or one this worker does not know: never started here, or ended so long ago
  that its tombstone is forgotten, ``registry``): started if no cap is reached, else 503 with Retry-After
  naming the cap, before the app sees it.

A 2xx reply on one of ``end_paths`` (``/verify``) ends the session before the reply starts (a durable one
with that reply's commit: a reply refused unwritten ends nothing, ``SessionLifecycle.end``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from itsdangerous import URLSafeSerializer
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.lifecycle.replies import over_cap
from nemo_gym.sessions.replies import session_gone
from nemo_gym.sessions.token import is_mcp_path, token_session_id

# Whether a route takes a request is remembered for this many (method, root path, path): the app's routes
# are all made before it serves, and a scan of them on every request cost several microseconds.
ROUTED_CACHE_SIZE = 4096

class Lifecycle:
    def __init__(
        self,
        app: ASGIApp,
        lifecycle: SessionLifecycle,
        free_paths: frozenset[str],
        end_paths: frozenset[str],
        tokens: URLSafeSerializer,
        routes: Sequence[BaseRoute],
    ) -> None:
        """``routes``: the app's (its router's list, all made before the first request)."""
        self.app = app
        self.lifecycle = lifecycle
        self.registry = lifecycle.registry
        self.free_paths = free_paths
        self.end_paths = end_paths
        self.tokens = tokens
        self.routes = routes
        self.routed = functools.lru_cache(maxsize=ROUTED_CACHE_SIZE)(self.takes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.free_paths or not self.routed(scope["method"], scope.get("root_path", ""), path):
            await self.app(scope, receive, send)
            return
        if is_mcp_path(path):
            session_id = token_session_id(scope, self.tokens)
            if session_id is None:  # the endpoint answers a request without a valid token itself
                await self.app(scope, receive, send)
                return
            refusal = self.check(session_id)
        else:
            session_id = scope["session"][SESSION_ID_KEY]
            refusal = self.check(session_id)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        ends = path in self.end_paths

        async def send_after_ending(message: Message) -> None:
            if ends and message["type"] == "http.response.start" and 200 <= message["status"] < 300:
                await self.lifecycle.end(session_id, EndReason.VERIFY, by_its_request=True)
            await send(message)

        self.registry.enter(session_id)
        try:
            await self.app(scope, receive, send_after_ending)
        finally:
            self.registry.leave(session_id)
            if self.lifecycle.ending_with_request:
                # An end the write-through neither finished nor took back (its commit's outcome unknown, the request cancelled).
                await self.lifecycle.settle([session_id])

    def takes(self, method: str, root_path: str, path: str) -> bool:
        """Whether a route of the app takes a request for ``path`` with ``method``, as the app's router matches it."""
        scope = {"type": "http", "method": method, "root_path": root_path, "path": path}
        return any(route.matches(scope)[0] is Match.FULL for route in self.routes)

    def check(self, session_id: str) -> Response | None:
        """None if the request may be served (its session live, or made live now), else the reply it gets instead."""
        if self.registry.is_live(session_id):
            return None  # adopted sessions too: adoption made them live (``durable.adoption``)
        detail = self.registry.ended(session_id)
        if detail is not None:
            return session_gone(detail)
        cap = self.lifecycle.admit(session_id)
        return None if cap is None else over_cap(cap.limit, cap.detail)

