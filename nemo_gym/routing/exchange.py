"""One forwarded request: the caller's body streamed up to the owner, the owner's reply streamed down.

The connection is the transport's (``transport.connection``); what goes on it, and what comes back as
ASGI messages, is decided here. A caller that leaves cancels the relay.

A request that is stamped with a credential (a replica's, ``transport.credentials``, covers its whole body) has its
body read whole before its head is sent: kept as the pieces it came in (no copy), and sent with its length.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from nemo_gym.routing.transport.connection import OwnerConnection, request_head
from nemo_gym.routing.transport.private_server import CLIENT_HEADER

# Framing this hop writes itself: the body's length (or chunks) as it sends it, and no interim
# "100 Continue", since the body goes up with the request.
REFRAMED = frozenset({b"content-length", b"expect"})
# Connection-level headers describe one hop, not the request: each hop sets its own.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)

# What goes up to the owner: the whole body (in one piece, or in the pieces it came in), a stream of it, or none.
RequestBody = bytes | list[bytes] | AsyncIterator[bytes] | None
# Stamps a request with the credential its peer requires (``Transport.stamper``): given its scope, its headers
# as they will be sent (edited in place) and its whole body.
Stamp = Callable[[Any, list[tuple[bytes, bytes]], list[bytes]], None]


class CallerLeft(Exception):
    """The caller disconnected while its request body was still being streamed."""


class Exchange:
    """One forwarded request: the caller's body streamed up, the owner's reply streamed down."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, stamp: Stamp | None = None) -> None:
        """``stamp``: adds the credential the peer requires to the request's headers (none: the peer requires none)."""
        self.scope = scope
        self.stamp = stamp
        self.receive = receive
        self.send = send
        self.body_sent = asyncio.Event()
        self.started = False
        self.finished = False
        self.caller_left = False
        # The body messages read from the caller and kept: a request that reached no owner can then be
        # served from the start by someone else. The first only, unless the body was read whole (stamped):
        # the rest of a streamed body is read only once connected, and not kept.
        self.kept: list[Message] = [{"type": "http.request", "body": b"", "more_body": False}]
        # Whether a streamed body was read from the caller past its first message (which is kept).
        self.read_past_first = False

    async def run(self, relay: Callable[[RequestBody], Awaitable[None]]) -> None:
        """Read the start of the body, then ``relay`` it; a caller that leaves meanwhile cancels it."""
        body = await self.body_start()
        watcher = asyncio.ensure_future(self.cancel_when_caller_leaves(asyncio.current_task()))
        try:
            await relay(body)
        except asyncio.CancelledError:
            if not self.caller_left:
                raise
            asyncio.current_task().uncancel()
        finally:
            watcher.cancel()

    async def relay(self, connection: OwnerConnection, body: RequestBody) -> bool:
        """Send the request on ``connection`` and stream the reply back; whether the connection may be reused."""
        scope = self.scope
        headers = forwarded_headers(scope)
        if isinstance(body, bytes):
            headers.append((b"content-length", b"%d" % len(body)))
        elif isinstance(body, list):
            headers.append((b"content-length", b"%d" % sum(len(piece) for piece in body)))
        elif body is not None:
            headers.append((b"transfer-encoding", b"chunked"))
        if self.stamp is not None:
            self.stamp(scope, headers, [body] if isinstance(body, bytes) else body or [])
        await connection.write(request_head(scope, headers) + (body if isinstance(body, bytes) else b""))
        if isinstance(body, list):
            for piece in body:
                await connection.write(piece)
        elif body is not None and not isinstance(body, bytes):
            async for chunk in body:
                if chunk:
                    await connection.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await connection.write(b"0\r\n\r\n")
        _, status, reply_headers = await connection.next_event()
        self.started = True
        headers = [(name, value) for name, value in reply_headers if name.lower() not in HOP_BY_HOP]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        if scope["method"] == "HEAD":  # the reply has no body, whatever its headers say; the parser cannot know
            self.finished = True
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
            return False
        pieces: list[bytes] = []
        while True:
            event = await connection.next_event()
            if event[0] == "end":
                self.finished = True
                await self.send({"type": "http.response.body", "body": b"".join(pieces), "more_body": False})
                return event[1]
            pieces.append(event[1])
            if not connection.has_event():  # send what has come; a small reply goes back in one message
                await self.send({"type": "http.response.body", "body": b"".join(pieces), "more_body": True})
                pieces = []

    async def body_start(self) -> RequestBody:
        """The request body: the bytes, if they came in one message; otherwise a stream."""
        if not any(name in (b"content-length", b"transfer-encoding") for name, _ in self.scope["headers"]):
            self.body_sent.set()
            return None
        first = await self.next_body_message()
        self.kept = [first]
        if not first.get("more_body", False):
            self.body_sent.set()
            return first.get("body", b"")
        if self.stamp is not None:
            while self.kept[-1].get("more_body", False):
                self.kept.append(await self.next_body_message())
            self.body_sent.set()
            return [message.get("body", b"") for message in self.kept]
        return self.body_stream(first.get("body", b""))

    async def body_stream(self, first_chunk: bytes) -> AsyncIterator[bytes]:
        yield first_chunk
        while True:
            self.read_past_first = True
            message = await self.next_body_message()
            yield message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.body_sent.set()

    async def next_body_message(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.caller_left = True
            raise CallerLeft
        return message

    def replayable(self) -> bool:
        """Whether the request can be sent again whole: its body was read whole (or it has none), or a
        streamed body was not read past its first message. A stream read further is not kept, so a
        request whose body streamed is sent again only if its connection broke that early."""
        return not self.read_past_first and not self.caller_left

    def body_again(self, body: RequestBody) -> RequestBody:
        """The body to send again (``replayable`` requests only): the same, or the stream from its start."""
        if body is None or isinstance(body, (bytes, list)):
            return body
        return self.body_stream(self.kept[0].get("body", b""))

    def replay(self) -> Receive:
        """The caller's request again from the start, for a request that reached no owner."""
        return replaying(self.receive, *self.kept)

    async def cancel_when_caller_leaves(self, relaying: asyncio.Task) -> None:
        """Cancelling the relay closes the connection to the owner, which then cancels its handler."""
        await self.body_sent.wait()
        while (await self.receive())["type"] != "http.disconnect":
            pass
        if not self.finished:
            self.caller_left = True
            relaying.cancel()


def forwarded_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The request's headers as a forward sends them, before its framing: less the hop-by-hop ones and the caller's
    framing, with the caller's address (the owner's ``request.client``)."""
    headers = [(name, value) for name, value in scope["headers"] if name not in HOP_BY_HOP and name not in REFRAMED]
    if scope.get("client"):
        headers.append((CLIENT_HEADER, b"%s:%d" % (scope["client"][0].encode(), scope["client"][1])))
    return headers


def replaying(receive: Receive, *taken: Message) -> Receive:
    """``receive``, with the messages already taken from it given back first, in order."""
    pending = list(reversed(taken))

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
