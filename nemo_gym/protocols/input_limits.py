"""The wire-level limits on what a client sends: the size of a request head, and how slowly it may send.

uvicorn's httptools protocol, counting bytes before its parser sees them and timing each connection:

- A request head (request line and headers, up to the blank line that ends them) over
  ``max_header_bytes`` gets 431 and the connection is closed; no more of it is read or parsed, and
  the app never sees the request. The same limit holds for chunked trailers, and for chunk size lines
  with their extensions: any run of bytes fed to the parser without a byte of body in between.
  Counting is exact for a head that starts a read, as every request on a connection does unless the
  client pipelines; a pipelined head that starts in the read that ended the request before it may
  pass the limit by at most one more ``max_header_bytes``.
- A head must be complete within ``header_timeout_seconds`` of its first byte (the first head of a
  connection: of the connection opening), else 408 and close. A connection that sent nothing is closed
  without a reply: a 408 there would be read as the answer to a request the client sends just then.
- A body must keep moving: every ``body_timeout_seconds`` while it is being received must bring at
  least ``min_body_bytes_per_second`` times that many bytes of it (at least one byte), or its end,
  else 408 and close (or only the close, if the app has already started its reply).

Time during which the server is not reading the connection (the app has not taken the body it
buffered, or a pipelined request waits its turn) does not count, and neither does time the worker
itself was not running (stopped, or its loop busy): a verdict waits until bytes that came meanwhile
have been read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import http
import json
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0
DEFAULT_BODY_TIMEOUT_SECONDS = 10.0
DEFAULT_MIN_BODY_BYTES_PER_SECOND = 1024.0
# How long a verdict waits, once its time is up, for the loop to read what has come meanwhile.
READ_FIRST_SECONDS = 0.05
# How long a refused connection is still read, what comes discarded, after the answer has gone with
# the end of the stream: closing at once, with unread bytes, resets it, and a client still sending
# would lose the answer.
LINGER_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class InputLimits:
    """The limits of one listening socket; a timeout of None is no time limit."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout_seconds: float | None = DEFAULT_HEADER_TIMEOUT_SECONDS
    body_timeout_seconds: float | None = DEFAULT_BODY_TIMEOUT_SECONDS
    min_body_bytes_per_second: float = DEFAULT_MIN_BODY_BYTES_PER_SECOND

    @classmethod
    def of(cls, config: Any) -> "InputLimits":
        """The limits a server's config sets for its public socket."""
        return cls(config.max_header_bytes, config.header_timeout_seconds, config.body_timeout_seconds, config.min_body_bytes_per_second)

    def for_siblings(self) -> "InputLimits":
        """The limits of a worker's private socket, whose only clients are its sibling workers.

        Heads may be three times as long: a forwarded head is rebuilt (a space after every colon, the
        caller's address and the forwarding worker's reading of the session cookie added, the latter
        at most about as long as the cookie), so one at the public limit can arrive longer. No time limits: a
        sibling passes a caller's bytes on as they come, and the caller is timed at the public side.
        """
        return InputLimits(3 * self.max_header_bytes, None, None, 0)

    def for_replicas(self) -> "InputLimits":
        """The limits of a replica's forwarding port: the public ones, but for heads twice as long (a forwarded
        head is rebuilt, as for the siblings). Timed, unlike the siblings' socket: anyone the network lets
        reach the port can open a connection to it, and the other replicas send a body whole, at once."""
        return dataclasses.replace(self, max_header_bytes=2 * self.max_header_bytes)

    def protocol(self, cls: type[LimitedHttpToolsProtocol] | None = None) -> Callable[..., asyncio.Protocol]:
        """uvicorn's ``http`` setting: the protocol (``cls``, by default ``LimitedHttpToolsProtocol``) held to these
        limits (picklable, for worker processes)."""
        return functools.partial(cls or LimitedHttpToolsProtocol, limits=self)


