"""The ``Transport`` protocol: how a worker reaches its peers, and is reached by them.

A peer is a worker a request is forwarded to, named as the transport names it: a sibling's worker ID
(``unix``), or a worker of another replica with that replica's addresses (``tcp``, a ``ReplicaPeer``).
Where a peer is (a Unix socket's name on this host, a host and port elsewhere), what proves it alive or
dead, and the credential its listener requires are the transport's business. The forwarder and the
router talk to this protocol; an implementation is chosen by name in ``nemo_gym.routing.transport``.
Connecting, giving back and forgetting are every transport's (``connection.PooledTransport``).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from starlette.types import ASGIApp

if TYPE_CHECKING:
    from nemo_gym.protocols.input_limits import InputLimits
    from nemo_gym.routing.exchange import Stamp
    from nemo_gym.routing.transport.connection import OwnerConnection


@runtime_checkable
class Transport(Protocol):
    """One worker's connections to its peers' listeners, and its own listener and life."""

    async def connect(self, peer: Any, fresh: bool = False) -> OwnerConnection:
        """A connection to ``peer``'s listener: a kept-alive one, or (``fresh``, or none kept) a new
        one. ``OSError`` if the peer takes no connection now; then nothing of a request was sent."""

    def kept(self, peer: Any) -> OwnerConnection | None:
        """A kept-alive connection to ``peer``'s listener, if one is usable now (never a new one: it answers at once)."""

    def give_back(self, peer: Any, connection: OwnerConnection) -> None:
        """Keep a connection whose reply was read whole, for the peer's next request."""

    def is_alive(self, peer: Any) -> bool:
        """False only once the peer is provably dead; a peer that is busy, or in doubt, is alive.
        Answers at once (it is asked on the event loop, and for every sibling when placing)."""

    async def proves_dead(self, peer: Any) -> bool:
        """For a connection that broke before its reply started: whether the peer is dead, waiting as
        long as its death takes to show; False for a peer that stays alive."""

    def forget(self, peer: Any) -> None:
        """Drop what is kept for a dead peer (its connections)."""

    def stamper(self, peer: Any) -> Stamp | None:
        """What stamps each request to ``peer`` with the credential its listener requires; None: it requires none."""

    def worker_of(self, peer: Any) -> str:
        """The worker ID of ``peer``: whose lease counts, and whom a forward's span and replies name."""

    def lost_owner(self, peer: Any) -> str:
        """How the lost-session policy, and its 410, name ``peer`` once it is gone or died with a request."""

    def busy_detail(self, peer: Any, waited_seconds: float) -> str:
        """The 503's detail for a peer that took no connection, or acknowledged nothing, for ``waited_seconds``."""

    def serving(self, worker_id: str, app: ASGIApp | None, limits: InputLimits) -> AbstractAsyncContextManager[None]:
        """For the block: serve ``app`` to the peers' forwarded requests (under ``limits``), and be
        alive. ``app`` None: alive only (a worker that routes nothing, counted by the launcher)."""

    async def close(self) -> None:
        """Close every kept connection."""
