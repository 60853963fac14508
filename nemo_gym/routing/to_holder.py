"""Sending a request on to the worker the store says holds its session, for a client that cannot follow a cookie.

With a store shared across hosts, a session can change hands while its owner lives: another host took
it over while the owner's lease was lapsed (``nemo_gym.durable.lease``). A cookie client is answered 503
with the cookie naming the new holder and follows it; an MCP client names its session with a token that
is never issued again, so its every request would reach the old owner and get that 503 forever. So the
durable write-through, finding a token's session held by another worker under a live lease, leaves the
holder in the scope (``HOLDER_SCOPE_KEY``) and replies nothing, and this layer, outside the app's session
layer (the reply's cookie is the holder's alone), sends the request there: to a worker of this host, or
of another replica. It runs inside the app, so the requests a sibling forwarded here (which skip the
router) are sent on too.

A request sent on carries ``TO_HOLDER_HEADER``: the holder's replica serves it at the worker its credential
names though the token names another (``SessionRouter.from_replica``), and it is never sent on a second
time (a holder that lost the session meanwhile answers 503, and the client's retry starts again). From a
client, the header only takes that second chance away from its own request.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym.routing.forwarder import Forwarder, OwnerBusy, OwnerDied, OwnerGone
from nemo_gym.routing.replica import ReplicaPeer, route
from nemo_gym.sessions.replies import retry_later

TO_HOLDER_HEADER = b"x-nemo-gym-to-holder"
# Set (to None) by this layer in the scope of a request it may send on; the write-through puts there the holder (a
# ``nemo_gym.durable.lease.LeaseHolder``: its ``worker`` and its replica ``keys``) and its own ``receive``, the body unread.
HOLDER_SCOPE_KEY = "nemo_gym.holder"


def sent_on(scope: Scope) -> bool:
    """Whether the request was sent on to a holder already (one plain loop: the layer asks on every request)."""
    for name, _ in scope["headers"]:
        if name == TO_HOLDER_HEADER:
            return True
    return False


class ToHolder:
    """``forwarder`` reaches this host's workers; ``replica_forwarder`` (None outside a replica set) the other
    replicas' workers; ``replica``: this replica's address."""

    def __init__(self, app: ASGIApp, forwarder: Forwarder, replica_forwarder: Forwarder | None, replica: str | None) -> None:
        self.app = app
        self.forwarder = forwarder
        self.replica_forwarder = replica_forwarder
        self.replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or sent_on(scope):
            await self.app(scope, receive, send)
            return
        scope[HOLDER_SCOPE_KEY] = None
        await self.app(scope, receive, send)
        named = scope.pop(HOLDER_SCOPE_KEY, None)
        if named is not None:
            # The write-through's ``receive``: the body, which the checkpoint gate read whole, is given from it again.
            holder, body = named
            await self.send_on(holder, scope, body, send)

    async def send_on(self, holder: Any, scope: Scope, receive: Receive, send: Send) -> None:
        peer = route(holder.worker, holder.keys, self.replica)
        forwarder = self.replica_forwarder if isinstance(peer, ReplicaPeer) else self.forwarder
        scope["headers"] = [*scope["headers"], (TO_HOLDER_HEADER, b"1")]
        held = f"This session is held by worker {holder.worker} now (it took the session over while this worker's owner lease had expired)"
        try:
            if peer is None or forwarder is None:
                raise OwnerGone(holder.worker)
            await forwarder.forward(peer, scope, receive, send)
        except (OwnerGone, OwnerBusy):
            await retry_later(f"{held}, which this worker could not reach: this request did not take effect. Retry it.")(scope, receive, send)
        except OwnerDied:
            await retry_later(f"{held}, which died while it had this request: whether it took effect is unknown. Retry it.")(scope, receive, send)
