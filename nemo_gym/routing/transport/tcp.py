"""The TCP transport: the replicas of a replica set, each on its own host, reached over their forwarding ports.

Every worker of a replica listens on the replica's forwarding port (``SO_REUSEPORT``: the kernel
spreads the connections over them; the replica's main process holds the port from start to stop,
``claim_forward_port``). A request that reaches the port must carry a valid replica credential
(``credentials``), checked as soon as its head is complete, or it gets 401, the connection is closed
and it is never handled; a valid one, once its body is checked against the credential, is handed to
the app (the router's ``from_replica``), which serves it here or sends it on to the owner worker on
this host, whose own lost-session policy answers if that worker is gone. The port has the public
port's time limits, and holds only so many connections that have not yet authenticated
(``Doorkeeper``): anyone the network lets reach it can connect.

Liveness, per replica address, from what the network says and never from a guess: a refused
connection proves the replica gone (nothing listens on its port: every process of it is dead); a
connect that gets no answer in ``CONNECT_TIMEOUT_SECONDS`` (a host down, partitioned, or a network
error) is silence, and a replica counts as dead only once every attempt for
``peer_dead_after_seconds`` has been silent. A frozen host's kernel still accepts connections, so a
frozen replica is never silent: its requests wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import resource
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.protocols.input_limits import InputLimits, LimitedHttpToolsProtocol
from nemo_gym.routing.exchange import replaying
from nemo_gym.routing.replica import ReplicaPeer, owner_label, parse_replica
from nemo_gym.routing.exchange import Stamp
from nemo_gym.routing.transport.connection import OwnerConnection, PooledTransport
from nemo_gym.routing.transport.credentials import AUTH_HEADER, AUTH_HEADER_KEY, ReplicaCredentials, body_digest, request_target
from nemo_gym.routing.transport.private_server import PrivateServer

# Set in the scope of a request the forwarding port accepted: the worker its credential sends it to, and
# the SHA-256 its body must have.
REPLICA_WORKER_SCOPE_KEY = "nemo_gym.replica_worker"
BODY_DIGEST_SCOPE_KEY = "nemo_gym.replica_body_digest"
# The cap on a worker's connections that have not yet authenticated, where the open-file limit is none.
UNAUTHENTICATED_CAP = 4096
CONNECT_TIMEOUT_SECONDS = 1.0
# TCP keep-alive on every connection to a replica: a host that goes away under an open connection (down or
# cut off, not frozen: a frozen host's kernel answers the probes) breaks it within about 5 + 2 s (the user
# timeout below ends the probing), where the request would otherwise wait for a reply forever.
KEEPALIVE = ((socket.TCP_KEEPIDLE, 5), (socket.TCP_KEEPINTVL, 2), (socket.TCP_KEEPCNT, 3))
# Keep-alive probes only an idle connection: a request written on a kept connection to a host that went
# away stays unacknowledged, and the kernel would retransmit it for many minutes. With this user timeout
# the kernel gives such a connection up (ETIMEDOUT); the replica has then been silent at least this long.
# A frozen host's kernel acknowledges what it is sent, so its connections never time out.
USER_TIMEOUT_SECONDS = 5
# The default of the ``peer_dead_after_seconds`` setting.
PEER_DEAD_AFTER_SECONDS = 30.0


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


def tls_contexts(certfile: str, keyfile: str, ca_file: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Mutual TLS between replicas: the client's and the server's contexts; each side shows its certificate
    and checks the other's against ``ca_file`` (the client also checks the replica's host name)."""
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    client.load_cert_chain(certfile, keyfile)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca_file)
    server.load_cert_chain(certfile, keyfile)
    server.verify_mode = ssl.CERT_REQUIRED
    return client, server


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


