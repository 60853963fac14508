"""A request of a sibling's session hands its connection over before any layer of this worker sees it.

Through the router, a request whose connection goes to its owner (``SessionRouter.handed_off``) first becomes an ASGI
request here: a cycle and a task, and the layers in front of the router, for a request this worker never serves. So
the public port's protocol offers each request, once its head is parsed and before its app starts
(``protocols.handing_off``, through the lifespan state), to ``EarlyHandOff``: when the router would hand it to a
sibling (``SessionRouter.owner_elsewhere``), the connection is offered to that sibling then (``HandingOffProtocol.offer``,
``HandOffs.offer``) with this worker's reading of the session, which the sibling takes as read. Its app starts only
if the sibling does not take it, the request carried on by the router as before: the sibling's refusal is what the router's hand-off finds, and counts (``forwards_not_handed_off``), and it
forwards the request. A connection that cannot be offered at all (TLS, a request behind another, more read than is
kept) is left to the router alike.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nemo_gym.protocols.handing_off import HandingOffProtocol
from nemo_gym.routing.router import SessionRouter
from nemo_gym.routing.transport.hand_off import HandOffs
from nemo_gym.sessions.cookie import SESSION_READ_SCOPE_KEY, encoded_reading


class EarlyHandOff:
    """A worker's hand-off of its siblings' sessions' connections as their heads are parsed."""

    def __init__(self, router: SessionRouter, hand_offs: HandOffs) -> None:
        self.router = router
        self.hand_offs = hand_offs

    def __call__(self, protocol: HandingOffProtocol, cycle: Any, app: Any) -> bool:
        """Whether the connection of ``cycle``'s request is being handed to its owner: then its app starts only if the
        owner does not take it."""
        scope = cycle.scope
        owner = self.router.owner_elsewhere(scope)
        if not isinstance(owner, str):
            return False
        offered = protocol.offer(scope)
        if isinstance(offered, str):
            return False
        reading = encoded_reading(scope[SESSION_READ_SCOPE_KEY]) if SESSION_READ_SCOPE_KEY in scope else b""
        taken = self.hand_offs.offer(owner, *offered, reading)
        if isinstance(taken, str):
            protocol.settle(scope, taken)
            return False

        def answered(answer: asyncio.Future) -> None:
            reason = answer.result()
            protocol.settle(scope, reason)
            if reason is not None:
                protocol.serve_in_app(cycle, app)

        taken.add_done_callback(answered)
        return True
