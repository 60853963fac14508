"""The public port's protocol where requests may be handed to a sibling worker with their connection.

A connection can be given away only where the bytes already read from it are exactly the ones the owner
needs to serve it from the start: the request is the first to begin since the connection was last idle
(no reply of it being written, no request before it in the same read), its app has taken no body byte, and
its bytes are plain (a TLS connection's keys live in this process). So the protocol keeps the bytes it reads
from the moment the connection is idle, for the request that begins them, and offers that request to the
app as a scope extension (``CONNECTION_EXTENSION``): the router (``routing.router``), which decides before it
reads any body, gives the connection away through it (``give_away``) or lets it go on here. uvicorn has no
other seam: a request's cycle is made inside the parser's callbacks and the raw bytes are never kept.

A connection handed to this worker comes with the bytes the sender read (``received``), fed to the parser
before anything read from the socket here, so the owner parses the head again and nothing else, and with what the
sender knew of the request they begin (``handed_scope``: its reading of the session), put in that request's scope.

A request whose head is parsed is offered, before its app starts, to what the lifespan state holds under
``TAKERS_STATE_KEY``: a request of a sibling's session handed off at once (``routing.early_hand_off``), one of
another replica's session relayed as bytes (``routing.relay``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.protocols.utils import is_ssl

from nemo_gym.protocols.input_limits import InputLimits, LimitedHttpToolsProtocol

CONNECTION_EXTENSION = "nemo_gym.connection"
# In the lifespan state (the protocol's ``app_state``): what may take a request before its app is started, in order
# (``routing.early_hand_off``, ``routing.relay``): each called with the protocol, the request's cycle and its app, it
# returns whether it took the request.
TAKERS_STATE_KEY = "nemo_gym.takers"
# On the first request of a connection a sibling handed to this worker: it was sent here to be served here (where
# placement chose, for a request that starts a session), not passed on again.
HANDED_EXTENSION = "nemo_gym.handed"
# Beyond the head, this much of a body is kept for a hand-off (uvicorn pauses reading at this much unread body too).
KEPT_BODY_BYTES = 64 * 1024


class HandingOffProtocol(LimitedHttpToolsProtocol):
    def __init__(self, *args: Any, limits: InputLimits, received: bytes = b"", handed_scope: dict | None = None, **kwargs: Any) -> None:
        super().__init__(*args, limits=limits, **kwargs)
        self.received = received
        # Whether the next request to begin is the one a sibling handed over with the connection, and what its scope holds.
        self.handed = bool(received)
        self.handed_scope = handed_scope
        self.plain = True
        # What was read since the connection was last idle, while the request it begins may be handed off.
        self.kept: list[bytes] | None = None
        self.kept_bytes = 0
        self.kept_cap = limits.max_header_bytes + KEPT_BODY_BYTES
        # Whether the next request to begin is the first since the connection was idle (the one that may be given away).
        self.opening = False
        self.first_scope: dict | None = None
        self.first_cycle: Any = None
        # A request whose connection a sibling refused, and why.
        self.declined: tuple[dict, str] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.plain = not is_ssl(transport)
        if self.received:
            received, self.received = self.received, b""
            self.data_received(received)

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        if self.plain and self.idle():
            self.kept, self.kept_bytes, self.opening, self.first_scope, self.first_cycle = [], 0, True, None, None
        if self.kept is not None:
            self.kept_bytes += len(data)
            if self.kept_bytes > self.kept_cap:
                self.kept = None
            else:
                self.kept.append(data)
        super().data_received(data)

    def idle(self) -> bool:
        """No request begun or under way: the next byte read begins one."""
        return self.awaiting_head and not self.head_begun and not self.pipeline and (self.cycle is None or self.cycle.response_complete)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.opening:
            self.first_scope, self.opening = self.scope, False
        self.scope["extensions"] = {CONNECTION_EXTENSION: self}
        if self.handed:
            self.scope["extensions"][HANDED_EXTENSION] = True
            if self.handed_scope:
                self.scope.update(self.handed_scope)
            self.handed, self.handed_scope = False, None

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.note_first(self.cycle)

    def note_first(self, cycle: Any) -> None:
        if self.scope is self.first_scope and cycle is not None and cycle.scope is self.scope:
            self.first_cycle = cycle

    def offer(self, scope: dict) -> str | tuple[int, bytes]:
        """The connection of ``scope``'s request, offered to a sibling: its descriptor and the bytes read from it (nothing
        more is read here until ``settle``); or why it cannot be (a sibling's refusal of this very request included)."""
        if self.declined is not None and self.declined[0] is scope:
            return self.declined[1]
        if not self.plain:
            return "tls"
        cycle = self.first_cycle
        if scope is not self.first_scope or cycle is None or cycle.response_started or self.transport.is_closing():
            return "pipelined"
        if self.kept is None:
            return "large"
        data, self.kept = b"".join(self.kept), None
        self.flow.pause_reading()
        return self.transport.get_extra_info("socket").fileno(), data

    def settle(self, scope: dict, reason: str | None) -> None:
        """An offer's outcome. Given (None): this process's descriptor is closed (the connection lives on in the
        receiver's) and nothing more of it is read, parsed or written here; the request's app, if it runs, sees a
        disconnect. Refused (why not): the request goes on here, nothing of it lost, and reading resumes."""
        if reason is not None:
            self.declined = (scope, reason)
            if not self.transport.is_closing():
                self.flow.resume_reading()
            return
        self.done = True
        self.disarm()
        for cycle in (self.first_cycle, self.cycle, *(queued for queued, _ in self.pipeline)):
            cycle.disconnected = True
        self.pipeline.clear()
        self.transport.close()

    async def give_away(self, scope: dict, send: Callable[[int, bytes], Awaitable[str | None]]) -> str | None:
        """Give the connection of ``scope``'s request away with ``send(fd, bytes read)``, which returns once the
        receiver took it; None once given, else why not (``offer``, ``settle``)."""
        offered = self.offer(scope)
        if isinstance(offered, str):
            return offered
        reason = await send(*offered)
        self.settle(scope, reason)
        return reason

    def on_response_complete(self) -> None:
        self.kept = None
        super().on_response_complete()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """A request whose head is parsed (or that waited behind another) is offered to the takers before its app starts."""
        takers = self.app_state.get(TAKERS_STATE_KEY)
        if takers and self.plain and app is self.app:
            self.note_first(cycle)
            for take in takers:
                if take(self, cycle, app):
                    return
        super()._start_asgi_task(cycle, app)

    def serve_in_app(self, cycle: Any, app: Any) -> None:
        """Start ``app`` for a request the relay took and gives back (its body read whole into ``cycle``)."""
        super()._start_asgi_task(cycle, app)
