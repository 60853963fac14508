"""The session router: the ASGI middleware in front of the app that sends each request to its owner.

It sits outside the app's session layer on purpose: a forwarded request never reaches this worker's
session layer, so the caller gets exactly one Set-Cookie, the owner's. Requests that other
workers forward here arrive on the private listener, which bypasses the router
(``transport.private_server``). It owns recovery, in one loop over a route (``forward``): when a
forward cannot reach its peer, it answers a busy one itself (503), and for a dead one asks the
lost-session policy (``lost``) and does what it says.

In a replica set (``replica``), a session whose owner is a worker of another replica is forwarded, as a
``ReplicaPeer``, by the replica forwarder (``replica_forwarder``, over ``transport.tcp``, which stamps
the credential) to that replica's forwarding port, where ``from_replica`` takes it: served there, or
sent on to the owner worker of that host. A session of this replica's takes the one-host path, unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.metrics.meters import METERS
from nemo_gym.protocols.handing_off import CONNECTION_EXTENSION, HANDED_EXTENSION
from nemo_gym.routing.exchange import replaying
from nemo_gym.routing.forwarder import Forwarder, OwnerBusy, OwnerDied, OwnerGone
from nemo_gym.routing.lost import Decision, ForwardTo, LostSessionPolicy, Reply, ServeHere
from nemo_gym.routing.owner import AmbiguousSession, OwnerReader, owner_of
from nemo_gym.routing.placement import Placement
from nemo_gym.routing.replica import ReplicaPeer, replica_of, route
from nemo_gym.routing.to_holder import TO_HOLDER_HEADER
from nemo_gym.routing.request_id import SAFE_METHODS, id_of, new_id_header, request_id
from nemo_gym.routing.transport.hand_off import HandOffs
from nemo_gym.routing.transport.private_server import CLIENT_HEADER
from nemo_gym.routing.transport.replica_port import REPLICA_WORKER_SCOPE_KEY
from nemo_gym.sessions.cookie import SESSION_READ_HEADER, SESSION_READ_SCOPE_KEY, encoded_reading
from nemo_gym.sessions.replies import retry_later
from nemo_gym.sessions.worker import WORKER_HEADER, is_worker_id

WORKER_HEADER_KEY = WORKER_HEADER.lower().encode()
# The session ``owner_elsewhere`` found a request naming, left in its scope for whoever reads it next (the router itself):
# the request's cookie is parsed once, whatever asks.
NAMED_SESSION_SCOPE_KEY = "nemo_gym.named_session"
UNREAD = object()


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
        replica_forwarder: Forwarder | None = None,
        hand_offs: HandOffs | None = None,
    ) -> None:
        """``forwarder`` reaches this host's workers (``transport.unix``). ``start_paths``: where a request starts a
        new session whatever it names (the app's session layer gives it one), so it is placed as a new session
        is, never sent to an owner, live or dead. ``replica``: this replica's address, in a replica set;
        ``replica_forwarder`` reaches the other replicas' workers (``transport.tcp``). ``hand_offs``: where a request
        of a sibling's session may hand it its connection instead (``transport.hand_off``; None: ``hand_off`` is off)."""
        self.app = app
        self.worker_id = worker_id
        self.owners = owners
        self.forwarder = forwarder
        self.placement = placement
        self.lost = lost
        self.start_paths = start_paths
        self.replica = replica
        self.replica_forwarder = replica_forwarder
        self.hand_offs = hand_offs
        self.label = worker_id.encode()  # the reply header's value, made once

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = labelled(send, self.label)
        # The session ``owner_elsewhere`` read, which it reads only from a head that holds no sibling-only header.
        named = scope.pop(NAMED_SESSION_SCOPE_KEY, UNREAD)
        if named is UNREAD:
            # Only a forwarding worker may name the caller's address or its reading of the session; from the public port
            # they are stripped. One plain loop over the head, for both: on every request, a generator's frame (any(...))
            # cost more than the scan itself.
            sibling_only = False
            for name, _ in scope["headers"]:
                if name == CLIENT_HEADER or name == SESSION_READ_HEADER:
                    sibling_only = True
            if sibling_only:
                scope["headers"] = [(name, value) for name, value in scope["headers"] if name != CLIENT_HEADER and name != SESSION_READ_HEADER]
        if scope["path"] in self.start_paths:
            await self.start_session(scope, receive, send)
            return
        try:
            session = self.owners.named_session(scope) if named is UNREAD else named
        except AmbiguousSession as error:
            await JSONResponse(status_code=400, content={"detail": error.detail})(scope, receive, send)
            return
        owner = owner_of(session)
        if owner is None:
            await self.start_session(scope, receive, send)
        elif owner == self.worker_id:
            await self.app(scope, receive, send)
        elif is_worker_id(owner):
            peer = route(owner, session, self.replica)
            if peer is not None:
                if isinstance(peer, ReplicaPeer):
                    forwarder = self.replica_forwarder
                elif await self.handed_off(peer, scope):
                    return
                else:
                    forwarder = self.forwarder
                await self.forward(forwarder, peer, session, scope, receive, self.owners.keeping_session(scope, send))
            else:
                detail = "the session names an owner replica that is not host:port, or no forwarding port of it"
                response = JSONResponse(status_code=400, content={"detail": detail})
                await response(scope, receive, send)
        else:
            response = JSONResponse(status_code=400, content={"detail": "the session names an owner worker that is not a worker ID"})
            await response(scope, receive, send)

    def owner_elsewhere(self, scope: Scope) -> str | ReplicaPeer | None:
        """Where a request's session lives, for a request the router would only hand off or forward there (``__call__``):
        a sibling worker of this host, or a worker of another replica. Asked by what takes a request before any layer
        sees it (``routing.early_hand_off``, ``routing.relay``); None for any other request, which the router then takes
        as ever. The session it reads is left in the scope (``NAMED_SESSION_SCOPE_KEY``) for the next to ask."""
        if scope["path"] in self.start_paths:
            return None
        for name, _ in scope["headers"]:
            if name == CLIENT_HEADER or name == SESSION_READ_HEADER:
                return None
        if NAMED_SESSION_SCOPE_KEY in scope:
            session = scope[NAMED_SESSION_SCOPE_KEY]
        else:
            try:
                session = scope[NAMED_SESSION_SCOPE_KEY] = self.owners.named_session(scope)
            except AmbiguousSession:
                return None
        owner = owner_of(session)
        if owner is None or owner == self.worker_id or not is_worker_id(owner):
            return None
        return route(owner, session, self.replica)

    async def handed_off(self, owner: str, scope: Scope) -> bool:
        """Whether the request's connection went to ``owner``, a worker of this host, which replies to the client
        itself; counted either way (a forward, by the reason it was not handed off). Asked before any of the
        body is read: the connection goes with every byte read from it (``protocols.handing_off``)."""
        connection = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
        if self.hand_offs is None:
            reason = "off"
        elif connection is None:
            reason = "no_connection"  # not from a public port that can give connections away
        else:
            reason = await connection.give_away(scope, functools.partial(self.hand_offs.send, owner))
        if reason is None:
            return True  # counted by the transport, as it gives the connection
        METERS.forwarded_not_handed_off(reason).inc()
        return False

    async def forward(self, forwarder: Forwarder, peer: Any, session: dict, scope: Scope, receive: Receive, send: Send) -> None:
        """The recovery loop over a route: forward to ``peer`` (a worker of this host over ``forwarder``, or of
        another replica over ``replica_forwarder``). One that is busy (took no connection, or its host is silent
        but not yet counted dead) gets a 503 with Retry-After; for one that is gone, or died with the request,
        the lost-session policy decides: serve here, reply, or forward to the worker of this host it names,
        and so on."""
        with_id(scope)
        while True:
            decision: Decision
            with_reading(scope)
            try:
                await forwarder.forward(peer, scope, receive, send)
                return
            except OwnerGone as gone:
                receive = gone.replay or receive
                decision = await self.lost.owner_gone(forwarder.transport.lost_owner(peer), session, id_of(scope))
            except OwnerDied:
                decision = await self.lost.owner_died(forwarder.transport.lost_owner(peer), session, id_of(scope))
            except OwnerBusy:
                decision = Reply(retry_later(forwarder.transport.busy_detail(peer, forwarder.busy_wait_seconds)))
            match decision:
                case ForwardTo(owner=owner):
                    forwarder, peer = self.forwarder, owner
                    continue
                case ServeHere():
                    await self.app(scope, receive, send)
                case Reply(response=response):
                    await response(scope, receive, send)
            return

    async def from_replica(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request another replica forwarded here (its credential checked, ``transport.tcp``): served here
        if this worker owns its session, else sent on to the owner worker of this replica: its connection handed
        there (the sending replica keeps it for that worker's requests), or the request forwarded."""
        worker = scope.pop(REPLICA_WORKER_SCOPE_KEY)
        try:
            session = self.owners.named_session(scope)
        except AmbiguousSession as error:
            await JSONResponse(status_code=400, content={"detail": error.detail})(scope, receive, send)
            return
        # A request sent on to the session's holder in the store (``to_holder``) names the owner its token names.
        named_here = owner_of(session) == worker and replica_of(session) == self.replica
        if not named_here and not any(name == TO_HOLDER_HEADER for name, _ in scope["headers"]):
            detail = f"The request's session is not owned by worker {worker} of replica {self.replica}, which its credential names."
            await JSONResponse(status_code=400, content={"detail": detail})(scope, receive, send)
        elif worker == self.worker_id:
            await self.app(scope, receive, send)
        elif not await self.handed_off(worker, scope):
            await self.forward(self.forwarder, worker, session, scope, receive, self.owners.keeping_session(scope, send))

    async def start_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request that starts a session is served where the session should live (``placement``): its
        connection handed there, or else the request forwarded. One handed here by a sibling is served here.

        A forward reads its body first, so that a sibling that cannot take it (dead, or too busy to accept)
        leaves it to be served here; a body that streams in several pieces is always served here.
        """
        target = None if scope.get("extensions", {}).get(HANDED_EXTENSION) else self.placement.choose()
        if target is None:
            await self.app(scope, receive, send)
            return
        if await self.handed_off(target, scope):
            return
        first = await receive()
        if first.get("more_body", False):
            self.placement.taken_back(target)
            await self.app(scope, replaying(receive, first), send)
            return
        with_id(scope)
        try:
            await self.forwarder.forward(target, scope, replaying(receive, first), send, busy_wait_seconds=0)
        except (OwnerGone, OwnerDied, OwnerBusy):
            self.placement.taken_back(target)
            await self.app(scope, replaying(receive, first), send)


def with_id(scope: Scope) -> None:
    """A request that may change state leaves this worker with an id (``request_id``): its own, or one given here, under
    which a forward's retry, the lost-session policy and a replay to an adopter name it. One served where it lands is
    sent again by nothing, and gets none."""
    if scope["method"] not in SAFE_METHODS and request_id(scope["headers"]) is None:
        scope["headers"].append(new_id_header())


def with_reading(scope: Scope) -> None:
    """A forwarded request carries the session this worker read from its cookie (if it read it), which the owner
    takes as read (``transport.private_server``; across hosts the replica credential binds it): the cookie's
    signature is verified once per request."""
    if SESSION_READ_SCOPE_KEY in scope and not any(name == SESSION_READ_HEADER for name, _ in scope["headers"]):
        scope["headers"] = [*scope["headers"], (SESSION_READ_HEADER, encoded_reading(scope[SESSION_READ_SCOPE_KEY]))]


def labelled(send: Send, worker_id: bytes) -> Send:
    """Name this worker on the reply, replacing any other naming (an owner's, an app's): it labels the connection."""

    async def send_labelled(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [header for header in message.get("headers", ()) if header[0].lower() != WORKER_HEADER_KEY]
            headers.append((WORKER_HEADER_KEY, worker_id))
            message = {**message, "headers": headers}
        await send(message)

    return send_labelled
