"""The session router: the ASGI middleware in front of the app that sends each request to its owner.

It sits outside the app's session layer on purpose: a forwarded request never reaches this worker's
session layer, so the caller gets exactly one Set-Cookie, the owner's. Requests that other
workers forward here arrive on the private listener, which bypasses the router
(``transport.private_server``). It owns recovery: when a forward cannot reach its owner, it answers a
busy owner itself, and for a dead one asks the lost-session policy (``lost``) and does what it says.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym.routing.exchange import replaying
from nemo_gym.routing.forwarder import Forwarder, OwnerBusy, OwnerDied, OwnerGone
from nemo_gym.routing.lost import Decision, ForwardTo, LostSessionPolicy, Reply, ServeHere, retry_later
from nemo_gym.routing.owner import AmbiguousSession, OwnerReader, owner_of
from nemo_gym.routing.placement import Placement
from nemo_gym.routing.transport.private_server import CLIENT_HEADER
from nemo_gym.routing.worker import WORKER_HEADER, is_worker_id

WORKER_HEADER_KEY = WORKER_HEADER.lower().encode()


class SessionRouter:
    def __init__(
        self, app: ASGIApp, worker_id: str, owners: OwnerReader, forwarder: Forwarder, placement: Placement, lost: LostSessionPolicy
    ) -> None:
        self.app = app
        self.worker_id = worker_id
        self.owners = owners
        self.forwarder = forwarder
        self.placement = placement
        self.lost = lost
        self.label = worker_id.encode()  # the reply header's value, made once

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = labelled(send, self.label)
        # Only a sibling worker may name the caller's address; from the public port it is stripped.
        # A plain loop: on every request, a generator's frame (any(...)) cost more than the scan itself.
        for name, _ in scope["headers"]:
            if name == CLIENT_HEADER:
                scope["headers"] = [(name, value) for name, value in scope["headers"] if name != CLIENT_HEADER]
                break
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
            await self.to_owner(owner, session, scope, receive, self.owners.keeping_session(scope, send))
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
                decision = await self.lost.owner_gone(owner, session)
            except OwnerDied:
                decision = await self.lost.owner_died(owner, session)
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
            await self.app(scope, replaying(first, receive), send)
            return
        try:
            await self.forwarder.forward(target, scope, replaying(first, receive), send, busy_wait_seconds=0)
        except (OwnerGone, OwnerDied, OwnerBusy):
            self.placement.taken_back(target)
            await self.app(scope, replaying(first, receive), send)


def busy_owner(owner: str, waited_seconds: float) -> JSONResponse:
    return retry_later(
        f"Worker {owner}, which owns this session, is alive but took no connection for {waited_seconds:g} s; "
        "the session is intact. Retry later."
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
