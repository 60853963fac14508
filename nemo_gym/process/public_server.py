"""A worker's uvicorn server, known to the worker's own parts: what a connection handed over by a sibling needs.

A connection another worker of this host hands over (``routing.transport.hand_off``) is served as if this
worker had accepted it on its public port: by a protocol that uvicorn's own factory would make, with this
server's config (its input limits), its state (the connections a graceful stop closes, the tasks it waits
for) and its app state. uvicorn builds that factory inside ``Server.startup`` and keeps it to itself, and its
multi-process supervisor makes each worker's server; so the supervisor is given this subclass
(``nemo_gym.process.run.fork_workers``), which names itself before its app starts.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

_current: PublicServer | None = None


class TakesConnections(uvicorn.Server):
    """A uvicorn server that serves connections it did not accept (a replica's forwarding port's too, ``transport.tcp``)."""

    def protocol(self, **options: Any) -> asyncio.Protocol:
        """A protocol for a connection of this server's port, as uvicorn's own factory makes it (``options``: the protocol's own)."""
        return self.config.http_protocol_class(config=self.config, server_state=self.server_state, app_state=self.lifespan.state, **options)


class PublicServer(TakesConnections):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        global _current
        _current = self  # before the lifespan, in which the worker starts taking hand-offs
        await super().startup(sockets=sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        global _current
        try:
            await super().shutdown(sockets=sockets)
        finally:
            if _current is self:
                _current = None  # a stopped server serves no connection a sibling hands over


def current() -> PublicServer | None:
    """This process's public server, once it starts; None where uvicorn's own server serves (one worker, in-process tests)."""
    return _current
