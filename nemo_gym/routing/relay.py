"""Forwards to another replica relayed as bytes by the public port's protocol: no ASGI request on the receiving worker.

Forwarded through the router (``Exchange``), a request whose session another replica owns costs the receiving worker
a whole ASGI request: a cycle and a task, the layers in front of the router, the reply turned into ASGI messages and
written again by uvicorn. Instead, the public port's protocol offers each request, once its head is parsed and before
its app starts (``protocols.handing_off``, through the lifespan state), to ``Relays``. When the router would only forward
it to another replica (``SessionRouter.owner_elsewhere``) and a connection to the owner worker is kept
(``PooledTransport.kept``), the request goes up on that connection as the forward writes it (the same headers, the
caller's address, the session read here, the request's id, the replica credential), and the reply comes back as the
bytes the owner wrote, straight to the caller's socket. Only the reply's framing is parsed (httptools), and its head
rewritten: this worker's label (``X-NeMo-Gym-Worker``, as on every reply of the port), the server's default headers,
and the session's cookie where the reply has none (``OwnerReader.keeping_session``).

Everything else takes the ASGI path, which decides and recovers as before: no kept connection (the forward opens
one and keeps it), a body not framed by one length or beyond 64 KiB, HEAD, ``Expect``, an upgrade, a caller that
asked to close, a proxy's ``X-Forwarded-*`` or ``Forwarded``, the sibling-only headers, ``/metrics``. A kept
connection the owner closed meanwhile (``OwnerConnection.unread``: the request provably not taken) sends the request
down the ASGI path after all, which forwards it on a new connection. One that broke after the owner may have read
it gets a 503 with Retry-After (retried under the request's id, it is never applied twice; a replica that died is
found by the retry). A caller that leaves closes the connection to the owner, whose handler is then cancelled; a
reply that breaks off closes the caller's connection.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT

from nemo_gym.metrics.layers import METRICS_PATH
from nemo_gym.metrics.meters import METERS
from nemo_gym.protocols.handing_off import HandingOffProtocol
from nemo_gym.routing.exchange import forwarded_headers
from nemo_gym.routing.forwarder import outcome_unknown
from nemo_gym.routing.replica import ReplicaPeer, owner_label
from nemo_gym.routing.router import WORKER_HEADER_KEY, SessionRouter, labelled, with_id, with_reading
from nemo_gym.routing.transport.connection import OwnerConnection, request_head
from nemo_gym.sessions.replies import retry_later

# Request headers that leave a request to the ASGI path (any ``x-forwarded-*`` too).
NOT_RELAYED = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"forwarded"})
HOP = "replica"


class Relays:
    """A worker's relay of the requests of other replicas' sessions (offered by the public port's protocol)."""

    def __init__(self, router: SessionRouter, max_body_bytes: int | None) -> None:
        self.router = router
        self.transport = router.replica_forwarder.transport
        # A relayed body is read whole before it goes up (its credential covers it); uvicorn stops reading a body
        # at this much until an app reads it.
        self.max_body_bytes = HIGH_WATER_LIMIT if max_body_bytes is None else min(HIGH_WATER_LIMIT, max_body_bytes)

    def __call__(self, protocol: HandingOffProtocol, cycle: Any, app: Any) -> bool:
        """Whether the request of ``cycle`` (its head parsed, none of its body read by anyone) is relayed: then it is
        this relay's; else its app is started as ever."""
        scope = cycle.scope
        if not cycle.keep_alive or scope["method"] == "HEAD" or scope["path"] == METRICS_PATH:
            return False
        length: int | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return False
                length = int(value)
            elif name in NOT_RELAYED or name.startswith(b"x-forwarded-"):
                return False
        if length is not None and length > self.max_body_bytes:
            return False
        peer = self.router.owner_elsewhere(scope)
        if not isinstance(peer, ReplicaPeer):
            return False
        connection = self.transport.kept(peer)
        if connection is None:
            return False
        with_id(scope)  # as the router's forward gives it: the same id if the ASGI path takes the request back
        Relayed(self, protocol, cycle, app, peer, connection, length is not None)
        return True


class Relayed:
    """One relayed request: uvicorn's cycle for it, driven here. uvicorn sets the cycle's ``message_event`` for each
    piece of body, at the body's end and when the caller's connection is lost: this object stands in for it."""

    def __init__(self, relays: Relays, protocol: HandingOffProtocol, cycle: Any, app: Any, peer: ReplicaPeer, connection: OwnerConnection, framed: bool) -> None:
        self.relays = relays
        self.protocol = protocol
        self.cycle = cycle
        self.app = app
        self.peer = peer
        self.connection = connection
        self.framed = framed
        self.started = time.perf_counter()
        self.sent = False
        self.done = False
        # The reply as read until its head is rewritten and written (None from then on), and what is known of it.
        self.held: bytearray | None = bytearray()
        self.status = 0
        self.reply_headers: list[tuple[bytes, bytes]] = []
        # Whether the reply names a worker of its own (``start``), which this worker's label replaces.
        self.relabel = False
        self.ended: bool | None = None
        self.cookie: asyncio.Future | None = None
        self.draining = False
        self.event = cycle.message_event
        cycle.message_event = self
        self.set()  # a request that waited behind another may have come whole already

    def set(self) -> None:
        """uvicorn's signal: a piece of the body, its end, or the caller gone."""
        if self.cycle.disconnected:
            self.abandon()
        elif not self.cycle.more_body and not self.sent:
            self.send()

    def clear(self) -> None:
        pass

    def send(self) -> None:
        self.sent = True
        connection, cycle = self.connection, self.cycle
        if not connection.is_usable():  # closed by the owner while the body came: nothing of the request was sent
            connection.close()
            self.give_back_to_app(self.app)
            return
        scope = cycle.scope
        with_reading(scope)
        headers = forwarded_headers(scope)
        body = bytes(cycle.body)
        if self.framed:
            headers.append((b"content-length", b"%d" % len(body)))
        self.relays.transport.stamper(self.peer)(scope, headers, [body])
        connection.tap = self.reply
        connection.sent = True
        connection.transport.write(request_head(scope, headers) + body)

    def reply(self, data: bytes) -> None:
        """What the owner's connection read (b"": it ended), and the events the parser made of it."""
        if self.done:
            return
        broken = None
        for event in self.connection.take_events():
            if event[0] == "start":
                self.status, self.reply_headers = event[1], event[2]
            elif event[0] == "end":
                self.ended = event[1]
            elif event[0] == "broken" and self.ended is None:
                broken = event[1]
        if self.held is None:
            self.write(data)
        else:
            self.held += data
            if self.status and self.cookie is None:
                self.start()
        if self.held is None and self.ended is not None:
            self.finish()
        elif broken is not None:
            self.broke(broken)

    def start(self) -> None:
        """The reply's head is read: with the session's cookie if it has none, it goes to the caller."""
        owners = self.relays.router.owners
        has_cookie = False
        for name, value in self.reply_headers:
            name = name.lower()
            if name == WORKER_HEADER_KEY:
                self.relabel = True
            elif name == b"set-cookie" and value.startswith(owners.set_cookie_prefix):
                has_cookie = True
        if self.status != 410 and not has_cookie:
            self.cookie = asyncio.ensure_future(owners.cookie_headers(self.cycle.scope))
            self.cookie.add_done_callback(self.cookie_made)
            return
        self.write_head([])

    def cookie_made(self, made: asyncio.Future) -> None:
        if self.done:
            return
        self.write_head([] if made.cancelled() or made.exception() else made.result())
        if self.ended is not None:
            self.finish()

    def write_head(self, cookies: list[tuple[bytes, bytes]]) -> None:
        held, self.held = bytes(self.held), None
        end = held.find(b"\r\n\r\n")
        line = held.find(b"\r\n")
        if end < 0:  # not the head the owner's server writes
            self.broke(ConnectionError("the owner's reply head does not end in CRLF CRLF"))
            return
        added = [*self.protocol.server_state.default_headers, (WORKER_HEADER_KEY, self.relays.router.label), *cookies]
        if self.relabel:  # the owner's naming is replaced
            head = b"".join(b"%s: %s\r\n" % header for header in self.reply_headers if header[0].lower() != WORKER_HEADER_KEY)
        else:
            head = held[line + 2 : end + 2]
        self.cycle.response_started = True
        self.write(held[: line + 2] + b"".join(b"%s: %s\r\n" % header for header in added) + head + b"\r\n" + held[end + 4 :])

    def write(self, data: bytes) -> None:
        if not data:
            return
        self.protocol.transport.write(data)
        if self.protocol.flow.write_paused and not self.draining:  # a slow caller: the owner's reply waits for it
            self.draining = True
            self.connection.transport.pause_reading()
            asyncio.ensure_future(self.drained())

    async def drained(self) -> None:
        await self.protocol.flow.drain()
        self.draining = False
        if not self.done and not self.connection.closed:
            self.connection.transport.resume_reading()

    def finish(self) -> None:
        """The reply went whole to the caller: the owner's connection is kept, the caller's goes on as uvicorn's would."""
        self.done = True
        connection, cycle = self.connection, self.cycle
        connection.tap = None
        if self.ended and connection.is_usable():
            self.relays.transport.give_back(self.peer, connection)
        else:
            connection.close()
            cycle.keep_alive = False  # the owner's reply said it closes: so does this connection, as the caller was told
        METERS.forwarded[HOP].inc()
        METERS.forward_seconds[HOP].observe(time.perf_counter() - self.started)
        METERS.response(self.status).inc()
        METERS.relayed.inc()
        cycle.response_complete = True
        if not cycle.keep_alive:
            self.protocol.transport.close()
        cycle.on_response()

    def broke(self, error: Exception) -> None:
        """The owner's connection ended before the reply did."""
        self.done = True
        connection = self.connection
        connection.tap = None
        connection.close()
        if self.cycle.response_started:  # half a reply went: only a closed connection can tell the caller
            self.cycle.keep_alive = False
            self.protocol.transport.close()
        elif connection.unread():
            self.give_back_to_app(self.app)
        else:
            self.give_back_to_app(self.retry_later(outcome_unknown(owner_label(self.peer.worker, self.peer.replica), error)))

    def retry_later(self, detail: str) -> Any:
        """The 503 for a request the owner may have taken, as the router answers it (labelled, the session's cookie kept, counted)."""
        router = self.relays.router

        async def reply(scope: Any, receive: Any, send: Any) -> None:
            METERS.response(503).inc()
            await retry_later(detail)(scope, receive, router.owners.keeping_session(scope, labelled(send, router.label)))

        return reply

    def give_back_to_app(self, app: Any) -> None:
        """The request to ``app`` after all, its body whole in the cycle."""
        self.done = True
        self.connection.tap = None
        self.cycle.message_event = self.event
        self.event.set()
        self.protocol.serve_in_app(self.cycle, app)

    def abandon(self) -> None:
        """The caller left: the owner's handler is cancelled as its connection closes."""
        if self.done:
            return
        self.done = True
        self.connection.tap = None
        self.connection.close()
        if self.cookie is not None:
            self.cookie.cancel()
