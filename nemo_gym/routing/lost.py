"""The ``LostSessionPolicy`` protocol: what a request gets when its session's owner is dead, and today's in-memory policy.

The router asks the policy, and acts on its answer: serve the request here, forward it to another
owner, or reply. A server chooses its policy where it is built (``nemo_gym.server``): without durable
sessions it is ``LostWithOwner``; with them, ``nemo_gym.durable.adoption.Adopter``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from starlette.types import ASGIApp

from nemo_gym.sessions.replies import lost_session


@dataclass(frozen=True)
class ServeHere:
    """Serve the request on this worker: the session is this worker's now (``adopted``: taken over from the
    store for this request, live here and named by its cookie already)."""

    adopted: bool = False


@dataclass(frozen=True)
class ForwardTo:
    """Forward the request to ``owner``, which holds the session now."""

    owner: str


@dataclass(frozen=True)
class Reply:
    """Answer the request with ``response`` (an ASGI app; the router adds the session's cookie unless it is a 410)."""

    response: ASGIApp


Decision = ServeHere | ForwardTo | Reply


@runtime_checkable
class LostSessionPolicy(Protocol):
    """``session`` is the session the request names, as the router read it (cookie or token)."""

    async def owner_gone(self, owner: str, session: dict[str, Any], request: str | None = None) -> Decision:
        """The owner is dead and never got the request, whose body can be given again from the start.
        ``request``: its id (``Idempotency-Key``), if it has one."""

    async def owner_died(self, owner: str, session: dict[str, Any], request: str | None = None) -> Reply:
        """The owner died while it had the request, before its reply started: whether the request took
        effect is unknown, so it is neither served nor sent again, only answered."""


class LostWithOwner:
    """A session lives only in its owner's memory: once the owner is dead, the session is lost (410)."""

    async def owner_gone(self, owner: str, session: dict[str, Any], request: str | None = None) -> Decision:
        return Reply(lost_session(owner))

    async def owner_died(self, owner: str, session: dict[str, Any], request: str | None = None) -> Reply:
        return Reply(lost_session(owner))
