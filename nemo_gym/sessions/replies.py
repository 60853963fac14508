"""What a request for a session gets in place of being served: 410 when its session is gone, and a reply that
asks the caller to come back (``retry_later``: 503, or 409, with ``Retry-After``) when it cannot be served now.

Every such reply in the package is built here, so clients see one shape.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

# What every reply that asks the caller to come back advises.
RETRY_AFTER_SECONDS = 1


def retry_later(detail: str, status: int = 503) -> JSONResponse:
    return JSONResponse(status_code=status, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}, content={"detail": detail})


def session_gone(detail: str) -> JSONResponse:
    """410: the session's state is gone (it ended, or went with its owner); the client starts a new one."""
    return JSONResponse(status_code=410, content={"detail": detail})


def lost_session(owner: str) -> JSONResponse:
    """The 410 for a session whose state went with its dead owner ``owner`` (how the router names it)."""
    return session_gone(
        f"Session lost: it belongs to worker {owner}, which is gone (the worker exited, the server restarted, "
        "or its replica's host is gone), and the session's state went with it. Start a new session."
    )
