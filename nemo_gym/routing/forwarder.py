"""Forward a request, unchanged, to the worker that owns its session (a peer), and stream the reply back.

It reaches the peer through a ``Transport`` and says, by raising, why it could not: the router's
recovery loop decides what the caller gets then.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from nemo_gym.metrics.meters import METERS
from nemo_gym.routing.exchange import CallerLeft, Exchange, RequestBody
from nemo_gym.routing.hop_tracing import hop_tracer
from nemo_gym.routing.transport.base import Transport
from nemo_gym.routing.transport.connection import ConnectionBroken, OwnerConnection
from nemo_gym.sessions.replies import retry_later

# A live owner that takes no connection (its backlog full while it is busy) is retried, with pauses
# growing from the first to the last, for this long; then the caller gets a 503 with Retry-After.
BUSY_OWNER_WAIT_SECONDS = 30
FIRST_RETRY_PAUSE_SECONDS = 0.005
LAST_RETRY_PAUSE_SECONDS = 0.25


def outcome_unknown(owner: str, error: Exception) -> str:
    """The 503's detail for a request whose connection to ``owner`` (a worker, as a reply names it) broke after it was sent
    and before its reply started: the owner may have applied it."""
    return (
        f"Forwarding to worker {owner}, which owns this session, broke before its reply ({error!r}), so whether this "
        "request took effect is unknown. Retry it with the same Idempotency-Key: a request its session applied "
        "already gets its first reply again, never a second application."
    )


class OwnerGone(Exception):
    """The owner's process is dead (the transport says so), and the request never reached it.

    ``replay`` gives the request's body again from the start, for whoever serves it instead.
    """

    def __init__(self, owner: str, lease_expired: bool = False) -> None:
        super().__init__(owner)
        self.replay: Receive | None = None
        # Given up because the owner's lease expired (``Forwarder.owner_expired``): its process may live.
        self.lease_expired = lease_expired


class OwnerDied(Exception):
    """The owner's process died while it had the request, before its reply started."""


class OwnerBusy(Exception):
    """The owner lives but has taken no connection for the forwarder's ``busy_wait_seconds``; or its host
    has acknowledged nothing of the request for the transport's user timeout (silent, not proved dead)."""


