"""A pool of keep-alive connections labelled with the worker each reached, so a session's requests go on a
connection to its owner and are served there, with no hop to another worker.

A routed server names, on every reply, the worker whose public socket accepted the connection
(``X-NeMo-Gym-Worker``), and a TCP connection stays with the worker that accepted it. So each
connection is labelled by its latest reply, and a request of a session owned by worker W goes on a
free connection labelled W. The owner is read from the session cookie's payload, which is readable
without the secret (Starlette's cookie is ``base64(json).timestamp.signature``). With no free
connection to the owner a new one is opened; it lands on whichever worker accepts it, which forwards
the request if it is not the owner, and is labelled by its reply. A label can only be stale, never
harmful: the server forwards a request to its owner from any worker. A request that names no owner
(one that starts a session) goes on a free connection to the worker with the most free ones, once the
server has been seen to use owners (before that, and for other servers, on the caller's shared session).

Each connection is an aiohttp ``ClientSession`` over its own ``TCPConnector(limit=1)``. aiohttp is the
project's client already, and its pool hands any idle connection to any request for the host, with no
public way to pick one; a connector limited to one connection is its documented way to hold exactly
one connection, so every request on it travels on that connection (or, if the server closed it, on a
new one, which its reply labels again). httpx's pool picks connections internally in the same way.

In a replica set (the same server on several hosts, ``nemo_gym.routing.replica``) the cookie names the
owner's replica too, by its public address: the request goes straight to that replica (the URL's host
and port replaced by it), on connections kept and labelled per replica and worker, so it crosses no
host and, once labelled, no worker. A replica this client cannot connect to (an address only the
replicas reach, or a replica that is gone) gets the request at the URL it was given instead, whose
server forwards it or answers for the owner as for any client.

A request with no session cookie (one that starts a session) goes, when the instance lists other
replicas (its ``replicas`` setting), to the next of the given URL and those replicas in turn: round
robin, so new sessions, the unit of load here (each session's later requests all go to its owner),
spread evenly over them whatever their timing. A listed replica this client cannot connect to is
skipped for new sessions as for owners, and its turn passes to the next.

Bounded per server instance: at most ``MAX_KEPT_CONNECTIONS`` open; a request that finds none free
while that many are busy still gets a new one, and on its return the least recently used free
connection is closed. A connection idle for ``IDLE_SECONDS`` is closed by its connector (the servers
keep connections for longer, so the client always closes first), and its label is forgotten. Nothing
is kept per session.
"""

from __future__ import annotations

import collections
import json
import time
from base64 import b64decode
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any

import aiohttp
import yarl

from nemo_gym.routing.replica import REPLICA_KEY, parse_replica, replica_address
from nemo_gym.sessions.worker import OWNER_KEY, WORKER_HEADER, is_worker_id

MAX_KEPT_CONNECTIONS = 1024
IDLE_SECONDS = 15.0
LOST_SESSION = 410
# A replica this client could not connect to is not tried directly again for this long.
UNREACHABLE_SECONDS = 30.0


def cookie_session(cookie: str | None) -> dict[str, Any]:
    """A Starlette session cookie's (unverified) payload; empty if it has none."""
    if not cookie:
        return {}
    try:
        session = json.loads(b64decode(cookie.rsplit(".", 2)[0], validate=True))
    except ValueError:
        return {}
    return session if isinstance(session, dict) else {}


def cookie_owner(cookie: str | None) -> str | None:
    """The owner worker a Starlette session cookie names, read from its (unverified) payload; None if none."""
    owner = cookie_session(cookie).get(OWNER_KEY)
    return owner if is_worker_id(owner) else None


def cookie_replica(cookie: str | None) -> tuple[str, int] | None:
    """The host and port of the owner replica a session cookie names (a replica set's); None if none."""
    return parse_replica(cookie_session(cookie).get(REPLICA_KEY))


