"""The server base every Gym server builds on: config, FastAPI app, sessions, errors, liveness."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import warnings
from collections.abc import AsyncIterator, Collection
from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, PrivateAttr
from starlette.types import ASGIApp

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.config.paths import server_directory
from nemo_gym.assembly import SESSION_LAYER, Assembly, Part
from nemo_gym.config_types import BaseRunServerInstanceConfig
from nemo_gym.durable.states import DurableState
from nemo_gym.env import INSTANCE_ENV, SERVER_PROCESS_MODULE, WORKER_ENV
from nemo_gym.global_config import get_first_server_config_dict, get_global_config_dict
from nemo_gym.lifecycle.cap import Cap
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.metrics.meters import METERS
from nemo_gym.middleware.errors import server_error
from nemo_gym.middleware.strict_json import StrictJSONRoute
from nemo_gym.ray_cluster.need import code_imports_ray
from nemo_gym.server_utils import ServerClient, initialize_ray
from nemo_gym.sessions.cookie import NEW_SESSION_SCOPE_KEY, SessionCookie, SessionIdMiddleware
from nemo_gym.sessions.signing import SessionSigning


# pydantic's UnsupportedFieldAttributeWarning about the alias FastAPI gives every body parameter.
FIELD_INFO_WARNING = r"The '\w+' attribute with value .* was provided to the `Field\(\)` function"


class SimpleServer(SessionSigning, BaseModel):
    """One Gym server, a pydantic model built as ``Cls(config=..., server_client=...)``; what signs its sessions is
    ``sessions.signing``'s.

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

    # This worker's parts (``nemo_gym.assembly``), once ``build_app`` made them.
    _assembly: Assembly | None = PrivateAttr(None)

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

    # This worker's parts (``nemo_gym.assembly``), once ``build_app`` made them; None before (and when off): its ID,
    # stamped into the sessions it creates (None when nothing is routed); in a replica set, its replica's address
    # (``host:port``), the keys its sessions and tokens carry besides their owner (``routing.replica``) and the
    # transport to the other replicas; the transport to its siblings (None for one worker), the forwarder, the
    # placement of new sessions; its durable sessions (its side of the store) and the sessions' lifecycle.
    worker_id: ClassVar[Part] = Part()
    replica: ClassVar[Part] = Part()
    replica_keys: ClassVar[Part] = Part()
    replicas: ClassVar[Part] = Part()
    transport: ClassVar[Part] = Part()
    forwarder: ClassVar[Part] = Part()
    placement: ClassVar[Part] = Part()
    durable: ClassVar[Part] = Part()
    lifecycle: ClassVar[Part] = Part()

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
        lifecycle = self.lifecycle
        if lifecycle is None:  # an app served without build_app: no record of ends to keep it idempotent
            await self.on_session_end(session_id, EndReason.CLOSE)
            return {"session_id": session_id, "status": "closed"}
        if await lifecycle.end(session_id, EndReason.CLOSE):
            return {"session_id": session_id, "status": "closed"}
        detail = lifecycle.registry.ended(session_id) or "it is not live: it ended earlier, or never started"
        return {"session_id": session_id, "status": "already closed", "detail": detail}

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
        app.add_middleware(SessionIdMiddleware, owner=self.worker_id, replica=self.replica_keys, start_paths=self.session_start_paths)
        app.add_middleware(SessionCookie, **self.session_options)

    def session_states(self) -> DurableState | None:
        """The per-session state this server keeps durable (``nemo_gym.durable``); None: memory only."""
        return None

    def metric_collectors(self) -> Collection[Any]:
        """The server's own metrics, read at each scrape of ``GET /metrics``: ``prometheus_client`` collectors
        (objects with ``collect()``), made when the app is built; none by default."""
        return ()

    def build_app(self, socket_dir: str | None = None) -> ASGIApp:
        """The app uvicorn serves: the app ``setup_webserver`` makes, inside this worker's layers (``nemo_gym.assembly``).

        ``socket_dir`` is the directory of this host that the server's workers share (default: the
        launcher's, from the environment): the transport is built with it, and it holds the placement
        counters. A replica's forwarding port is ``forward_port``, else the one its main process chose; a
        server built where neither is known (in a test's process) routes on this host only.
        """
        # A body model that builds its validator on first use (the Responses types: defer_build) builds it
        # outside FastAPI's own silencing of pydantic's warning about the field info FastAPI wraps it in.
        warnings.filterwarnings("ignore", message=FIELD_INFO_WARNING)
        self._assembly = Assembly(self, socket_dir)
        METERS.install(self.worker_id, self.route_sessions)
        return self._assembly.stack(self.setup_webserver())

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
            if self._assembly is not None:
                await self._assembly.startup(app)
                stack.push_async_callback(self._assembly.shutdown)
            yield

    async def liveness(self) -> dict[str, str]:
        return {"status": "ok"}

    async def unhandled_error(self, request: Request, error: Exception) -> JSONResponse:
        """An error outside the session layer (the layer inside it answers the handlers' own)."""
        return server_error(error)
