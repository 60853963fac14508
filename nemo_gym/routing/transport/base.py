"""The ``Transport`` protocol: how a worker reaches its siblings, and is reached by them.

A worker names its siblings by worker ID only; where a sibling is (a Unix socket's name on this host,
a host and port elsewhere) is the transport's business, and so is what proves one alive or dead.
The forwarder and the router talk to this protocol; an implementation is chosen by name in
``nemo_gym.routing.transport``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from starlette.types import ASGIApp

if TYPE_CHECKING:
    from nemo_gym.protocols.input_limits import InputLimits
    from nemo_gym.routing.transport.connection import OwnerConnection


@runtime_checkable
class Transport(Protocol):
    """One worker's connections to its siblings' private listeners, and its own listener and life.

    Built with a directory of this host that only this server's workers share (``TRANSPORTS``).
    """

    async def connect(self, owner: str, fresh: bool = False) -> OwnerConnection:
        """A connection to ``owner``'s listener: a kept-alive one, or (``fresh``, or none kept) a new
        one. ``OSError`` if the owner takes no connection now; then nothing of a request was sent."""

    def give_back(self, owner: str, connection: OwnerConnection) -> None:
        """Keep a connection whose reply was read whole, for the owner's next request."""

    def is_alive(self, worker_id: str) -> bool:
        """False only once the worker is provably dead; a worker that is busy, or in doubt, is alive.
        Answers at once (it is asked on the event loop, and for every sibling when placing)."""

    async def proves_dead(self, worker_id: str) -> bool:
        """For a connection that broke before its reply started: whether the worker is dead, waiting as
        long as its death takes to show; False for a worker that stays alive."""

    def forget(self, owner: str) -> None:
        """Drop what is kept for a dead owner (its connections)."""

    def serving(self, worker_id: str, app: ASGIApp | None, limits: InputLimits) -> AbstractAsyncContextManager[None]:
        """For the block: serve ``app`` to the siblings' forwarded requests (under ``limits``), and be
        alive. ``app`` None: alive only (a worker that routes nothing, counted by the launcher)."""

    async def close(self) -> None:
        """Close every kept connection."""
