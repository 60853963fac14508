"""A replica's forwarding port: what it admits and how it reads a request, before the app sees any of it.

Every worker of a replica listens on the replica's forwarding port (``SO_REUSEPORT``: the kernel spreads the
connections over them; the replica's main process holds the port from start to stop, ``claim_forward_port``).
A request that reaches the port must carry a valid replica credential (``credentials``), checked as soon as its
head is complete (``ReplicaPortProtocol``), or it gets 401, the connection is closed and it is never handled; a
valid one, once its body is checked against the credential (``BodyChecked``), is handed to the app. The port
has the public port's time limits, and holds only so many connections that have not yet authenticated
(``Doorkeeper``): anyone the network lets reach it can connect.
"""

from __future__ import annotations

import asyncio
import hmac
import resource
import socket
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.protocols.handing_off import HandingOffProtocol
from nemo_gym.routing.exchange import replaying
from nemo_gym.routing.transport.credentials import AUTH_HEADER, AUTH_HEADER_KEY, ReplicaCredentials, body_digest

# Set in the scope of a request the forwarding port accepted: the worker its credential sends it to, and
# the SHA-256 its body must have.
REPLICA_WORKER_SCOPE_KEY = "nemo_gym.replica_worker"
BODY_DIGEST_SCOPE_KEY = "nemo_gym.replica_body_digest"
# The cap on a worker's connections that have not yet authenticated, where the open-file limit is none.
UNAUTHENTICATED_CAP = 4096

def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` that the replica's other workers can bind too; ``OSError`` if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, so asyncio sets TCP_NODELAY on the connections it accepts (it skips a socket of
    # protocol 0), as on a server's public port: else a reply written in two parts waits ~40 ms for an ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def claim_forward_port(host: str, port: int = 0) -> socket.socket:
    """The replica's hold on its forwarding port (a free one for 0), for as long as it runs: bound, never
    listening, so the kernel hands the port to no one else while the workers come and go."""
    return reuse_port_socket(host, port)


class Doorkeeper:
    """What a worker's forwarding port admits: heads with a valid replica credential, and at most
    ``max_unauthenticated`` connections at a time that have not yet sent one (a connection beyond them is
    closed as soon as it is accepted), so that connections that never authenticate cannot take the
    descriptors the public port needs. By default (None) a quarter of the worker's open-file limit as it is
    when a connection comes (``prlimit`` may change it while the worker runs): whoever fills it leaves
    three quarters to the rest."""

    def __init__(self, credentials: ReplicaCredentials, replica: str, max_unauthenticated: int | None = None) -> None:
        self.credentials = credentials
        self.replica = replica
        self.max_unauthenticated = max_unauthenticated
        self.unauthenticated = 0

    def full(self) -> bool:
        """Whether no more connections that have not authenticated may be held now."""
        cap = self.max_unauthenticated
        if cap is None:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            cap = UNAUTHENTICATED_CAP if soft == resource.RLIM_INFINITY else max(1, soft // 4)
        return self.unauthenticated >= cap

    def admit(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[str, str] | None:
        """The worker a head's credential sends it to, and the digest its body must have; None if it has no valid one.

        A forwarded request's body has a length (the forwarder sends it whole), which the credential covers."""
        values = [value for name, value in headers if name == AUTH_HEADER_KEY]
        lengths = [value for name, value in headers if name == b"content-length"]
        if len(values) != 1 or len(lengths) > 1 or any(name == b"transfer-encoding" for name, _ in headers):
            return None
        length = int(lengths[0]) if lengths else 0
        return self.credentials.admit(values[0], method, target, self.replica, headers, length)


class ReplicaPortProtocol(HandingOffProtocol):
    """The forwarding port's HTTP protocol: the public port's limits, and the ``Doorkeeper``'s admission.

    A head is checked as soon as it is complete: without a valid credential, 401 and the connection closed
    before any of its body is read; with one, the credential's worker and body digest go into the scope.
    Its connections can be handed to another worker of the replica as the public port's are (``handing_off``):
    the receiver reads the same bytes, and checks their credential again."""

    def __init__(self, *args: Any, doorkeeper: Doorkeeper, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.doorkeeper = doorkeeper
        self.counted = False
        self.unauthorized = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # A handed connection's bytes are read once it is counted, so that its credential uncounts it.
        received, self.received = self.received, b""
        super().connection_made(transport)
        if self.doorkeeper.full():
            self.done = True
            self.disarm()
            transport.abort()
            return
        self.doorkeeper.unauthenticated += 1
        self.counted = True
        if received:
            self.data_received(received)

    def connection_lost(self, exc: Exception | None) -> None:
        self.uncount()
        super().connection_lost(exc)

    def uncount(self) -> None:
        if self.counted:
            self.counted = False
            self.doorkeeper.unauthenticated -= 1

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.unauthorized and not self.transport.is_closing():
            self.unauthorized = False
            self.refuse(401, f"This is a replica's forwarding port: a request needs exactly one valid {AUTH_HEADER} header.")

    def on_headers_complete(self) -> None:
        if self.done:
            return
        admitted = self.doorkeeper.admit(self.parser.get_method(), self.url, self.headers)
        if admitted is None:
            self.unauthorized = self.done = True  # refused once the parser returns; nothing more is parsed
            return
        self.uncount()
        # In place: the scope's headers are this list.
        self.headers[:] = [(name, value) for name, value in self.headers if name != AUTH_HEADER_KEY]
        self.scope[REPLICA_WORKER_SCOPE_KEY], self.scope[BODY_DIGEST_SCOPE_KEY] = admitted
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self.done:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self.done:
            super().on_message_complete()


class BodyChecked:
    """In front of the forwarding port's entrance: the body, read whole, must be the one the credential
    names, or 401 and the app never sees the request; it is handed on only once checked."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        messages = [await receive()]
        while messages[-1]["type"] == "http.request" and messages[-1].get("more_body", False):
            messages.append(await receive())
        if messages[-1]["type"] != "http.request":
            return  # the sender left
        if not hmac.compare_digest(body_digest([message.get("body", b"") for message in messages]), scope.pop(BODY_DIGEST_SCOPE_KEY)):
            detail = f"The request's body is not the one its {AUTH_HEADER} header was made for."
            await JSONResponse(status_code=401, content={"detail": detail}, headers={"connection": "close"})(scope, receive, send)
            return
        await self.app(scope, replaying(receive, *messages), send)
