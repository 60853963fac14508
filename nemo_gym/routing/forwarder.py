"""Forward a request, unchanged, to the worker that owns its session, and stream the reply back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from nemo_gym.routing.liveness import is_alive
from nemo_gym.routing.owner_connection import ConnectionBroken, IdleConnections, OwnerConnection, request_head
from nemo_gym.routing.private_server import CLIENT_HEADER, PRIVATE_KEEP_ALIVE_SECONDS
from nemo_gym.routing.worker import socket_address

if TYPE_CHECKING:
    from nemo_gym.durable.adoption import Adopter

# Shorter than the private server's, so this side always closes an idle connection first and never
# sends a request down a connection the owner is closing.
FORWARD_KEEP_ALIVE_SECONDS = PRIVATE_KEEP_ALIVE_SECONDS / 2
# Framing this hop writes itself: the body's length (or chunks) as it sends it, and no interim
# "100 Continue", since the body goes up with the request.
REFRAMED = frozenset({b"content-length", b"expect"})
# Connection-level headers describe one hop, not the request: each hop sets its own.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
# A live owner that takes no connection (its backlog full while it is busy) is retried, with pauses
# growing from the first to the last, for this long; then the caller gets a 503 with Retry-After.
BUSY_OWNER_WAIT_SECONDS = 30
FIRST_RETRY_PAUSE_SECONDS = 0.005
LAST_RETRY_PAUSE_SECONDS = 0.25
RETRY_AFTER_SECONDS = 1
# A connection that breaks with no reply is a dead owner's only once its life name is free: the kernel
# closes a killed process's sockets one after the other, so its life name is waited for
# this long (with the pauses above) before the owner counts as alive and the caller gets a 502.
OWNER_DEATH_WAIT_SECONDS = 1

# What goes up to the owner: the whole body, a stream of it, or none.
RequestBody = bytes | AsyncIterator[bytes] | None


class OwnerGone(Exception):
    """The owner's process is dead (its life name is free), and the request never reached it.

    ``replay`` gives the request's body again from the start, for whoever serves it instead.
    """

    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.replay: Receive | None = None


class OwnerDied(Exception):
    """The owner's process died while it had the request, before its reply started."""


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
    """Sends requests to owner workers, over a pool of keep-alive connections per owner socket."""

    def __init__(self, socket_dir: str, busy_wait_seconds: float = BUSY_OWNER_WAIT_SECONDS) -> None:
        self.socket_dir = socket_dir
        self.busy_wait_seconds = busy_wait_seconds
        self.pools: dict[str, IdleConnections] = {}
        # A server with durable sessions takes a dead owner's sessions over instead of answering 410.
        self.adopter: Adopter | None = None

    async def forward(self, owner: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward and stream back; 503 if the owner stays too busy to connect; if it is dead, 410, or
        the adopter's answer when the server keeps its sessions durable.

        A caller that leaves cancels it. Only a dead owner's pooled connections are dropped: closing a
        live owner's would abort the requests it is serving.
        """
        try:
            await self.try_forward(owner, scope, receive, send, self.busy_wait_seconds)
        except OwnerGone as gone:
            if self.adopter is not None:
                await self.adopter.take_over(owner, scope, gone.replay or receive, send)
                return
            await lost_session(owner)(scope, receive, send)
        except OwnerDied:
            if self.adopter is not None:
                await self.adopter.interrupted(owner, scope, receive, send)
                return
            await lost_session(owner)(scope, receive, send)
        except OwnerBusy:
            await busy_owner(owner, self.busy_wait_seconds)(scope, receive, send)

    async def try_forward(self, owner: str, scope: Scope, receive: Receive, send: Send, busy_wait_seconds: float) -> None:
        """Forward and stream back; raises ``OwnerGone``, ``OwnerDied`` or ``OwnerBusy``, with nothing sent, if it cannot."""
        exchange = Exchange(scope, receive, send)
        try:
            await exchange.run(lambda body: self.relay_when_reachable(owner, exchange, body, busy_wait_seconds))
        except OwnerGone as gone:
            await self.forget(owner)
            gone.replay = exchange.replay()
            raise
        except (CallerLeft, ConnectionBroken) as error:
            if exchange.caller_left:
                return
            if exchange.started:
                raise  # the reply is half sent: only a closed connection can tell the caller
            if await self.proves_dead(owner):
                await self.forget(owner)
                raise OwnerDied(owner) from error
            detail = f"Forwarding to worker {owner}, which owns this session, failed: {error!r}"
            await JSONResponse(status_code=502, content={"detail": detail})(scope, receive, send)

    async def proves_dead(self, owner: str) -> bool:
        """Whether the owner is dead, for a connection that broke before its reply started: its life
        lock is free now or within ``OWNER_DEATH_WAIT_SECONDS``; False for an owner that stays alive."""
        deadline = asyncio.get_running_loop().time() + OWNER_DEATH_WAIT_SECONDS
        pause = FIRST_RETRY_PAUSE_SECONDS
        while is_alive(self.socket_dir, owner):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(2 * pause, LAST_RETRY_PAUSE_SECONDS)
        return True

    async def relay_when_reachable(self, owner: str, exchange: "Exchange", body: RequestBody, busy_wait_seconds: float) -> None:
        """Relay, retrying while the owner lives but cannot take the connection yet (its backlog is full).

        A request the owner provably did not take (``OwnerConnection.unread``: a pooled connection it
        closed meanwhile, or its end closed with the request unread, as when it dies) is sent again,
        once, on a new connection, if its body can be given again (``Exchange.replayable``). An owner
        that is gone then takes no connection (``OwnerGone``: the request goes to whoever serves in its
        place). A request the owner may have read is never sent twice.
        """
        deadline = None
        pause = FIRST_RETRY_PAUSE_SECONDS
        again = False
        while True:
            pool = self.pool_for(owner)
            try:
                connection = await (pool.connect() if again else pool.connection())
            except OSError:  # no connection: nothing of the request was sent
                if not is_alive(self.socket_dir, owner):
                    raise OwnerGone(owner) from None
                now = asyncio.get_running_loop().time()
                deadline = deadline or now + busy_wait_seconds
                if now >= deadline:
                    raise OwnerBusy(owner) from None
                await asyncio.sleep(pause)
                pause = min(2 * pause, LAST_RETRY_PAUSE_SECONDS)
                continue
            kept = False
            try:
                kept = await exchange.relay(connection, body)
            except ConnectionBroken:
                if again or not connection.unread() or not exchange.replayable():
                    raise
                body, again = exchange.body_again(body), True
                continue
            finally:
                if kept:
                    self.pool_for(owner).give_back(connection)
                else:
                    connection.close()
            return

    def pool_for(self, owner: str) -> IdleConnections:
        pool = self.pools.get(owner)
        if pool is None:
            pool = self.pools[owner] = IdleConnections(socket_address(self.socket_dir, owner), FORWARD_KEEP_ALIVE_SECONDS)
        return pool

    async def forget(self, owner: str) -> None:
        """Close a dead owner's pool (its names went with its process: nothing is left to remove)."""
        pool = self.pools.pop(owner, None)
        if pool is not None:
            pool.close()

    async def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()


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
        # The first body message read from the caller: a request that reached no owner (the rest of a
        # streamed body is read only once connected) can then be served from the start by someone else.
        self.first_body: Message = {"type": "http.request", "body": b"", "more_body": False}
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
        headers = [(name, value) for name, value in scope["headers"] if name not in HOP_BY_HOP and name not in REFRAMED]
        if scope.get("client"):
            headers.append((CLIENT_HEADER, b"%s:%d" % (scope["client"][0].encode(), scope["client"][1])))
        if isinstance(body, bytes):
            headers.append((b"content-length", b"%d" % len(body)))
        elif body is not None:
            headers.append((b"transfer-encoding", b"chunked"))
        await connection.write(request_head(scope, headers) + (body if isinstance(body, bytes) else b""))
        if body is not None and not isinstance(body, bytes):
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
        first = self.first_body = await self.next_body_message()
        if not first.get("more_body", False):
            self.body_sent.set()
            return first.get("body", b"")
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
        """Whether the request can be sent again whole: its body was read in one message (or it has none),
        or a streamed body was not read past its first message. A stream read further is not kept, so
        a request whose body streamed is sent again only if its connection broke that early."""
        return not self.read_past_first and not self.caller_left

    def body_again(self, body: RequestBody) -> RequestBody:
        """The body to send again (``replayable`` requests only): the same bytes, or the stream from its start."""
        if body is None or isinstance(body, bytes):
            return body
        return self.body_stream(self.first_body.get("body", b""))

    def replay(self) -> Receive:
        """The caller's request again from the start, for a request that reached no owner."""
        return replaying(self.first_body, self.receive)

    async def cancel_when_caller_leaves(self, relaying: asyncio.Task) -> None:
        """Cancelling the relay closes the connection to the owner, which then cancels its handler."""
        await self.body_sent.wait()
        while (await self.receive())["type"] != "http.disconnect":
            pass
        if not self.finished:
            self.caller_left = True
            relaying.cancel()


def replaying(first: Message, receive: Receive) -> Receive:
    """``receive``, with a message already taken from it given back first."""
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
