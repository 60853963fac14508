"""The TCP transport: the replicas of a replica set, each on its own host, reached over their forwarding ports.

Every worker of a replica listens on the replica's forwarding port (``SO_REUSEPORT``: the kernel
spreads the connections over them; the replica's main process holds the port from start to stop,
``claim_forward_port``). A request that reaches the port must carry a valid replica credential
(``credentials``), or it gets 401 and is never handled; a valid one is handed to the app (the
router's ``from_replica``), which serves it here or sends it on to the owner worker on this host,
whose own lost-session policy answers if that worker is gone.

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
import socket
import ssl
from collections.abc import AsyncIterator

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.middleware.input_limits import InputLimits
from nemo_gym.routing.replica import parse_replica
from nemo_gym.routing.transport.connection import IdleConnections, OwnerConnection
from nemo_gym.routing.transport.credentials import AUTH_HEADER, AUTH_HEADER_KEY, ReplicaCredentials
from nemo_gym.routing.transport.private_server import PrivateServer

# Set in the scope of a request the forwarding port accepted: the worker its credential sends it to.
REPLICA_WORKER_SCOPE_KEY = "nemo_gym.replica_worker"
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


class Authenticated:
    """The forwarding port's entrance: one valid replica credential, or 401 and the request is never handled."""

    def __init__(self, app: ASGIApp, credentials: ReplicaCredentials, replica: str) -> None:
        self.app = app
        self.credentials = credentials
        self.replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        values = [value for name, value in scope["headers"] if name == AUTH_HEADER_KEY]
        worker = self.credentials.worker(values[0], scope, self.replica) if len(values) == 1 else None
        if worker is None:
            detail = f"This is a replica's forwarding port: a request needs exactly one valid {AUTH_HEADER} header."
            await JSONResponse(status_code=401, content={"detail": detail})(scope, receive, send)
            return
        scope["headers"] = [(name, value) for name, value in scope["headers"] if name != AUTH_HEADER_KEY]
        scope[REPLICA_WORKER_SCOPE_KEY] = worker
        await self.app(scope, receive, send)


class TcpTransport:
    """The ``Transport`` of one replica's worker to the other replicas, named by forwarding address (``host:port``).

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
        self.credentials = credentials
        self.replica = replica
        self.bind_host = bind_host
        self.forward_port = forward_port
        self.dead_after_seconds = dead_after_seconds
        self.client_tls = client_tls
        self.server_tls = server_tls
        self.pools: dict[str, IdleConnections] = {}
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

    def pool_for(self, address: str) -> IdleConnections:
        pool = self.pools.get(address)
        if pool is None:
            pool = self.pools[address] = IdleConnections(address, self.open_connection)
        return pool

    async def connect(self, owner: str, fresh: bool = False) -> OwnerConnection:
        pool = self.pool_for(owner)
        return await (pool.connect() if fresh else pool.connection())

    def give_back(self, owner: str, connection: OwnerConnection) -> None:
        self.pool_for(owner).give_back(connection)

    def is_alive(self, worker_id: str) -> bool:
        """False once the replica refused its latest connection, or has been silent for ``dead_after_seconds``."""
        if worker_id in self.refused:
            return False
        since = self.silent_since.get(worker_id)
        return since is None or asyncio.get_running_loop().time() - since < self.dead_after_seconds

    def silent_for(self, address: str) -> float:
        """How long the replica has been silent (0: it answered its latest connection)."""
        since = self.silent_since.get(address)
        return 0.0 if since is None else asyncio.get_running_loop().time() - since

    async def proves_dead(self, worker_id: str) -> bool:
        """A connection that broke before its reply proves the replica dead only if it now refuses connections."""
        try:
            connection = await self.open_connection(worker_id)
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
        connection.close()
        return False

    def forget(self, owner: str) -> None:
        pool = self.pools.pop(owner, None)
        if pool is not None:
            pool.close()

    @contextlib.asynccontextmanager
    async def serving(self, worker_id: str, app: ASGIApp | None, limits: InputLimits) -> AsyncIterator[None]:
        """Serve ``app`` (credentials checked first) on the replica's forwarding port, with the replica's other workers."""
        if app is None:
            yield
            return
        private = PrivateServer(app, limits, tls=self.server_tls, guard=lambda entrance: Authenticated(entrance, self.credentials, self.replica))
        await private.start(reuse_port_socket(self.bind_host, self.forward_port))
        try:
            yield
        finally:
            await private.stop()

    async def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
