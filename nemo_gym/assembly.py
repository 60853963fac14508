"""One worker, assembled: every part a server's worker needs, built once, in the order the parts depend on
each other, each given its collaborators through its constructor; the ASGI stack uvicorn serves, from one
list, outermost first (as Starlette's ``build_middleware_stack``); and start-up and shutdown as methods of
their own (as uvicorn's ``Server.startup``/``shutdown``).

``SimpleServer.build_app`` makes an ``Assembly`` in each worker, and its lifespan runs ``startup`` and
``shutdown``; the server keeps its user-facing API (``nemo_gym.server``). A request crosses, from the
outside in:

- ``MetricsEndpoint`` (``GET /metrics``), ``BodyLimit`` (``max_body_bytes``);
- with durable sessions, ``CheckpointAdmin`` (``gym sessions checkpoint``'s endpoints);
- routed (several workers of a server that keeps sessions), ``SessionRouter``: served here, or forwarded
  to the session's owner, on this host or another replica's;
- ``ServedHere`` (counted as served by this worker), ``CancelOnDisconnect``;
- the FastAPI app, whose own middleware is, outermost first: with owner leases ``ToHolder`` (a token's session
  another worker holds now is sent on to it), the session layer (``SessionCookie``,
  ``SessionIdMiddleware``), with durable sessions ``CheckpointGate`` and ``WriteThrough``, with
  sessions ``Lifecycle``, ``ServerErrorsAsJson``, then whatever the server added itself.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp

from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.checkpoint import CheckpointGate, Gate
from nemo_gym.durable.checkpoint_admin import CheckpointAdmin
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.lease import RENEWALS_PER_LEASE, LeaseTerms, liveness_domain
from nemo_gym.durable.store import open_store
from nemo_gym.durable.write_through import WriteThrough
from nemo_gym.env import FORWARD_PORT_ENV, SOCKET_DIR_ENV
from nemo_gym.lifecycle.cap import LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.middleware import Lifecycle
from nemo_gym.metrics.exposition import Exposition
from nemo_gym.metrics.layers import MetricsEndpoint, ServedHere
from nemo_gym.metrics.meters import METERS
from nemo_gym.middleware.body_limit import BodyLimit
from nemo_gym.middleware.cancel_on_disconnect import CancelOnDisconnect
from nemo_gym.middleware.errors import ServerErrorsAsJson
from nemo_gym.process import public_server
from nemo_gym.protocols.handing_off import TAKERS_STATE_KEY
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.routing.forwarder import Forwarder
from nemo_gym.routing.lost import LostWithOwner
from nemo_gym.routing.owner import OwnerReader
from nemo_gym.routing.placement import Placement
from nemo_gym.routing.replica import advertised_host, replica_address, replica_keys
from nemo_gym.routing.router import SessionRouter
from nemo_gym.routing.to_holder import ToHolder
from nemo_gym.routing.transport import Transport, transport_class
from nemo_gym.routing.transport.credentials import WINDOW_SECONDS, ReplicaCredentials
from nemo_gym.routing.early_hand_off import EarlyHandOff
from nemo_gym.routing.relay import Relays
from nemo_gym.routing.transport.hand_off import HandOffs
from nemo_gym.routing.transport.hand_off_receiver import HandOffReceiver
from nemo_gym.routing.transport.tcp import TcpTransport, tls_contexts
from nemo_gym.sessions.worker import new_worker_id
from nemo_gym.sessions.cookie import SESSION_MAX_AGE_SECONDS, SessionCookie, SessionIdMiddleware

if TYPE_CHECKING:
    from fastapi import FastAPI

# A replica set's forward to a replica that takes no connection is retried this long, then answered 503.
REPLICA_RETRY_SECONDS = 3
# The middlewares that give a request its session, outermost first.
SESSION_LAYER = (SessionCookie, SessionIdMiddleware)


class Assembly:
    """One worker's parts. Built in two steps, as the server's own API needs: ``Assembly(server, socket_dir)``
    makes what identifies and connects the worker (its id, its transport to the other workers of this host,
    the placement of new sessions, in a replica set its transport to the other replicas), which the
    server's ``setup_webserver`` reads (the session layer stamps the worker into each new session); then
    ``stack(app)`` makes what keeps the sessions (the durable store and its lease, adoption, the lifecycle)
    around the app the server made, and returns the ASGI app to serve."""

    def __init__(self, server: Any, socket_dir: str | None) -> None:
        """``server``: the ``nemo_gym.server.SimpleServer`` being built (that module imports this one)."""
        config = server.config
        self.server = server
        self.routed = server.is_routed(config)
        self.worker_id = new_worker_id() if self.routed else None
        # The directory of this host that the server's workers share (default: the launcher's); a routed worker needs one.
        self.socket_dir = socket_dir or (os.environ[SOCKET_DIR_ENV] if self.routed else os.environ.get(SOCKET_DIR_ENV))
        # Unrouted workers of several too tell the launcher, through the transport, that they serve.
        self.transport: Transport | None = transport_class()(self.socket_dir) if self.socket_dir and (self.routed or config.num_workers > 1) else None
        self.placement = None
        self.replicas: TcpTransport | None = None
        if self.routed:
            self.placement = Placement(self.socket_dir, self.worker_id, config.num_workers, self.transport.is_alive, balance=config.place_sessions)
            if server.is_replica(config) and (port := config.forward_port or int(os.environ.get(FORWARD_PORT_ENV, 0))):
                self.replicas = replica_transport(server, port)
        self.replica = None if self.replicas is None else self.replicas.replica
        self.replica_keys = None if self.replicas is None else replica_keys(self.replicas.replica, self.replicas.forward_port)
        self.durable: DurableSessions | None = None
        self.adopter: Adopter | None = None
        self.lifecycle: SessionLifecycle | None = None
        self.gate: Gate | None = None
        self.forwarder: Forwarder | None = None
        self.to_replicas: Forwarder | None = None
        self.router: SessionRouter | None = None
        # On one host, a request for a sibling's session hands it its connection (``hand_off``, ``transport.hand_off``).
        self.hand_offs = HandOffs(self.socket_dir) if self.routed and config.hand_off else None
        self.running = contextlib.AsyncExitStack()

    def stack(self, app: FastAPI) -> ASGIApp:
        """The app uvicorn serves: ``app`` (the server's) inside every layer of this worker, as the module's docstring lists them."""
        server, config = self.server, self.server.config
        states = server.session_states() if self.routed and config.durable_sessions else None
        if states is not None:
            # A durable row is rewritten as a use at most every quarter of the idle timeout (docs/lifecycle.md).
            refresh = (config.session_idle_timeout_seconds or SESSION_MAX_AGE_SECONDS) / 4
            lease = LeaseTerms(liveness_domain(self.socket_dir), self.replica_keys or {}, config.owner_lease_seconds)
            store = open_store(config.session_store, server.name, timeout_seconds=config.store_timeout_seconds)
            self.durable = DurableSessions(store, states, self.worker_id, refresh, lease)
        if server.route_sessions:
            is_alive = self.transport.is_alive if self.routed else (lambda worker: True)
            caps = server.session_caps()
            # The host's workers count their live sessions together only for a cap to read: without one, each counts its own.
            count = LiveCount(self.socket_dir if self.routed and caps else None, self.worker_id, is_alive)
            timeout = config.session_idle_timeout_seconds or None
            self.lifecycle = SessionLifecycle(server.on_session_end, timeout, count, caps, self.durable, self.worker_id)
        if self.durable is not None:
            # Sessions are taken over from the store in one place, whichever path finds them (the router, the write-through, the sweep).
            self.adopter = Adopter(self.durable, self.lifecycle, self.transport.is_alive, self.replica_keys)
            # Durable sessions can be checkpointed (``gym sessions checkpoint``): the host's workers share a gate.
            self.gate = Gate(self.socket_dir)
        if self.routed:
            self.forwarders()
        # With leases, a token's session held by another worker now is sent on to it (``to_holder``), outside the session layer.
        holder = [Middleware(ToHolder, forwarder=self.forwarder, replica_forwarder=self.to_replicas, replica=self.replica)] if self.durable and self.durable.lease else []
        inner = [
            *([Middleware(CheckpointGate, gate=self.gate), Middleware(WriteThrough, adopter=self.adopter, tokens=server.tokens)] if self.durable else []),
            *([Middleware(Lifecycle, lifecycle=self.lifecycle, tokens=server.tokens, routes=app.router.routes, free_paths=server.session_free_paths, end_paths=server.session_end_paths)] if self.lifecycle else []),
            Middleware(ServerErrorsAsJson),
        ]
        sessions = [layer for layer in app.user_middleware if layer.cls in SESSION_LAYER]
        app.user_middleware = [*holder, *sessions, *inner, *(layer for layer in app.user_middleware if layer.cls not in SESSION_LAYER)]
        exposition = Exposition(METERS, server.metric_collectors())
        outer = [Middleware(MetricsEndpoint, exposition=exposition, worker_id=self.worker_id), Middleware(BodyLimit, max_body_bytes=config.max_body_bytes)]
        if self.routed:
            self.router_layers(outer)
        outer += [Middleware(ServedHere), Middleware(CancelOnDisconnect)]
        served: ASGIApp = app
        for cls, args, kwargs in reversed(outer):
            served = cls(served, *args, **kwargs)
        return served

    def forwarders(self) -> None:
        """A routed worker's forwarders: to this host's workers, and in a replica set to the other replicas'."""
        lease = None if self.durable is None else self.durable.lease
        # Where owners hold leases (a store shared across hosts), a forward waiting on a frozen owner is given up once its lease expired.
        expiry = {} if lease is None else {"owner_expired": self.durable.owner_expired, "expiry_check_seconds": lease.seconds / RENEWALS_PER_LEASE}
        self.forwarder = Forwarder(self.transport, **expiry)
        self.to_replicas = None if self.replicas is None else Forwarder(self.replicas, busy_wait_seconds=REPLICA_RETRY_SECONDS, hop="replica", **expiry)

    def router_layers(self, outer: list[Middleware]) -> None:
        """The layers of a routed worker: the checkpoint's endpoints (durable sessions), then the session router."""
        server, config = self.server, self.server.config
        lost = LostWithOwner() if self.adopter is None else self.adopter
        owners = OwnerReader(server.session_options, server.tokens)
        if self.gate is not None:
            outer.append(Middleware(CheckpointAdmin, gate=self.gate, instance=server.name, secret=server.secret, store_location=config.session_store))
        router = [self.worker_id, owners, self.forwarder, self.placement, lost, server.session_start_paths, self.replica, self.to_replicas, self.hand_offs]
        outer.append(Middleware(self.routed_by, *router))

    def routed_by(self, app: ASGIApp, *parts: Any) -> SessionRouter:
        """The session router around ``app``, kept: a replica's forwarding port hands it the other replicas' forwards."""
        self.router = SessionRouter(app, *parts)
        return self.router

    async def startup(self, app: FastAPI) -> None:
        """Before the worker serves: the sweeper, the owner lease, the forwarding port, this worker's socket (whose
        requests, from the other workers of this host, go to ``app``, the server's), the placement counter. What
        started is stopped again if a later part fails to."""
        try:
            await self.start(app)
        except BaseException:
            await self.shutdown()
            raise

    async def start(self, app: FastAPI) -> None:
        running, config = self.running, self.server.config
        if self.lifecycle is not None:
            self.lifecycle.open(None if self.adopter is None else self.adopter.sweep_orphans)
            running.push_async_callback(self.lifecycle.close)
        if self.transport is None:
            return
        if self.durable is not None and self.durable.lease is not None:
            # Held before this worker serves, let go when it stops (its sessions adoptable at once).
            await self.durable.lease.start()
            running.push_async_callback(self.durable.lease.stop)
        if self.replicas is not None:
            # Before the life name, which the launcher counts as ready: a ready worker takes the other replicas' forwards.
            await running.enter_async_context(self.replicas.serving(self.worker_id, self.router.from_replica, InputLimits.of(config)))
            running.push_async_callback(self.replicas.close)
        if self.hand_offs is not None:
            running.callback(self.hand_offs.close)
        public = public_server.current()
        if public is not None and self.hand_offs is not None:
            # Taken by the public port's protocol before any layer sees them: the siblings' sessions' requests handed off at
            # once (``routing.early_hand_off``); the other replicas' relayed as bytes (``routing.relay``).
            takers = [EarlyHandOff(self.router, self.hand_offs)] + ([Relays(self.router, config.max_body_bytes)] if self.relays_replicas() else [])
            public.lifespan.state[TAKERS_STATE_KEY] = takers
            running.callback(public.lifespan.state.pop, TAKERS_STATE_KEY, None)
        # The siblings' connections to the public port, and to the forwarding port in a replica set, served here.
        ports = {} if self.replicas is None else {self.replicas.forward_port: self.replicas.port_server}
        if self.hand_offs is not None and (public is not None or ports):
            # Taking them from before the life name is held; uvicorn's own server (one worker, a test's) gives no
            # way to serve its port's, and siblings then forward.
            receiver = HandOffReceiver(self.socket_dir, self.worker_id, public, ports)
            receiver.start()
            running.push_async_callback(receiver.stop)
        # Other workers reach this one's sessions only once its own start-up is done.
        siblings_app = app if self.worker_id is not None else None
        await running.enter_async_context(self.transport.serving(self.worker_id or new_worker_id(), siblings_app, InputLimits.of(config)))
        running.push_async_callback(self.transport.close)
        if self.gate is not None:
            running.callback(self.gate.close)  # after the placement's: this worker's counter is gone then
        if self.placement is not None:
            # Published once alive, so that a counter whose worker's name is free is a dead worker's.
            self.placement.open()
            running.callback(self.placement.close)

    def relays_replicas(self) -> bool:
        """Whether this worker relays the requests of the other replicas' sessions as bytes: a replica whose forwards take
        no lease checks or checkpoint gate (durable sessions) and no span (tracing)."""
        return self.to_replicas is not None and self.durable is None and self.to_replicas.tracer is None

    async def shutdown(self) -> None:
        """In the reverse order of ``startup``."""
        await self.running.aclose()


class Part:
    """A server's attribute that reads its worker's part of the same name (None before ``build_app`` made the assembly)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, server: Any, owner: type | None = None) -> Any:
        if server is None:
            return self
        assembly = server._assembly
        return None if assembly is None else getattr(assembly, self.name)


def replica_transport(server: Any, port: int) -> TcpTransport:
    """The transport to the other replicas, of a replica whose forwarding port is ``port``."""
    config = server.config
    replica = replica_address(advertised_host(config.host, config.advertise_host), config.port)
    tls = (config.replica_tls_certfile, config.replica_tls_keyfile, config.replica_tls_ca_file)
    client_tls, server_tls = tls_contexts(*tls) if all(tls) else (None, None)
    credentials = ReplicaCredentials(server.secret, WINDOW_SECONDS + config.peer_dead_after_seconds)
    return TcpTransport(credentials, replica, config.host, port, config.peer_dead_after_seconds, client_tls, server_tls)