class Forwarder:
    """Sends requests to peers (owner workers: this host's, or another replica's) over the transport's kept-alive connections.

    A forward goes down three steps: ``forward`` (one exchange, traced and counted; a broken connection
    sorted into a dead owner or a 503), ``deliver`` (a connection found, waiting while the peer is busy,
    and the request sent again once if the peer provably did not take it), ``relay_under_lease`` (the
    request on one connection, given up if its owner's lease expires first); ``Exchange.relay`` writes it
    and streams the reply back.

    ``owner_expired`` (given where owners hold leases in a store shared across hosts, ``nemo_gym.durable.lease``):
    while a forwarded request waits for its reply to start, it is asked every ``expiry_check_seconds``
    whether the owner worker's lease has expired; a frozen owner's kernel takes the request and nothing
    answers, so once its lease has expired the forward is given up as ``OwnerGone`` (the request is
    replayed to whoever serves in its place). The owner, if it wakes, finds its lease lapsed and refuses
    the request it was sent, unwritten (``durable.lease``, fencing), so the request takes effect once.

    ``hop`` names where it forwards, in its metrics and spans: to a sibling "worker", or another "replica".
    """

    def __init__(
        self,
        transport: Transport,
        busy_wait_seconds: float = BUSY_OWNER_WAIT_SECONDS,
        hop: str = "worker",
        owner_expired: Callable[[str], Awaitable[bool]] | None = None,
        expiry_check_seconds: float = 1.0,
    ) -> None:
        self.transport = transport
        self.busy_wait_seconds = busy_wait_seconds
        self.owner_expired = owner_expired
        self.expiry_check_seconds = expiry_check_seconds
        self.hop = hop
        self.tracer = hop_tracer(hop)

    async def forward(self, peer: Any, scope: Scope, receive: Receive, send: Send, busy_wait_seconds: float | None = None) -> None:
        """Forward to ``peer`` (stamped with the credential the transport requires) and stream back; raises
        ``OwnerGone``, ``OwnerDied`` or ``OwnerBusy``, with nothing sent, if it cannot; a 503 with Retry-After
        for a live peer whose connection broke before its reply started (safe to retry under the request's id).

        A caller that leaves cancels it. Only a dead peer's kept connections are dropped: closing a
        live one's would abort the requests it is serving. A forward whose reply came back is counted,
        with its duration, under its hop (``nemo_gym.metrics``); with tracing, it is a span (``hop_tracing``).
        """
        worker = self.transport.worker_of(peer)
        with contextlib.nullcontext((scope, send)) if self.tracer is None else self.tracer.span(worker, scope, send) as (scope, send):
            started = time.perf_counter()
            busy_wait_seconds = self.busy_wait_seconds if busy_wait_seconds is None else busy_wait_seconds
            exchange = Exchange(scope, receive, send, self.transport.stamper(peer))
            try:
                await exchange.run(lambda body: self.deliver(peer, worker, exchange, body, busy_wait_seconds))
                if exchange.started:
                    METERS.forwarded[self.hop].inc()
                    METERS.forward_seconds[self.hop].observe(time.perf_counter() - started)
            except OwnerGone as gone:
                if not gone.lease_expired:  # a replica's other workers may serve on over its kept connections
                    self.transport.forget(peer)
                gone.replay = exchange.replay()
                raise
            except (CallerLeft, ConnectionBroken) as error:
                if exchange.caller_left:
                    return
                if exchange.started:
                    raise  # the reply is half sent: only a closed connection can tell the caller
                if await self.transport.proves_dead(peer):
                    self.transport.forget(peer)
                    raise OwnerDied(worker) from error
                await retry_later(outcome_unknown(worker, error))(scope, receive, send)

    async def deliver(self, peer: Any, worker: str, exchange: Exchange, body: RequestBody, busy_wait_seconds: float) -> None:
        """Send the request to ``peer`` on one of its connections, retrying while it lives but cannot take
        the connection yet (its backlog is full), and give the connection back if it may be reused.

        A request the peer provably did not take (``OwnerConnection.unread``: a kept connection it
        closed meanwhile, or its end closed with the request unread, as when it dies) is sent again,
        once, on a new connection, if its body can be given again (``Exchange.replayable``). A peer
        that is gone then takes no connection (``OwnerGone``: the request goes to whoever serves in its
        place). A request the peer may have read is never sent twice.
        """
        deadline = None
        pause = FIRST_RETRY_PAUSE_SECONDS
        again = False
        while True:
            try:
                connection = await self.transport.connect(peer, fresh=again)
            except OSError:  # no connection: nothing of the request was sent
                if not self.transport.is_alive(peer):
                    raise OwnerGone(worker) from None
                now = asyncio.get_running_loop().time()
                deadline = deadline or now + busy_wait_seconds
                if now >= deadline:
                    raise OwnerBusy(worker) from None
                await asyncio.sleep(pause)
                pause = min(2 * pause, LAST_RETRY_PAUSE_SECONDS)
                continue
            kept = False
            try:
                kept = await self.relay_under_lease(worker, exchange, connection, body)
            except ConnectionBroken:
                if connection.timed_out and not exchange.started:
                    raise OwnerBusy(worker) from None  # the peer's host acknowledged nothing for a while: silent
                if again or not connection.unread() or not exchange.replayable():
                    raise
                body, again = exchange.body_again(body), True
                continue
            finally:
                if kept:
                    self.transport.give_back(peer, connection)
                else:
                    connection.close()
            return

    async def relay_under_lease(self, worker: str, exchange: Exchange, connection: OwnerConnection, body: RequestBody) -> bool:
        """``exchange.relay`` on ``connection`` (whether it may be reused), given up as ``OwnerGone`` if
        ``worker``'s lease expires before the reply starts (a reply that starts while the store is asked is kept)."""
        if self.owner_expired is None:
            return await exchange.relay(connection, body)
        relaying = asyncio.ensure_future(exchange.relay(connection, body))
        try:
            while not (await asyncio.wait({relaying}, timeout=self.expiry_check_seconds))[0]:
                # Asked again once the store answered: a reply that began meanwhile is the request's one application.
                if not exchange.started and exchange.replayable() and await self.owner_expired(worker) and not exchange.started:
                    raise OwnerGone(worker, lease_expired=True)
            return await relaying
        finally:
            if not relaying.done():
                relaying.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await relaying
