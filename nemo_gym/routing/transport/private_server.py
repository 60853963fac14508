"""This worker's app, served a second time on a listener of its own that only its siblings reach.

Other workers forward the requests of this worker's sessions here. It runs on the worker's event
loop, does not run the app's lifespan again, and adds no ``date`` or ``server`` header, so a
forwarded reply is exactly what the app produced. The transport binds the listener, and may give an
HTTP protocol of its own that refuses a peer (the Unix transport's: a process of another user; the TCP
transport's: a head without a valid replica credential), a guard in front of the entrance (the TCP
transport's: the body its credential names) and TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.protocols.input_limits import InputLimits, LimitedHttpToolsProtocol
from nemo_gym.middleware.cancel_on_disconnect import CancelOnDisconnect
from nemo_gym.process.public_server import TakesConnections
from nemo_gym.sessions.cookie import SESSION_READ_HEADER, SESSION_READ_SCOPE_KEY, decoded_reading

# The forwarding worker's note of the caller's address; trusted only on arrival here.
CLIENT_HEADER = b"x-nemo-gym-client"
# Longer than the forwarder's, so the forwarding side always closes an idle connection first.
PRIVATE_KEEP_ALIVE_SECONDS = 30
# The kernel caps a listen backlog at net.core.somaxconn, so asking for more gets the system's maximum:
# forwards queue there while this worker is busy, instead of being refused.
MAX_BACKLOG = 1 << 16


class PrivateEntrance:
    """Where forwarded requests enter the owner: straight into the app, never through the router.

    The caller's address is restored from the forwarding worker's header, and a handler is cancelled
    if the forwarding worker hangs up (its caller left). With ``trusts_readings`` (a listener only this
    host's workers reach, or whose every request a replica credential binds the header to), the session
    the forwarding worker read from the cookie is taken as read (``SESSION_READ_HEADER``); elsewhere that
    header is dropped. ``cancels``: False where the app is the router's entrance from the other replicas, whose
    own layers cancel (``CancelOnDisconnect`` around what it serves here, the forwarder for what it sends on).
    """

    def __init__(self, app: ASGIApp, trusts_readings: bool = False, cancels: bool = True) -> None:
        self.app = CancelOnDisconnect(app) if cancels else app
        self.trusts_readings = trusts_readings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            restore(scope, self.trusts_readings)
        await self.app(scope, receive, send)


def restore(scope: Scope, trusts_readings: bool) -> None:
    """The caller's address, and (``trusts_readings``) the forwarding worker's reading of the session, from their headers."""
    headers = []
    for name, value in scope["headers"]:
        if name == CLIENT_HEADER:
            host, _, port = value.decode("latin-1").rpartition(":")
            scope["client"] = (host, int(port))
        elif name == SESSION_READ_HEADER:
            if trusts_readings:
                with contextlib.suppress(ValueError):  # not a reading: the session layer reads the cookie itself
                    scope[SESSION_READ_SCOPE_KEY] = decoded_reading(value)
        else:
            headers.append((name, value))
    scope["headers"] = headers


class _EmbeddedServer(TakesConnections):
    """A uvicorn server that leaves signal handling to the worker's own server."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class PrivateServer:
    def __init__(
        self,
        app: ASGIApp,
        limits: InputLimits,
        http: Callable[..., LimitedHttpToolsProtocol] = LimitedHttpToolsProtocol,
        tls: ssl.SSLContext | None = None,
        guard: Callable[[ASGIApp], ASGIApp] | None = None,
        trusts_readings: bool = False,
        cancels: bool = True,
    ) -> None:
        """``limits``: the listener's own (the transport's choice); ``guard`` wraps the entrance (the TCP
        transport's check of a request's body against its credential); ``tls`` serves over TLS."""
        entrance = PrivateEntrance(app, trusts_readings, cancels)
        config = uvicorn.Config(
            entrance if guard is None else guard(entrance),
            http=functools.partial(http, limits=limits),
            backlog=MAX_BACKLOG,
            lifespan="off",
            server_header=False,
            date_header=False,
            access_log=False,
            log_level="warning",
            timeout_keep_alive=PRIVATE_KEEP_ALIVE_SECONDS,
            timeout_graceful_shutdown=5,
        )
        if tls is not None:
            config.load()
            config.ssl = tls
        self.server = _EmbeddedServer(config)
        self.task: asyncio.Task | None = None

    async def start(self, listener: socket.socket) -> None:
        """Serve on ``listener``, a bound socket (uvicorn makes it listen), once it is serving."""
        self.task = asyncio.create_task(self.server.serve(sockets=[listener]))
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError(f"private server on {listener.getsockname()!r} stopped during start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task
