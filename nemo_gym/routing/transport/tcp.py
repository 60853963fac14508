"""The TCP transport: the replicas of a replica set, each on its own host, reached over their forwarding ports.

A request to another replica carries a replica credential for it (``credentials``), stamped here; the
replica's forwarding port (``replica_port``) admits it and hands it to the app (the router's
``from_replica``), which serves it there or sends it on to the owner worker on that host, whose own
lost-session policy answers if that worker is gone.

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
import socket
import ssl
from collections.abc import AsyncIterator

from starlette.types import ASGIApp, Scope

from nemo_gym.process.public_server import TakesConnections
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.routing.exchange import Stamp
from nemo_gym.routing.replica import ReplicaPeer, owner_label, parse_replica
from nemo_gym.routing.transport.connection import OwnerConnection, PooledTransport
from nemo_gym.routing.transport.credentials import AUTH_HEADER_KEY, ReplicaCredentials, request_target
from nemo_gym.routing.transport.private_server import PrivateServer
from nemo_gym.routing.transport.replica_port import BodyChecked, Doorkeeper, ReplicaPortProtocol, reuse_port_socket

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


def tls_contexts(certfile: str, keyfile: str, ca_file: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Mutual TLS between replicas: the client's and the server's contexts; each side shows its certificate
    and checks the other's against ``ca_file`` (the client also checks the replica's host name)."""
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    client.load_cert_chain(certfile, keyfile)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca_file)
    server.load_cert_chain(certfile, keyfile)
    server.verify_mode = ssl.CERT_REQUIRED
    return client, server


class TcpTransport(PooledTransport):
    """The ``Transport`` of one replica's worker to the other replicas. A peer is a ``ReplicaPeer``: a worker of
    another replica, reached at that replica's forwarding address (``host:port``), under which its liveness is
    known; its connections are kept per worker (``pool``). Each request to a peer carries a
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
        # The forwarding port's server while it serves: it takes the connections this replica's other workers hand here.
        self.port_server: TakesConnections | None = None
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

    def pool(self, peer: ReplicaPeer) -> str:
        """Per worker: a connection the replica's forwarding port gave to another of its workers is handed to the
        worker its request was for (``SessionRouter.from_replica``), and kept for that worker's requests."""
        return peer.worker

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
        self.port_server = private.server
        try:
            yield
        finally:
            self.port_server = None
            await private.stop()