class ReplicaPortProtocol(LimitedHttpToolsProtocol):
    """The forwarding port's HTTP protocol: the public port's limits, and the ``Doorkeeper``'s admission.

    A head is checked as soon as it is complete: without a valid credential, 401 and the connection closed
    before any of its body is read; with one, the credential's worker and body digest go into the scope."""

    def __init__(self, *args: Any, doorkeeper: Doorkeeper, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.doorkeeper = doorkeeper
        self.counted = False
        self.unauthorized = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.doorkeeper.full():
            self.done = True
            self.disarm()
            transport.abort()
            return
        self.doorkeeper.unauthenticated += 1
        self.counted = True

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


class TcpTransport(PooledTransport):
    """The ``Transport`` of one replica's worker to the other replicas. A peer is a ``ReplicaPeer``: a worker of
    another replica, reached at that replica's forwarding address (``host:port``), under which its connections
    are kept (shared by the replica's workers) and its liveness is known. Each request to a peer carries a
    credential for it, which this transport stamps (``stamper``).

    ``replica`` is this replica's own (public) address, which credentials name; its forwarding port
    ``forward_port`` listens on ``bind_host``.
    ``client_tls`` and ``server_tls`` (both or neither) put TLS between the replicas.
    """

    def __init__(
        self,
        credentials: ReplicaCredentials,
        replica: str,
        bind_host: str,
        forward_port: int,
        dead_after_seconds: float = PEER_DEAD_AFTER_SECONDS,
        client_tls: ssl.SSLContext | None = None,
        server_tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__()
        self.credentials = credentials
        self.replica = replica
        self.doorkeeper = Doorkeeper(credentials, replica)
        self.bind_host = bind_host
        self.forward_port = forward_port
        self.dead_after_seconds = dead_after_seconds
        self.client_tls = client_tls
        self.server_tls = server_tls
        self.refused: set[str] = set()
        # Replica address -> when the first of its unbroken run of silent connects began.
        self.silent_since: dict[str, float] = {}

    async def open_connection(self, address: str) -> OwnerConnection:
        """A new connection to a replica's forwarding port; ``OSError`` if it takes none, noting why."""
        parsed = parse_replica(address)
        if parsed is None:
            raise ConnectionRefusedError(f"{address!r} is not a replica address")
        host, port = parsed
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                _, connection = await loop.create_connection(
                    OwnerConnection, host, port, ssl=self.client_tls, server_hostname=host if self.client_tls else None
                )
        except ConnectionRefusedError:
            self.refused.add(address)
            self.silent_since.pop(address, None)
            raise
        except OSError:  # a timeout (TimeoutError is one), no route, a TLS failure: nothing proves it gone
            self.silent_since.setdefault(address, loop.time())
            raise
        self.refused.discard(address)
        self.silent_since.pop(address, None)
        sock = connection.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in KEEPALIVE:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_SECONDS * 1000)
        connection.on_timeout = lambda: self.silent_since.setdefault(address, loop.time() - USER_TIMEOUT_SECONDS)
        return connection

    def address(self, peer: ReplicaPeer) -> str:
        return peer.address

    def is_alive(self, peer: ReplicaPeer) -> bool:
        """False once the replica refused its latest connection, or has been silent for ``dead_after_seconds``."""
        if peer.address in self.refused:
            return False
        since = self.silent_since.get(peer.address)
        return since is None or asyncio.get_running_loop().time() - since < self.dead_after_seconds

    def silent_for(self, address: str) -> float:
        """How long the replica has been silent (0: it answered its latest connection)."""
        since = self.silent_since.get(address)
        return 0.0 if since is None else asyncio.get_running_loop().time() - since

    async def proves_dead(self, peer: ReplicaPeer) -> bool:
        """A connection that broke before its reply proves the replica dead only if it now refuses connections."""
        try:
            connection = await self.open_connection(peer.address)
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        connection.close()
        return False

    def stamper(self, peer: ReplicaPeer) -> Stamp:
        """Stamps a request to ``peer`` with the credential for it (``credentials``), in place of any the caller sent."""

        def stamp(scope: Scope, headers: list[tuple[bytes, bytes]], body: list[bytes]) -> None:
            if any(name == AUTH_HEADER_KEY for name, _ in headers):  # the caller's own: never passed on
                headers[:] = [(name, value) for name, value in headers if name != AUTH_HEADER_KEY]
            method = scope["method"].encode()
            headers.append(self.credentials.header(method, request_target(scope), peer.replica, peer.worker, headers, body))

        return stamp

    def worker_of(self, peer: ReplicaPeer) -> str:
        return peer.worker

    def lost_owner(self, peer: ReplicaPeer) -> str:
        """The peer's worker and replica, and why the replica counts dead."""
        silent = self.silent_for(peer.address)
        why = f"its host has not answered at {peer.address} for {silent:.0f} s" if silent else f"its host refused the connection at {peer.address}: nothing listens there"
        return f"{owner_label(peer.worker, peer.replica)} ({why})"

    def busy_detail(self, peer: ReplicaPeer, waited_seconds: float) -> str:
        return (
            f"Replica {peer.replica}, whose worker {peer.worker} owns this session, has not answered at {peer.address} for {waited_seconds:g} s; the "
            f"session is kept unless its host stays silent for {self.dead_after_seconds:g} s (peer_dead_after_seconds). Retry later."
        )

    @contextlib.asynccontextmanager
    async def serving(self, worker_id: str, app: ASGIApp | None, limits: InputLimits) -> AsyncIterator[None]:
        """Serve ``app`` (credentials checked first) on the replica's forwarding port, with the replica's other workers."""
        if app is None:
            yield
            return
        protocol = functools.partial(ReplicaPortProtocol, doorkeeper=self.doorkeeper)
        # Every request here was admitted with a credential that binds the sender's reading of the session: it is taken as
        # read. ``app`` is the router's entrance, which cancels a handler whose caller left itself.
        private = PrivateServer(app, limits.for_replicas(), protocol, tls=self.server_tls, guard=BodyChecked, trusts_readings=True, cancels=False)
        await private.start(reuse_port_socket(self.bind_host, self.forward_port))
        try:
            yield
        finally:
            await private.stop()
