"""The replies of the session lifecycle: what an ended session's 410 says, and a cap's refusal (built by ``sessions.replies``)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.sessions.replies import retry_later


def end_detail(session_id: str, reason: EndReason, idle_seconds: float = 0.0, timeout: float | None = None, worker: str | None = None) -> str:
    """What the requests of a session that ended for ``reason`` are told (the 410's detail)."""
    match reason:
        case EndReason.VERIFY:
            why = "ended with its /verify"
        case EndReason.CLOSE:
            why = "ended by /close_session"
        case EndReason.IDLE:
            why = f"ended: idle for {idle_seconds:.0f} s (session_idle_timeout_seconds: {timeout:g})"
        case EndReason.EXPIRED:
            why = f"expired: no request for {idle_seconds:.0f} s, the session cookie's max age"
        case EndReason.STOP:
            why = "ended: its server stopped, and its state was in that server's memory only"
        case EndReason.CONFLICT:
            why = f"is no longer held by worker {worker}: the store holds it for another worker, which took it over"
    return f"Session {session_id} {why}; its state is gone. Seed a new session."


def over_cap(limit: int, what: str) -> JSONResponse:
    """A new session refused, before anything of it is allocated: the instance holds ``limit`` live sessions."""
    return retry_later(
        f"Over the cap {what}: the instance holds {limit} live sessions, as many as the cap allows, so no new "
        "session is started (the live ones are untouched). Retry once sessions end (verify, /close_session, idleness)."
    )
