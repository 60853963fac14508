"""Forward a request, unchanged, to the worker that owns its session, and stream the reply back."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import aiohttp
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send
from yarl import URL

from nemo_gym.routing.liveness import is_alive, lock_path
from nemo_gym.routing.private_server import CLIENT_HEADER, PRIVATE_KEEP_ALIVE_SECONDS
from nemo_gym.routing.worker import socket_path

if TYPE_CHECKING:
    from nemo_gym.durable.adoption import Adopter

# Shorter than the private server's, so this side always closes an idle connection first and never
# sends a request down a connection the owner is closing.
FORWARD_KEEP_ALIVE_SECONDS = PRIVATE_KEEP_ALIVE_SECONDS / 2
# Connection-level headers describe one hop, not the request: each hop sets its own.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
# Headers aiohttp would add on its own; a forwarded request carries only the caller's.
NO_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
WHOLE_REPLY_BYTES = 64 * 1024
CLIENT_HEADER_NAME = CLIENT_HEADER.decode()
# A live owner that takes no connection (its backlog full while it is busy) is retried, with pauses
# growing from the first to the last, for this long; then the caller gets a 503 with Retry-After.
BUSY_OWNER_WAIT_SECONDS = 30
FIRST_RETRY_PAUSE_SECONDS = 0.005
LAST_RETRY_PAUSE_SECONDS = 0.25
RETRY_AFTER_SECONDS = 1

# What aiohttp sends: the whole body, a stream of it, or none.
RequestBody = bytes | AsyncIterator[bytes] | None


class OwnerGone(Exception):
    """The owner's process is dead (its life lock is free): its sessions went with it."""


class OwnerBusy(Exception):
    """The owner lives but has taken no connection for the forwarder's ``busy_wait_seconds``."""


class CallerLeft(Exception):
    """The caller disconnected while its request body was still being streamed."""


def lost_session(owner: str) -> JSONResponse:
    return JSONResponse(
        status_code=410,
        content={
            "detail": f"Session lost: it belongs to worker {owner}, which is gone (the worker exited, or the "
            "server restarted), and the session's state went with it. Start a new session."
        },
    )


def busy_owner(owner: str, waited_seconds: float) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        content={
            "detail": f"Worker {owner}, which owns this session, is alive but took no connection for "
            f"{waited_seconds:g} s; the session is intact. Retry later."
        },
    )


