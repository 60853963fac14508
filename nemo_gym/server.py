"""The server base every Gym server builds on: config, FastAPI app, sessions, errors, liveness."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import secrets
import sys
import warnings
from collections.abc import AsyncIterator, Collection
from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from itsdangerous import URLSafeSerializer
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, PrivateAttr
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.config.paths import server_directory
from nemo_gym.config_types import BaseRunServerInstanceConfig
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.checkpoint import CheckpointAdmin, CheckpointGate, Gate
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.lease import RENEWALS_PER_LEASE, LeaseStore, OwnerLease, liveness_domain
from nemo_gym.durable.states import DurableState
from nemo_gym.durable.store import open_store
from nemo_gym.durable.write_through import WriteThrough
from nemo_gym.env import FORWARD_PORT_ENV, INSTANCE_ENV, SERVER_PROCESS_MODULE, SOCKET_DIR_ENV, WORKER_ENV
from nemo_gym.global_config import get_first_server_config_dict, get_global_config_dict
from nemo_gym.lifecycle.cap import Cap, LiveCount
from nemo_gym.lifecycle.ending import SessionLifecycle
from nemo_gym.lifecycle.middleware import Lifecycle
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.metrics.exposition import Exposition
from nemo_gym.metrics.layers import MetricsEndpoint, ServedHere
from nemo_gym.metrics.meters import METERS
from nemo_gym.middleware.body_limit import BodyLimit
from nemo_gym.middleware.cancel_on_disconnect import CancelOnDisconnect
from nemo_gym.middleware.errors import ServerErrorsAsJson, server_error
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.middleware.strict_json import StrictJSONRoute
from nemo_gym.ray_cluster.need import code_imports_ray
from nemo_gym.routing.forwarder import Forwarder
from nemo_gym.routing.lost import LostWithOwner
from nemo_gym.routing.owner import OwnerReader
from nemo_gym.routing.placement import Placement
from nemo_gym.routing.replica import advertised_host, replica_address, replica_keys
from nemo_gym.routing.router import SessionRouter
from nemo_gym.routing.transport import Transport, transport_class
from nemo_gym.routing.transport.credentials import WINDOW_SECONDS, ReplicaCredentials
from nemo_gym.routing.transport.tcp import TcpTransport, tls_contexts
from nemo_gym.sessions.worker import new_worker_id
from nemo_gym.server_utils import ServerClient, initialize_ray
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY, SESSION_MAX_AGE_SECONDS, SessionCookie, SessionIdMiddleware, session_cookie_name
from nemo_gym.sessions.secret import instance_key, session_secret
from nemo_gym.sessions.token import token_serializer


# A replica set's forward to a replica that takes no connection is retried this long, then answered 503.
REPLICA_RETRY_SECONDS = 3
# The middlewares that give a request its session, outermost first.
SESSION_LAYER = (SessionCookie, SessionIdMiddleware)
# pydantic's UnsupportedFieldAttributeWarning about the alias FastAPI gives every body parameter.
FIELD_INFO_WARNING = r"The '\w+' attribute with value .* was provided to the `Field\(\)` function"


class SimpleServer(BaseModel):
    """One Gym server, a pydantic model built as ``Cls(config=..., server_client=...)``.

    Its config class is the annotation of ``config``; state lives in pydantic fields
    (``Field(default_factory=dict)``), private attributes set in ``model_post_init``, or plain
    attributes. Subclasses register their routes in ``setup_webserver`` and read
    ``request.session[SESSION_ID_KEY]``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")

    config: BaseRunServerInstanceConfig
    server_client: ServerClient
    # The class of ``config``, read from its annotation.
    config_class: ClassVar[type[BaseRunServerInstanceConfig]] = BaseRunServerInstanceConfig
    # Servers that keep per-session state route each session to its owner worker.
    route_sessions: ClassVar[bool] = False
    # Where a session ends: a 2xx reply to a request for one of these paths ends it (``on_session_end``, reason "verify").
    session_end_paths: ClassVar[frozenset[str]] = frozenset()
    # Where a session starts: a request here always starts a new one (a new id), whatever its cookie or token names.
    session_start_paths: ClassVar[frozenset[str]] = frozenset()
    # Requests that neither start nor use a session (liveness, metrics, documentation, the close itself).
    session_free_paths: ClassVar[frozenset[str]] = frozenset(
        {"/", "/metrics", "/close_session", "/aggregate_metrics", "/reverify_mode", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    )

    # This worker's ID, stamped into the sessions it creates; None when nothing is routed.
    _worker_id: str | None = PrivateAttr(None)
    # How this worker reaches its siblings and is alive to them; None for one worker (or no socket directory).
    _transport: Transport | None = PrivateAttr(None)
    _forwarder: Forwarder | None = PrivateAttr(None)
    _placement: Placement | None = PrivateAttr(None)
    _durable: DurableSessions | None = PrivateAttr(None)
    _adopter: Adopter | None = PrivateAttr(None)
    # The sessions' lifecycle (ends, idleness, caps), on servers that keep sessions, once the app is built.
    _lifecycle: SessionLifecycle | None = PrivateAttr(None)
    _gate: Gate | None = PrivateAttr(None)
    # In a replica set: this replica's address, the transport to the other replicas, and the router.
    _replica: str | None = PrivateAttr(None)
    _replicas: TcpTransport | None = PrivateAttr(None)
    _router: SessionRouter | None = PrivateAttr(None)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.config_class = cls.model_fields["config"].annotation

    @classmethod
    def is_routed(cls, config: BaseRunServerInstanceConfig) -> bool:
        """Several workers, a server that keeps sessions, and routing not switched off."""
        return cls.route_sessions and config.route_sessions and config.num_workers > 1

    @classmethod
    def is_replica(cls, config: BaseRunServerInstanceConfig) -> bool:
        """A routed server with a configured ``session_secret`` is a replica of a replica set (docs/replicas.md)."""
        return cls.is_routed(config) and config.session_secret is not None

    @classmethod
    def validate_config(cls, name: str, settings: dict[str, Any]) -> BaseRunServerInstanceConfig:
        """An instance's settings as this server's config (the instance name filled in)."""
        return cls.config_class.model_validate({**settings, "name": name})

    @classmethod
    def load_config_from_global_config(cls) -> BaseRunServerInstanceConfig:
        """The config of the instance the launcher started this process for."""
        name = os.environ[INSTANCE_ENV]
        settings = get_first_server_config_dict(get_global_config_dict(), name)
        return cls.validate_config(name, OmegaConf.to_container(settings, resolve=True))

    @classmethod
    def from_environment(cls) -> "SimpleServer":
        """Build the server the launcher described in this process's environment; one whose code imports
        ray joins the config's Ray cluster first, as upstream's every server does (docs/ray.md)."""
        if code_imports_ray(server_directory(cls.__module__)):
            initialize_ray()
        return cls(config=cls.load_config_from_global_config(), server_client=ServerClient.load_from_global_config())

    @classmethod
    def for_instance(cls, name: str, instances: dict[str, gym_config.Instance]) -> "SimpleServer":
        """Build the server of one instance of an already parsed config (tests and tools)."""
        client = ServerClient(global_config_dict=OmegaConf.create(gym_config.config_of(instances)))
        return cls(config=cls.validate_config(name, instances[name].settings), server_client=client)

    @classmethod
    def run_webserver(cls) -> FastAPI | None:
        """Upstream's start: in a uvicorn worker the launcher started, build and return the app unserved;
        anywhere else (``python app.py`` with the launcher's environment), this process becomes the
        instance's server process, the one the launcher itself would start: serving is the process's
        part (``nemo_gym.process.run``), which finds this class in the instance's module."""
        if os.environ.get(WORKER_ENV) == "1":
            return cls.from_environment().build_app()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", SERVER_PROCESS_MODULE])

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def worker_id(self) -> str | None:
        return self._worker_id

    @property
    def replica(self) -> str | None:
        """This replica's address (``host:port`` of its forwarding port), in a replica set; else None."""
        return self._replica

    @property
    def replica_keys(self) -> dict[str, str | int] | None:
        """What this replica's sessions and tokens carry besides their owner worker (``routing.replica``)."""
        return None if self._replicas is None else replica_keys(self._replicas.replica, self._replicas.forward_port)

    @property
    def replicas(self) -> TcpTransport | None:
        return self._replicas

    @property
    def transport(self) -> Transport | None:
        return self._transport

    @property
    def forwarder(self) -> Forwarder | None:
        return self._forwarder

    @property
    def placement(self) -> Placement | None:
        return self._placement

    @property
    def durable(self) -> DurableSessions | None:
        """This worker's durable sessions (its side of the store), once the app is built; None when they are off."""
        return self._durable

    @property
    def lifecycle(self) -> SessionLifecycle | None:
        return self._lifecycle

    async def on_session_end(self, session_id: str, reason: EndReason) -> None:
        """Called once when a session ends, however it ends (``reason``: "verify", "close", "idle", "expired",
        "conflict"), on the worker that held it, before its durable state and row go. Override it to release
        what the session holds (a sandbox, a browser, a connection) and to drop state the server keeps in
        plain dicts. "conflict": the store holds the session for another worker now, which uses its resources:
        drop this worker's copy only. An error raised here is logged; the session is ended all the same."""

    def session_caps(self) -> list[Cap]:
        """The caps on the instance's live sessions; a new session over one is refused with 503 (``max_sessions``)."""
        limit = self.config.max_sessions
        return [] if limit is None else [Cap(limit, f"max_sessions ({limit})")]

    async def close_session(self, request: Request) -> dict[str, str]:
        """End the request's session now, through ``on_session_end`` (reason "close"). Idempotent: a session
        that has ended already (closed, verified, idle) answers 200 with status "already closed"."""
        if NEW_SESSION_SCOPE_KEY in request.scope:
            raise HTTPException(400, "This request names no session (no session cookie, or one that does not verify): nothing to close.")
        session_id = request.session[SESSION_ID_KEY]
        lifecycle = self._lifecycle
        if lifecycle is None:  # an app served without build_app: no record of ends to keep it idempotent
            await self.on_session_end(session_id, EndReason.CLOSE)
            return {"session_id": session_id, "status": "closed"}
        if await lifecycle.end(session_id, EndReason.CLOSE):
            return {"session_id": session_id, "status": "closed"}
        detail = lifecycle.registry.ended(session_id) or "it is not live: it ended earlier, or never started"
        return {"session_id": session_id, "status": "already closed", "detail": detail}

    @functools.cached_property
    def secret(self) -> str:
        if not self.name and self.config.session_secret is None:
            # No instance to share a secret with (upstream's tests build servers named ""): this object's own.
            return secrets.token_urlsafe(32)
        return session_secret(self.name, self.config.session_secret)

    @functools.cached_property
    def signing_key(self) -> str:
        """What signs this instance's session cookies and MCP tokens: derived from the secret and the instance's
        name (``instance_key``), so an instance whose secret has the same value signs apart."""
        return instance_key(self.secret, self.name)

    @functools.cached_property
    def tokens(self) -> URLSafeSerializer:
        """The MCP session tokens' serializer (``sessions.token``), under this instance's signing key."""
        return token_serializer(self.signing_key)

    @property
    def session_cookie(self) -> str:
        return session_cookie_name(self.name)

    @functools.cached_property
    def instances(self) -> dict[str, gym_config.Instance]:
        """Every instance of the running config, parsed."""
        data = OmegaConf.to_container(self.server_client.global_config_dict, resolve=True)
        return gym_config.parse(data, check_ports=False)

    def setup_webserver(self) -> FastAPI:
        """Make the app and register routes. Subclasses call ``super()`` and add theirs.

        The app has its sessions already, as upstream's does, so a test can serve it alone; ``build_app``
        keeps them its outermost layer, outside whatever the subclass adds.
        """
        if self.__pydantic_private__ is None:
            # Built with model_post_init patched away (upstream's agent tests do): the private attributes' defaults.
            object.__setattr__(self, "__pydantic_private__", {name: attr.get_default() for name, attr in self.__private_attributes__.items()})
        # An empty instance name (upstream's tests use one) would be an OpenAPI document without a title.
        app = FastAPI(title=self.name or type(self).__name__, lifespan=self.lifespan)
        app.router.route_class = StrictJSONRoute
        app.get("/")(self.liveness)
        if self.route_sessions:
            app.post("/close_session")(self.close_session)
        app.add_exception_handler(Exception, self.unhandled_error)
        self.setup_session_middleware(app)
        return app

    def setup_session_middleware(self, app: FastAPI) -> None:
        """Give ``app`` this server's sessions (the session id, in the signed cookie); a second call adds
        nothing. Upstream's name: its servers that make a ``FastAPI()`` of their own call it."""
        if any(layer.cls in SESSION_LAYER for layer in app.user_middleware):
            return
        app.add_middleware(SessionIdMiddleware, owner=self._worker_id, replica=self.replica_keys, start_paths=self.session_start_paths)
        app.add_middleware(SessionCookie, **self.session_options)

    @property
    def session_options(self) -> dict[str, Any]:
        """The session layer's settings: the app's, and the router's reading of the same cookie."""
        return {"secret_key": self.signing_key, "session_cookie": self.session_cookie}

    def session_states(self) -> DurableState | None:
        """The per-session state this server keeps durable (``nemo_gym.durable``); None: memory only."""
        return None

    def metric_collectors(self) -> Collection[Any]:
        """The server's own metrics, read at each scrape of ``GET /metrics``: ``prometheus_client`` collectors
        (objects with ``collect()``), made when the app is built; none by default."""
        return ()

    def build_app(self, socket_dir: str | None = None) -> ASGIApp:
        """The app uvicorn serves: the metrics endpoint, the body limit, then (with routing) the session router, then the app.

        ``socket_dir`` is the directory of this host that the server's workers share (default: the
        launcher's, from the environment): the transport is built with it, and it holds the placement
        counters. A replica's forwarding port is ``forward_port``, else the one its main process chose; a
        server built where neither is known (in a test's process) routes on this host only.
        """
        # A body model that builds its validator on first use (the Responses types: defer_build) builds it
        # outside FastAPI's own silencing of pydantic's warning about the field info FastAPI wraps it in.
        warnings.filterwarnings("ignore", message=FIELD_INFO_WARNING)
        if self.is_routed(self.config):
            self._worker_id = new_worker_id()
            socket_dir = socket_dir or os.environ[SOCKET_DIR_ENV]
            self._transport = transport_class()(socket_dir)
            self._forwarder = Forwarder(self._transport)
            self._placement = Placement(
                socket_dir, self._worker_id, self.config.num_workers, self._transport.is_alive, balance=self.config.place_sessions
            )
            if self.is_replica(self.config) and (port := self.config.forward_port or int(os.environ.get(FORWARD_PORT_ENV, 0))):
                self._replicas = self.replica_transport(port)
                self._replica = self._replicas.replica
        elif self.config.num_workers > 1 and (socket_dir := socket_dir or os.environ.get(SOCKET_DIR_ENV)):
            # Unrouted workers too tell the launcher, through the transport, that they serve.
            self._transport = transport_class()(socket_dir)
        METERS.install(self._worker_id, self.route_sessions)
        app = self.setup_webserver()
        states = self.session_states() if self._worker_id is not None and self.config.durable_sessions else None
        # A durable row is rewritten as a use at most every quarter of the idle timeout (docs/lifecycle.md).
        refresh = (self.config.session_idle_timeout_seconds or SESSION_MAX_AGE_SECONDS) / 4
        durable = None if states is None else DurableSessions(open_store(self.config.session_store, self.name, timeout_seconds=self.config.store_timeout_seconds), states, self._worker_id, refresh)
        self._durable = durable
        if durable is not None and isinstance(durable.store, LeaseStore):
            keys = self.replica_keys or {}
            durable.lease = OwnerLease(durable.store, self._worker_id, liveness_domain(socket_dir), keys, self.config.owner_lease_seconds, durable.lapse)
            self._forwarder.owner_expired = durable.owner_expired
            self._forwarder.expiry_check_seconds = durable.lease.seconds / RENEWALS_PER_LEASE
        # Inside the sessions: the durable write-through, the lifecycle, then the errors answered as JSON.
        inner = [Middleware(ServerErrorsAsJson)]
        if self.route_sessions:
            lifecycle = self._lifecycle = self.session_lifecycle(socket_dir, durable)
            paths = {"free_paths": self.session_free_paths, "end_paths": self.session_end_paths}
            inner.insert(0, Middleware(Lifecycle, lifecycle=lifecycle, tokens=self.tokens, routes=app.router.routes, **paths))
        # Durable sessions are taken over from the store in one place, whichever path finds them (the router, the write-through, the sweep).
        adopter = self._adopter = None if durable is None else Adopter(durable, self._lifecycle, self._transport.is_alive, self.replica_keys)
        # Durable sessions can be checkpointed (``gym sessions checkpoint``): the host's workers share a gate.
        gate = self._gate = None if durable is None else Gate(socket_dir)
        if durable is not None:
            inner.insert(0, Middleware(WriteThrough, adopter=adopter, tokens=self.tokens))
            inner.insert(0, Middleware(CheckpointGate, gate=gate))
        sessions = [layer for layer in app.user_middleware if layer.cls in SESSION_LAYER]
        app.user_middleware = [*sessions, *inner, *(layer for layer in app.user_middleware if layer.cls not in SESSION_LAYER)]
        local = ServedHere(CancelOnDisconnect(app))
        exposition = Exposition(METERS, self.metric_collectors())
        if self._worker_id is None:
            return MetricsEndpoint(BodyLimit(local, self.config.max_body_bytes), exposition)
        owners = OwnerReader(self.session_options, self.tokens)
        lost = LostWithOwner() if adopter is None else adopter
        replica_forwarder = None if self._replicas is None else Forwarder(self._replicas, busy_wait_seconds=REPLICA_RETRY_SECONDS, hop="replica")
        if replica_forwarder is not None and durable is not None and durable.lease is not None:
            replica_forwarder.owner_expired, replica_forwarder.expiry_check_seconds = self._forwarder.owner_expired, self._forwarder.expiry_check_seconds
        router = self._router = SessionRouter(
            local, self._worker_id, owners, self._forwarder, self._placement, lost, self.session_start_paths, self._replica, replica_forwarder
        )
        served = router if gate is None else CheckpointAdmin(router, gate, self.name, self.secret, self.config.session_store)
        return MetricsEndpoint(BodyLimit(served, self.config.max_body_bytes), exposition, self._worker_id)

    def session_lifecycle(self, socket_dir: str | None, durable: DurableSessions | None) -> SessionLifecycle:
        """The ends, idleness and caps of this worker's sessions; the live count is shared through ``socket_dir`` when routed."""
        routed = self._worker_id is not None
        is_alive = self._transport.is_alive if routed else (lambda worker: True)
        count = LiveCount(socket_dir if routed else None, self._worker_id, is_alive)
        timeout = self.config.session_idle_timeout_seconds or None
        return SessionLifecycle(self.on_session_end, timeout, count, self.session_caps(), durable, self._worker_id)

    def replica_transport(self, port: int) -> TcpTransport:
        """The transport to the other replicas, of a replica whose forwarding port is ``port``."""
        config = self.config
        replica = replica_address(advertised_host(config.host, config.advertise_host), config.port)
        tls = (config.replica_tls_certfile, config.replica_tls_keyfile, config.replica_tls_ca_file)
        client_tls, server_tls = tls_contexts(*tls) if all(tls) else (None, None)
        credentials = ReplicaCredentials(self.secret, WINDOW_SECONDS + config.peer_dead_after_seconds)
        return TcpTransport(credentials, replica, config.host, port, config.peer_dead_after_seconds, client_tls, server_tls)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # What the imports and the app's building made lives as long as the process: frozen out of the
        # collector's sight, a full collection scans only what requests make. Unfrozen, every full
        # collection walked them all, and a server whose requests keep more objects (durable sessions)
        # paid most: measured in process, 0.75 ms of CPU more per counter episode, and 0.08 ms frozen.
        gc.collect()
        gc.freeze()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.server_client.close)
            if self._lifecycle is not None:
                self._lifecycle.open(None if self._adopter is None else self._adopter.sweep_orphans)
                stack.push_async_callback(self._lifecycle.close)
            if self._transport is None:
                yield
                return
            if self._durable is not None and self._durable.lease is not None:
                # Held before this worker serves, let go when it stops (its sessions adoptable at once).
                await self._durable.lease.start()
                stack.push_async_callback(self._durable.lease.stop)
            # Other workers reach this one's sessions only once its own start-up is done.
            siblings_app = app if self._worker_id is not None else None
            if self._replicas is not None:
                # Before the life name, which the launcher counts as ready: a ready worker takes the other replicas' forwards.
                await stack.enter_async_context(self._replicas.serving(self._worker_id, self._router.from_replica, InputLimits.of(self.config)))
                stack.push_async_callback(self._replicas.close)
            await stack.enter_async_context(self._transport.serving(self._worker_id or new_worker_id(), siblings_app, InputLimits.of(self.config)))
            stack.push_async_callback(self._transport.close)
            if self._gate is not None:
                stack.callback(self._gate.close)  # after the placement's: this worker's counter is gone then
            if self._placement is not None:
                # Published once alive, so that a counter whose worker's name is free is a dead worker's.
                self._placement.open()
                stack.callback(self._placement.close)
            yield

    async def liveness(self) -> dict[str, str]:
        return {"status": "ok"}

    async def unhandled_error(self, request: Request, error: Exception) -> JSONResponse:
        """An error outside the session layer (the layer inside it answers the handlers' own)."""
        return server_error(error)