class Connection:
    """One keep-alive connection and the worker its latest reply came from."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.worker: str | None = None
        self.idle_since = 0.0


class ServerConnections:
    """The labelled connections to one server instance: free ones by worker, most recently used last."""

    def __init__(self, max_kept: int, session_options: dict[str, Any]) -> None:
        self.max_kept = max_kept
        self.session_options = session_options
        self.free: dict[str | None, collections.deque[Connection]] = collections.defaultdict(collections.deque)
        self.connections: set[Connection] = set()

    async def take(self, owner: str | None) -> Connection:
        """A free connection to ``owner`` (to the worker with most free ones if None, or one the server left
        unlabelled); else a new one."""
        if owner is None:
            owner = max(self.free, key=lambda worker: len(self.free[worker]), default=None)
        return await self.take_free(owner) or await self.take_free(None) or self.new()

    async def take_free(self, worker: str | None) -> Connection | None:
        free = self.free.get(worker)
        if not free:
            return None
        connection = free.pop()
        if time.monotonic() - connection.idle_since < IDLE_SECONDS:
            return connection
        # Its connector has closed it, and the older ones too: where they would reconnect is unknown.
        free.append(connection)
        await self.drop(worker)
        return None

    def new(self) -> Connection:
        connector = aiohttp.TCPConnector(limit=1, keepalive_timeout=IDLE_SECONDS)
        connection = Connection(aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), **self.session_options))
        self.connections.add(connection)
        return connection

    async def give_back(self, connection: Connection, worker: str | None) -> None:
        connection.worker = worker
        connection.idle_since = time.monotonic()
        self.free[worker].append(connection)
        while len(self.connections) > self.max_kept and any(self.free.values()):
            oldest = min((free for free in self.free.values() if free), key=lambda free: free[0].idle_since)
            await self.close(oldest.popleft())

    async def drop(self, worker: str | None) -> None:
        """Close the free connections labelled ``worker``."""
        free = self.free.pop(worker, collections.deque())
        while free:
            await self.close(free.popleft())

    async def close(self, connection: Connection) -> None:
        self.connections.discard(connection)
        await connection.session.close()


class OwnerPool:
    """Labelled connections per server instance. ``session_options`` go to each connection's aiohttp session."""

    def __init__(self, max_kept: int = MAX_KEPT_CONNECTIONS, **session_options: Any) -> None:
        self.max_kept = max_kept
        self.session_options = session_options
        self.servers: dict[str, ServerConnections] = {}
        # Replica address -> until when it is not tried directly (this client could not connect to it).
        self.unreachable: dict[str, float] = {}
        # Per server instance: whose turn it is for a new session (0: the given URL; i: its i-th replica).
        self.turns: dict[str, int] = collections.defaultdict(int)

    async def request(
        self,
        shared: aiohttp.ClientSession,
        server: str,
        session_cookie: str | None,
        method: str,
        url: str,
        replicas: Sequence[str] = (),
        **kwargs: Any,
    ) -> aiohttp.ClientResponse:
        """Send on a connection to the session's owner (at its replica, in a replica set), or for a new session
        to the given URL or one of the instance's other ``replicas`` (root URLs) in turn, and read the reply
        in full (the connection is then free again); ``shared`` serves servers not seen to use owners."""
        for direct in self.direct_urls(server, session_cookie, url, replicas):
            address = replica_address(direct.host, direct.port)
            if time.monotonic() < self.unreachable.get(address, 0.0):
                continue
            try:
                return await self.request_at(shared, f"{server}@{address}", session_cookie, method, str(direct), **kwargs)
            except aiohttp.ClientConnectorError:  # nothing was sent: the URL's own server takes it
                self.unreachable[address] = time.monotonic() + UNREACHABLE_SECONDS
        return await self.request_at(shared, server, session_cookie, method, url, **kwargs)

    def direct_urls(self, server: str, session_cookie: str | None, url: str, replicas: Sequence[str]) -> Iterator[yarl.URL]:
        """Where to try the request before the given URL: the owner replica a session's cookie names; for a
        new session, the listed replicas whose turn it is, up to the given URL's turn."""
        given = yarl.URL(url)
        if session_cookie:
            replica = cookie_replica(session_cookie)
            if replica is not None:
                yield given.with_host(replica[0]).with_port(replica[1])
            return
        while turn := self.turns[server] % (len(replicas) + 1):
            self.turns[server] = turn + 1
            root = yarl.URL(replicas[turn - 1])
            yield given.with_scheme(root.scheme).with_host(root.host).with_port(root.port)
        self.turns[server] = 1

    async def request_at(
        self, shared: aiohttp.ClientSession, server: str, session_cookie: str | None, method: str, url: str, **kwargs: Any
    ) -> aiohttp.ClientResponse:
        """``request`` to ``url``, on the connections kept for ``server`` (an instance, or one replica of it)."""
        owner = cookie_owner(session_cookie)
        connections = self.servers.get(server)
        if owner is None and connections is None:
            return await read_in_full(shared.request(method, url, **kwargs))
        if connections is None:
            connections = self.servers[server] = ServerConnections(self.max_kept, self.session_options)
        connection = await connections.take(owner)
        try:
            response = await read_in_full(connection.session.request(method, url, **kwargs))
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            # The worker behind it may be gone: its other connections would fail the same way.
            await connections.close(connection)
            if connection.worker is not None:
                await connections.drop(connection.worker)
            raise
        except BaseException:
            await connections.close(connection)
            raise
        if response.status == LOST_SESSION and owner is not None:
            await connections.drop(owner)
        worker = response.headers.get(WORKER_HEADER)
        await connections.give_back(connection, worker if is_worker_id(worker) else None)
        return response

    async def close(self) -> None:
        for connections in self.servers.values():
            for connection in list(connections.connections):
                await connections.close(connection)
        self.servers.clear()


async def read_in_full(reply: Awaitable[aiohttp.ClientResponse]) -> aiohttp.ClientResponse:
    """The reply with its body read: its connection is back in its pool at the body's end, and the
    response still answers ``read()``, ``text()`` and ``json()``."""
    response = await reply
    try:
        await response.read()
    except BaseException:
        response.close()
        raise
    return response