class WatchedFlow(FlowControl):
    """uvicorn's flow control, telling the protocol when the server starts reading again."""

    def __init__(self, transport: asyncio.Transport, on_resume: Callable[[], None]) -> None:
        super().__init__(transport)
        self.on_resume = on_resume

    def resume_reading(self) -> None:
        if self.read_paused:
            super().resume_reading()
            self.on_resume()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, held to an ``InputLimits``."""

    def __init__(self, *args: Any, limits: InputLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        # Bytes fed to the parser since its last head ended, body byte or message end.
        self.unbodied_bytes = 0
        self.reset_in_feed = False
        self.awaiting_head = True
        self.head_begun = False
        self.window_bytes = 0
        # Whether what the connection is sending now is being timed (its timer may wait for reading to resume).
        self.timed = False
        self.timer: asyncio.TimerHandle | None = None
        # Refused, or handed to the WebSocket protocol: nothing more is parsed or timed here.
        self.done = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = WatchedFlow(transport, self.reading_resumed)
        self.rearm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        limit = self.limits.max_header_bytes
        while data and not self.transport.is_closing():
            room = limit - self.unbodied_bytes
            if room <= 0:
                detail = f"The request head (or a chunked body's framing or trailers) is larger than this server's limit of {limit} bytes"
                self.refuse(431, detail + " (max_header_bytes).")
                return
            piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self.reset_in_feed = False
            super().data_received(piece)
            if self.done:
                return
            self.unbodied_bytes = 0 if self.reset_in_feed else self.unbodied_bytes + len(piece)
        # Timed only if what was fed leaves a head or body unfinished: a request that came whole in one
        # read (the usual case) costs no timer.
        if not self.timed and (self.head_begun or not self.awaiting_head) and not self.transport.is_closing():
            received = self.window_bytes
            self.rearm()
            self.window_bytes = received  # body bytes that came with the head count in its first window

    def handle_websocket_upgrade(self) -> None:
        # From here the connection is the WebSocket protocol's (uvicorn upgrades when a WebSocket
        # library is installed; none is in this project's dependencies).
        self.done = True
        self.disarm()
        super().handle_websocket_upgrade()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_begun = True

    def on_headers_complete(self) -> None:
        self.awaiting_head = False
        self.reset_in_feed = True
        # The body is timed from the end of this read (data_received), if it does not end in it.
        self.disarm()
        self.timed = False
        self.window_bytes = 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self.reset_in_feed = True
        self.window_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.awaiting_head = True
        self.head_begun = False
        self.reset_in_feed = True
        self.timed = False
        self.disarm()
        super().on_message_complete()

    def rearm(self) -> None:
        """Start the time limit of what the connection is sending now, from its beginning."""
        if self.done:
            return
        self.disarm()
        if self.awaiting_head:
            seconds, verdict = self.limits.header_timeout_seconds, self.head_verdict
        else:
            seconds, verdict = self.limits.body_timeout_seconds, self.body_verdict
            self.window_bytes = 0
        if seconds is not None:
            self.timed = True
            self.timer = self.loop.call_later(seconds, self.read_first, verdict)

    def reading_resumed(self) -> None:
        if self.timed:
            self.rearm()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def read_first(self, verdict: Callable[[], None]) -> None:
        self.timer = self.loop.call_later(READ_FIRST_SECONDS, verdict)

    def head_verdict(self) -> None:
        self.timer = None
        if self.flow.read_paused:
            return  # the head is timed again from the start once reading resumes
        if not self.head_begun:
            self.refuse(None, "")
            return
        seconds = self.limits.header_timeout_seconds
        self.refuse(408, f"The request head did not arrive within {seconds:g} seconds (header_timeout_seconds).")

    def body_verdict(self) -> None:
        self.timer = None
        if self.flow.read_paused:
            return
        seconds = self.limits.body_timeout_seconds
        rate = self.limits.min_body_bytes_per_second
        if self.window_bytes >= max(1, rate * seconds):
            self.rearm()
            return
        detail = f"The request body brought fewer than {rate:g} bytes a second for {seconds:g} seconds"
        self.refuse(408, detail + " (min_body_bytes_per_second, body_timeout_seconds).")

    def refuse(self, status: int | None, detail: str) -> None:
        """Answer ``status`` (None: nothing) and close, parsing nothing more; an app that has the request sees a disconnect."""
        self.done = True
        self.disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if self.awaiting_head:
                # A pipelined head, while the reply to the request before it is under way: that reply
                # is finished, then the connection closed.
                cycle.keep_alive = False
                self.flow.pause_reading()
                return
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
                return
        if status is not None:
            self.transport.write(refusal(status, detail, self.server_state.default_headers))
        if status is None or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()
        self.timer = self.loop.call_later(LINGER_SECONDS, self.transport.close)


def refusal(status: int, detail: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    lines = [b"HTTP/1.1 %d %s" % (status, http.HTTPStatus(status).phrase.encode())]
    lines += [b"%s: %s" % header for header in default_headers]
    lines += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close", b"", body]
    return b"\r\n".join(lines)
