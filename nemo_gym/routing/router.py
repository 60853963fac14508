"""The session router: the ASGI middleware in front of the app that sends each request to its owner.

It sits outside the app's session layer on purpose: a forwarded request never reaches this worker's
session layer, so the caller gets exactly one Set-Cookie, the owner's. Requests that other
workers forward here arrive on the private listener, which bypasses the router
(``transport.private_server``). It owns recovery: when a forward cannot reach its owner, it answers a
busy owner itself, and for a dead one asks the lost-session policy (``lost``) and does what it says.

In a replica set (``replica``), a session whose owner is a worker of another replica is forwarded to
that replica's forwarding port (``replicas``, over ``transport.tcp``), where ``from_replica`` takes it:
served there, or sent on to the owner worker of that host. A session of this replica's takes the
one-host path, unchanged.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.routing.exchange import replaying
from nemo_gym.routing.forwarder import Forwarder, OwnerBusy, OwnerDied, OwnerGone
from nemo_gym.routing.lost import Decision, ForwardTo, LostSessionPolicy, Reply, ServeHere
from nemo_gym.routing.owner import AmbiguousSession, OwnerReader, owner_of
from nemo_gym.routing.placement import Placement
from nemo_gym.routing.replica import forward_address, owner_label, replica_of
from nemo_gym.routing.request_id import ID_HEADER, SAFE_METHODS, id_of, new_id_header
from nemo_gym.routing.transport.credentials import AUTH_HEADER_KEY, request_target
from nemo_gym.routing.transport.private_server import CLIENT_HEADER
from nemo_gym.routing.transport.tcp import REPLICA_WORKER_SCOPE_KEY, TcpTransport
from nemo_gym.sessions.replies import retry_later
from nemo_gym.sessions.worker import WORKER_HEADER, is_worker_id

WORKER_HEADER_KEY = WORKER_HEADER.lower().encode()


class SessionRouter:
    def __init__(
        self,
        app: ASGIApp,
        worker_id: str,
        owners: OwnerReader,
        forwarder: Forwarder,
        placement: Placement,
        lost: LostSessionPolicy,
        start_paths: frozenset[str] = frozenset(),
        replica: str | None = None,
        replicas: Forwarder | None = None,
    ) -> None:
        """``start_paths``: where a request starts a new session whatever it names (the app's session layer
        gives it one), so it is placed as a new session is, never sent to an owner, live or dead.
        ``replica``: this replica's address, in a replica set; ``replicas`` forwards over a ``TcpTransport``."""
        self.app = app
        self.worker_id = worker_id
        self.owners = owners
        self.forwarder = forwarder
        self.placement = placement
        self.lost = lost
        self.start_paths = start_paths
        self.replica = replica
        self.replicas = replicas
        self.label = worker_id.encode()  # the reply header's value, made once

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = labelled(send, self.label)
        # Only a sibling worker may name the caller's address; from the public port it is stripped.
        # One plain loop over the head, for both: on every request, a generator's frame (any(...)) cost more
        # than the scan itself. A request that may change state and carries no id gets one (``request_id``).
        named_client = has_id = False
        for name, _ in scope["headers"]:
            if name == CLIENT_HEADER:
                named_client = True
            elif name == ID_HEADER:
                has_id = True
        if named_client:
            scope["headers"] = [(name, value) for name, value in scope["headers"] if name != CLIENT_HEADER]
        if not has_id and scope["method"] not in SAFE_METHODS:
            scope["headers"].append(new_id_header())
        if scope["path"] in self.start_paths:
            await self.start_session(scope, receive, send)
            return
        try:
            session = self.owners.named_session(scope)
        except AmbiguousSession as error:
            await JSONResponse(status_code=400, content={"detail": error.detail})(scope, receive, send)
            return
        owner = owner_of(session)
        if owner is None:
            await self.start_session(scope, receive, send)
        elif owner == self.worker_id:
            await self.app(scope, receive, send)
        elif is_worker_id(owner):
            replica = replica_of(session)
            if replica is None or replica == self.replica or self.replicas is None:
                await self.to_owner(owner, session, scope, receive, self.owners.keeping_session(scope, send))
            elif (address := forward_address(session)) is not None:
                await self.to_replica(owner, replica, address, session, scope, receive, self.owners.keeping_session(scope, send))
            else:
                detail = "the session names an owner replica that is not host:port, or no forwarding port of it"
                response = JSONResponse(status_code=400, content={"detail": detail})
                await response(scope, receive, send)
        else:
            response = JSONResponse(status_code=400, content={"detail": "the session names an owner worker that is not a worker ID"})
            await response(scope, receive, send)

    async def to_owner(self, owner: str, session: dict, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward to the owner. One too busy to take a connection gets a 503 with Retry-After; for a dead
        one the lost-session policy decides, and may name another owner to forward to, and so on."""
        while True:
            decision: Decision
            try:
                await self.forwarder.forward(owner, scope, receive, send)
                return
            except OwnerGone as gone:
                receive = gone.replay or receive
                decision = await self.lost.owner_gone(owner, session, id_of(scope))
            except OwnerDied:
                decision = await self.lost.owner_died(owner, session, id_of(scope))
            except OwnerBusy:
                decision = Reply(busy_owner(owner, self.forwarder.busy_wait_seconds))
            match decision:
                case ForwardTo(owner=owner):
                    continue
                case ServeHere():
                    await self.app(scope, receive, send)
                case Reply(response=response):
                    await response(scope, receive, send)
            return

    async def to_replica(self, owner: str, replica: str, address: str, session: dict, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward to worker ``owner`` of another replica, at its forwarding ``address``, with a credential for it. A replica
        that does not answer gets a 503 with Retry-After, until the transport counts it dead; for a dead one
        (or one that died with the request) the lost-session policy decides."""
        transport: TcpTransport = self.replicas.transport
        if any(name == AUTH_HEADER_KEY for name, _ in scope["headers"]):  # the caller's own: never passed on
            scope["headers"] = [(name, value) for name, value in scope["headers"] if name != AUTH_HEADER_KEY]
        def sign(scope: Scope, headers: list[tuple[bytes, bytes]], body: list[bytes]) -> tuple[bytes, bytes]:
            return transport.credentials.header(scope["method"].encode(), request_target(scope), replica, owner, headers, body)

        decision: Decision
        try:
            await self.replicas.forward(address, scope, receive, send, sign=sign, worker=owner)
            return
        except OwnerGone as gone:
            receive = gone.replay or receive
            decision = await self.lost.owner_gone(dead_replica_owner(owner, replica, address, transport), session, id_of(scope))
        except OwnerDied:
            decision = await self.lost.owner_died(dead_replica_owner(owner, replica, address, transport), session, id_of(scope))
        except OwnerBusy:
            decision = Reply(silent_replica(owner, replica, address, self.replicas.busy_wait_seconds, transport.dead_after_seconds))
        match decision:
            case ForwardTo(owner=owner):
                await self.to_owner(owner, session, scope, receive, send)
            case ServeHere():
                await self.app(scope, receive, send)
            case Reply(response=response):
                await response(scope, receive, send)

    async def from_replica(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request another replica forwarded here (its credential checked, ``transport.tcp``): served here
        if this worker owns its session, else sent on to the owner worker of this replica."""
        worker = scope.pop(REPLICA_WORKER_SCOPE_KEY)
        try:
            session = self.owners.named_session(scope)
        except AmbiguousSession as error:
            await JSONResponse(status_code=400, content={"detail": error.detail})(scope, receive, send)
            return
        if owner_of(session) != worker or replica_of(session) != self.replica:
            detail = f"The request's session is not owned by worker {worker} of replica {self.replica}, which its credential names."
            await JSONResponse(status_code=400, content={"detail": detail})(scope, receive, send)
        elif worker == self.worker_id:
            await self.app(scope, receive, send)
        else:
            await self.to_owner(worker, session, scope, receive, self.owners.keeping_session(scope, send))

    async def start_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request that starts a session is served where the session should live (``placement``).

        Its body is read first, so that a sibling that cannot take it (dead, or too busy to accept)
        leaves it to be served here; a body that streams in several pieces is always served here.
        """
        target = self.placement.choose()
        if target is None:
            await self.app(scope, receive, send)
            return
        first = await receive()
        if first.get("more_body", False):
            self.placement.taken_back(target)
            await self.app(scope, replaying(receive, first), send)
            return
        try:
            await self.forwarder.forward(target, scope, replaying(receive, first), send, busy_wait_seconds=0)
        except (OwnerGone, OwnerDied, OwnerBusy):
            self.placement.taken_back(target)
            await self.app(scope, replaying(receive, first), send)


def busy_owner(owner: str, waited_seconds: float) -> JSONResponse:
    return retry_later(
        f"Worker {owner}, which owns this session, is alive but took no connection for {waited_seconds:g} s; "
        "the session is intact. Retry later."
    )


def dead_replica_owner(owner: str, replica: str, address: str, transport: TcpTransport) -> str:
    """How a 410 names the owner of a replica counted dead, and why it counts so."""
    silent = transport.silent_for(address)
    why = f"its host has not answered at {address} for {silent:.0f} s" if silent else f"its host refused the connection at {address}: nothing listens there"
    return f"{owner_label(owner, replica)} ({why})"


def silent_replica(owner: str, replica: str, address: str, waited_seconds: float, dead_after_seconds: float) -> JSONResponse:
    return retry_later(
        f"Replica {replica}, whose worker {owner} owns this session, has not answered at {address} for {waited_seconds:g} s; the "
        f"session is kept unless its host stays silent for {dead_after_seconds:g} s (peer_dead_after_seconds). Retry later."
    )


def labelled(send: Send, worker_id: bytes) -> Send:
    """Name this worker on the reply, replacing any other naming (an owner's, an app's): it labels the connection."""

    async def send_labelled(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [header for header in message.get("headers", ()) if header[0].lower() != WORKER_HEADER_KEY]
            headers.append((WORKER_HEADER_KEY, worker_id))
            message = {**message, "headers": headers}
        await send(message)

    return send_labelled
