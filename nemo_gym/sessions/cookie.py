"""Session cookies: the step that gives every request a session id."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.routing.worker import OWNER_KEY


def session_cookie_name(instance_name: str) -> str:
    """Each server signs its own cookie, so an agent can carry the cookies of every server a session touches."""
    return f"{instance_name}_session"


# Set in the ASGI scope of a request whose session this middleware has just made (no store can hold it yet).
NEW_SESSION_SCOPE_KEY = "nemo_gym.new_session"


class SessionIdMiddleware:
    """Sits inside SessionMiddleware and makes sure every session has a ``session_id``.

    It writes the id back on every request, so every reply carries the session cookie (Starlette
    sends one only for a changed session): a client that replaces its cookies with each reply's,
    as upstream NeMo Gym's agents do, keeps its session. With several workers it also stamps the
    session with its owner, this worker, when the session has none yet: a new session, or one minted
    by a single-worker server, which this worker adopts.
    """

    def __init__(self, app: ASGIApp, owner: str | None = None) -> None:
        self.app = app
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            session = scope["session"]
            session_id = session.get(SESSION_ID_KEY)
            if not session_id:
                session_id = uuid.uuid4().hex
                scope[NEW_SESSION_SCOPE_KEY] = True
            session[SESSION_ID_KEY] = session_id  # written back every time, so every reply sets the cookie
            if self.owner is not None and OWNER_KEY not in session:
                session[OWNER_KEY] = self.owner
        await self.app(scope, receive, send)