class Forwarder:
    """Sends requests to owner workers: one aiohttp session, with pooled connections, per owner socket."""

    def __init__(self, socket_dir: str, busy_wait_seconds: float = BUSY_OWNER_WAIT_SECONDS) -> None:
        self.socket_dir = socket_dir
        self.busy_wait_seconds = busy_wait_seconds
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        # A server with durable sessions takes a dead owner's sessions over instead of answering 410.
        self.adopter: Adopter | None = None

    async def forward(self, owner: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward and stream back; 503 if the owner stays too busy to connect; if it is dead, 410, or
        the adopter's answer when the server keeps its sessions durable.

        A caller that leaves cancels it. Only a dead owner's pooled connections are dropped: closing a
        live owner's would abort the requests it is serving.
        """
        exchange = Exchange(scope, receive, send)
        try:
            await exchange.run(lambda body: self.relay_when_reachable(owner, exchange, body))
        except OwnerGone:
            await self.forget(owner)
            if self.adopter is not None:
                await self.adopter.take_over(owner, scope, exchange.replay(), send)
                return
            await lost_session(owner)(scope, receive, send)
        except OwnerBusy:
            await busy_owner(owner, self.busy_wait_seconds)(scope, receive, send)
        except (CallerLeft, aiohttp.ClientConnectionError) as error:
            if exchange.caller_left:
                return
            if exchange.started:
                raise  # the reply is half sent: only a closed connection can tell the caller
            if not is_alive(self.socket_dir, owner):
                await self.forget(owner)
                if self.adopter is not None:
                    await self.adopter.interrupted(owner, scope, receive, send)
                    return
                await lost_session(owner)(scope, receive, send)
                return
            detail = f"Forwarding to worker {owner}, which owns this session, failed: {error!r}"
            await JSONResponse(status_code=502, content={"detail": detail})(scope, receive, send)

    async def relay_when_reachable(self, owner: str, exchange: "Exchange", body: RequestBody) -> None:
        """Relay, retrying while the owner lives but cannot take the connection yet (its backlog is full)."""
        deadline = None
        pause = FIRST_RETRY_PAUSE_SECONDS
        while True:
            try:
                await exchange.relay(self.session_for(owner), body)
                return
            except aiohttp.ClientConnectorError:  # no connection: nothing of the request was sent
                if not is_alive(self.socket_dir, owner):
                    raise OwnerGone(owner) from None
                now = asyncio.get_running_loop().time()
                deadline = deadline or now + self.busy_wait_seconds
                if now >= deadline:
                    raise OwnerBusy(owner) from None
                await asyncio.sleep(pause)
                pause = min(2 * pause, LAST_RETRY_PAUSE_SECONDS)

    def session_for(self, owner: str) -> aiohttp.ClientSession:
        session = self.sessions.get(owner)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(
                    socket_path(self.socket_dir, owner), limit=0, keepalive_timeout=FORWARD_KEEP_ALIVE_SECONDS
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=NO_AUTO_HEADERS,
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self.sessions[owner] = session
        return session

    async def forget(self, owner: str) -> None:
        """Close a dead owner's pool and remove what its process left in the socket directory."""
        session = self.sessions.pop(owner, None)
        if session is not None:
            await session.close()
        for path in (socket_path(self.socket_dir, owner), lock_path(self.socket_dir, owner)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()
        self.sessions.clear()


class Exchange:
    """One forwarded request: the caller's body streamed up, the owner's reply streamed down."""

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.body_sent = asyncio.Event()
        self.started = False
        self.finished = False
        self.caller_left = False
        # The first body message read from the caller: a request that reached no owner (aiohttp reads a
        # streamed body's rest only once connected) can then be served from the start by someone else.
        self.first_body: Message = {"type": "http.request", "body": b"", "more_body": False}

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

    async def relay(self, session: aiohttp.ClientSession, body: RequestBody) -> None:
        scope = self.scope
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"] if name not in HOP_BY_HOP]
        if scope.get("client"):
            headers.append((CLIENT_HEADER_NAME, "%s:%d" % tuple(scope["client"])))
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        url = URL.build(scheme="http", host="owner", path=path, query=scope["query_string"].decode("latin-1"), encoded=True)
        # No await before the request starts, so no other task can close the session in between.
        async with session.request(scope["method"], url, headers=headers, data=body) as reply:
            self.started = True
            headers = [(name, value) for name, value in reply.raw_headers if name.lower() not in HOP_BY_HOP]
            await self.send({"type": "http.response.start", "status": reply.status, "headers": headers})
            if reply.content_length is not None and reply.content_length <= WHOLE_REPLY_BYTES:
                # A small reply of known length goes back in one message.
                body = await reply.read()
                self.finished = True
                await self.send({"type": "http.response.body", "body": body, "more_body": False})
                return
            async for chunk in reply.content.iter_any():
                await self.send({"type": "http.response.body", "body": chunk, "more_body": True})
            self.finished = True
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def body_start(self) -> RequestBody:
        """The request body for aiohttp: the bytes, if they came in one message; otherwise a stream."""
        if not any(name in (b"content-length", b"transfer-encoding") for name, _ in self.scope["headers"]):
            self.body_sent.set()
            return None
        first = self.first_body = await self.next_body_message()
        if not first.get("more_body", False):
            self.body_sent.set()
            return first.get("body", b"")
        return self.body_stream(first.get("body", b""))

    async def body_stream(self, first_chunk: bytes) -> AsyncIterator[bytes]:
        yield first_chunk
        while True:
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

    def replay(self) -> Receive:
        """The caller's request again from the start, for a request that reached no owner."""
        pending = [self.first_body]

        async def receive() -> Message:
            return pending.pop() if pending else await self.receive()

        return receive

    async def cancel_when_caller_leaves(self, relaying: asyncio.Task) -> None:
        """Cancelling the relay closes the connection to the owner, which then cancels its handler."""
        await self.body_sent.wait()
        while (await self.receive())["type"] != "http.disconnect":
            pass
        if not self.finished:
            self.caller_left = True
            relaying.cancel()
