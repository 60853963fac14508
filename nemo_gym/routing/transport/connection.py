"""Connections to an owner's private listener: HTTP/1.1, kept alive, replies read by httptools.

Any transport's: it opens the stream (its ``open_connection``), this speaks HTTP over it and keeps the
connections alive (``PooledTransport``).

A general HTTP client was most of a forward's CPU on the forwarding worker (about three quarters of
the router's time in a profile), for features a forward never uses: URLs, cookies, redirects,
decompression, header multidicts. Here the request is written straight from the ASGI scope, and the
reply is read by httptools, the parser uvicorn itself uses, into the events the forwarder hands on as
ASGI messages.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import httptools

from nemo_gym.routing.transport.credentials import request_target
from nemo_gym.routing.transport.private_server import PRIVATE_KEEP_ALIVE_SECONDS

# Reply bytes read ahead of the caller before the owner's socket is no longer read.
READ_AHEAD_BYTES = 1 << 20
# Shorter than the private server's, so this side always closes an idle connection first and never
# sends a request down a connection the owner is closing.
FORWARD_KEEP_ALIVE_SECONDS = PRIVATE_KEEP_ALIVE_SECONDS / 2


class ConnectionBroken(ConnectionError):
    """The connection ended, or the owner's reply could not be parsed, before the reply was complete."""


class OwnerConnection(asyncio.Protocol):
    """One keep-alive connection to an owner; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.events: collections.deque[tuple[Any, ...]] = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.read_ahead = 0
        self.reading = True
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = False
        self.idle_since = 0.0
        # For the request now on the connection: whether any of it was written, any byte came back, and
        # whether the owner ended the connection with the request unread (a reset, or a broken pipe).
        self.sent = False
        self.replied = False
        self.reset = False
        # Whether the kernel gave up on the connection (ETIMEDOUT: what was sent stayed unacknowledged, as to
        # a host gone from the network), and what to call then (the TCP transport notes the replica silent).
        self.timed_out = False
        self.on_timeout: Callable[[], None] | None = None
        # Where a relayed request's reply goes (``routing.relay``): called with each piece read, and with b"" when the
        # connection ends, its events left for it to take (``take_events``); None: they wait for ``next_event``.
        self.tap: Callable[[bytes], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.replied = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.push(("broken", ConnectionBroken(f"the owner's reply is not HTTP: {error}")))
            self.close()
            data = b""
        if self.tap is not None:
            self.tap(data)
            return
        if self.closed:
            return
        if self.read_ahead > READ_AHEAD_BYTES and self.reading:
            self.reading = False
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reset = isinstance(exc, (ConnectionResetError, BrokenPipeError))
        self.timed_out = isinstance(exc, TimeoutError)
        if self.timed_out and self.on_timeout is not None:
            self.on_timeout()
        self.writable.set()
        self.push(("broken", ConnectionBroken(f"the owner closed the connection: {exc!r}" if exc else "the owner closed the connection")))
        if self.tap is not None:
            self.tap(b"")

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.push(("start", self.parser.get_status_code(), self.headers))
        self.headers = []

    def on_body(self, body: bytes) -> None:
        self.read_ahead += len(body)
        self.push(("body", body))

    def on_message_complete(self) -> None:
        self.push(("end", self.parser.should_keep_alive()))

    def push(self, event: tuple[Any, ...]) -> None:
        self.events.append(event)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def has_event(self) -> bool:
        return bool(self.events)

    def take_events(self) -> list[tuple[Any, ...]]:
        """Every event read and not yet taken (the tap's way to them)."""
        events = list(self.events)
        self.events.clear()
        self.read_ahead = 0
        return events

    async def next_event(self) -> tuple[Any, ...]:
        """The next piece of the reply: ("start", status, headers), ("body", bytes) or ("end", keep_alive)."""
        while not self.events:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        event = self.events.popleft()
        if event[0] == "broken":
            raise event[1]
        if event[0] == "body":
            self.read_ahead -= len(event[1])
            if not self.reading and self.read_ahead <= READ_AHEAD_BYTES // 2:
                self.reading = True
                self.transport.resume_reading()
        return event

    def unread(self) -> bool:
        """Whether the owner provably did not take the request, and answered nothing: the connection was
        closed before it was written, or the owner's end closed with it unread (the kernel then resets
        the connection, where an owner that read it all and closed gives a plain end of file)."""
        return not self.replied and (self.reset or not self.sent)

    def is_usable(self) -> bool:
        """Not closed, nor closing: an end of file the loop has read but not yet reported counts as closed."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    async def write(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionBroken("the owner closed the connection")
        self.sent = True
        self.transport.write(data)
        await self.writable.wait()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class PooledTransport:
    """The connection half of every ``Transport``, written once: kept-alive connections to each peer, the one
    used last used first. A transport says where it reaches a peer (``address``) and opens a new connection
    there (``open_connection``, raising ``OSError`` if it takes none); its connections are kept under the peer's
    address and, there, under its ``pool`` (by default the address too); connecting, giving back, forgetting a
    dead peer (every connection to its address) and closing are the same for every transport."""

    keep_alive_seconds = FORWARD_KEEP_ALIVE_SECONDS

    def __init__(self) -> None:
        self.pools: dict[str, dict[Any, list[OwnerConnection]]] = {}

    def address(self, peer: Any) -> str:
        raise NotImplementedError

    def pool(self, peer: Any) -> Any:
        """What a peer's kept connections are kept under at its address, and reused for."""
        return self.address(peer)

    async def open_connection(self, address: str) -> OwnerConnection:
        raise NotImplementedError

    def idle(self, peer: Any) -> list[OwnerConnection]:
        return self.pools.setdefault(self.address(peer), {}).setdefault(self.pool(peer), [])

    def kept(self, peer: Any) -> OwnerConnection | None:
        """A kept connection to ``peer`` that is still usable, taken from its pool; None if none is."""
        idle = self.idle(peer)
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if connection.is_usable() and now - connection.idle_since < self.keep_alive_seconds:
                connection.sent = connection.replied = False
                return connection
            connection.close()
        return None

    async def connect(self, peer: Any, fresh: bool = False) -> OwnerConnection:
        if not fresh and (connection := self.kept(peer)) is not None:
            return connection
        return await self.open_connection(self.address(peer))

    def give_back(self, peer: Any, connection: OwnerConnection) -> None:
        connection.idle_since = asyncio.get_running_loop().time()
        self.idle(peer).append(connection)

    def forget(self, peer: Any) -> None:
        for idle in self.pools.pop(self.address(peer), {}).values():
            for connection in idle:
                connection.close()

    async def close(self) -> None:
        for pools in self.pools.values():
            for idle in pools.values():
                for connection in idle:
                    connection.close()
        self.pools.clear()


def request_head(scope: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request line and headers, as the caller sent them (the target a replica's credential covers)."""
    lines = [b"%s %s HTTP/1.1" % (scope["method"].encode(), request_target(scope))]
    lines += [b"%s: %s" % header for header in headers]
    lines.append(b"\r\n")
    return b"\r\n".join(lines)
