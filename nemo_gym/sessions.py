"""Session cookies: the signing secret, and the step that gives every request a session id."""

from __future__ import annotations

import os
import secrets
import uuid
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.routing.worker import OWNER_KEY


def session_cookie_name(instance_name: str) -> str:
    """Each server signs its own cookie, so an agent can carry the cookies of every server a session touches."""
    return f"{instance_name}_session"


def state_dir() -> Path:
    """Where per-server state that must outlive a restart (the signing secret) is kept."""
    default = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "nemo_gym"
    return Path(os.environ.get("NEMO_GYM_STATE_DIR", default))


def session_secret(instance_name: str, configured: str | None = None) -> str:
    """The secret that signs this server's cookies and tokens.

    A configured ``session_secret`` wins. Otherwise a random secret is made once per instance name and
    kept in a 0600 file, so every worker signs with it and a restarted server still accepts (and can
    explain the loss of) the cookies it handed out before.
    """
    if configured:
        return configured
    path = state_dir() / "secrets" / instance_name
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


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
            session[SESSION_ID_KEY] = session.get(SESSION_ID_KEY) or uuid.uuid4().hex
            if self.owner is not None and OWNER_KEY not in session:
                session[OWNER_KEY] = self.owner
        await self.app(scope, receive, send)
