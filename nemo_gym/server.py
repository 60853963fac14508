"""The server base every Gym server builds on: config, FastAPI app, sessions, errors, liveness."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, field_validator
from starlette.middleware.sessions import SessionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from nemo_gym import config as gym_config
from nemo_gym.body_limit import BodyLimit
from nemo_gym.client import ServerClient, ServerReply
from nemo_gym.config_types import CatalogSettings
from nemo_gym.durable.adoption import Adopter
from nemo_gym.durable.keeper import DurableSessions
from nemo_gym.durable.states import DurableState
from nemo_gym.durable.store import SessionStore, store_path
from nemo_gym.durable.write_through import WriteThrough
from nemo_gym.errors import ServerErrorsAsJson, server_error
from nemo_gym.routing.cancel_on_disconnect import CancelOnDisconnect
from nemo_gym.routing.forwarder import Forwarder
from nemo_gym.routing.liveness import LifeLock
from nemo_gym.routing.owner import OwnerReader
from nemo_gym.routing.placement import Placement
from nemo_gym.routing.private_server import PrivateServer
from nemo_gym.routing.router import SessionRouter
from nemo_gym.routing.worker import SOCKET_DIR_ENV, new_worker_id, socket_path
from nemo_gym.session_token import token_serializer
from nemo_gym.sessions import SessionIdMiddleware, session_cookie_name
from nemo_gym.signing_secret import check_length, session_secret
from nemo_gym.strict_json import StrictJSONRoute

CONFIG_PATH_ENV = "NEMO_GYM_CONFIG_PATH"
INSTANCE_ENV = "NEMO_GYM_INSTANCE"


class BaseServerConfig(CatalogSettings):
    """Settings every instance has, upstream's catalog keys included. Subclasses add their own; unknown keys are config errors."""

    model_config = ConfigDict(extra="forbid")

    entrypoint: str = "app.py"
    host: str = gym_config.DEFAULT_HOST
    port: int
    num_workers: int = 1
    session_secret: str | None = None
    # Larger request bodies get 413 before they are read.
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # Off switch for session routing (on by default for resources servers and agents).
    route_sessions: bool = True
    # Off switch for balanced placement: with it off, a new session lives where its first request lands.
    place_sessions: bool = True
    # Off switch for durable sessions (on for routed servers whose class declares ``session_states``).
    durable_sessions: bool = True

    @field_validator("session_secret")
    @classmethod
    def secret_long_enough(cls, secret: str | None) -> str | None:
        return secret if secret is None else check_length(secret, "session_secret")


class SimpleServer:
    """One Gym server: a FastAPI app with sessions, a JSON error layer and ``GET /``.

    Subclasses register their routes in ``setup_webserver`` and read ``request.session["session_id"]``.
    """

    config_class: ClassVar[type[BaseServerConfig]] = BaseServerConfig
    # Servers that keep per-session state route each session to its owner worker.
    route_sessions: ClassVar[bool] = False
    # Where a session ends: a 2xx reply to a request for one of these paths deletes its durable state.
    session_end_paths: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, instances: dict[str, gym_config.Instance], socket_dir: str | None = None) -> None:
        self.name = name
        self.instances = instances
        self.config = self.config_class.model_validate(instances[name].settings)
        self.secret = session_secret(name, self.config.session_secret)
        self.server_client = ServerClient(instances)
        # This worker's ID, stamped into the sessions it creates; None when nothing is routed.
        self.worker_id: str | None = None
        # Where each worker holds its life lock (and, routed, serves its private socket).
        self.socket_dir: str | None = None
        self.placement: Placement | None = None
        if self.is_routed(self.config):
            self.worker_id = new_worker_id()
            self.socket_dir = socket_dir or os.environ[SOCKET_DIR_ENV]
            self.forwarder = Forwarder(self.socket_dir)
            self.placement = Placement(self.socket_dir, self.worker_id, self.config.num_workers, balance=self.config.place_sessions)
        elif self.config.num_workers > 1:
            # Unrouted workers too tell the launcher, by their lock, that they serve.
            self.socket_dir = socket_dir or os.environ.get(SOCKET_DIR_ENV) or None

    @classmethod
    def is_routed(cls, config: BaseServerConfig) -> bool:
        """Several workers, a server that keeps sessions, and routing not switched off."""
        return cls.route_sessions and config.route_sessions and config.num_workers > 1

    @classmethod
    def from_environment(cls) -> "SimpleServer":
        """Build the server the launcher described in this process's environment."""
        data = json.loads(Path(os.environ[CONFIG_PATH_ENV]).read_text())
        instances = gym_config.parse(data, check_ports=False)
        return cls(os.environ[INSTANCE_ENV], instances)

    @property
    def session_cookie(self) -> str:
        return session_cookie_name(self.name)

    def setup_webserver(self) -> FastAPI:
        """Make the app and register routes. Subclasses call ``super()`` and add theirs."""
        app = FastAPI(title=self.name, lifespan=self.lifespan)
        app.router.route_class = StrictJSONRoute
        app.get("/")(self.liveness)
        app.add_exception_handler(Exception, self.unhandled_error)
        return app

    @property
    def session_options(self) -> dict[str, Any]:
        """SessionMiddleware's settings: the app's, and the router's reading of the same cookie."""
        return {"secret_key": self.secret, "session_cookie": self.session_cookie}

    def session_states(self) -> DurableState | None:
        """The per-session state this server keeps durable (``nemo_gym.durable``); None: memory only."""
        return None

    def build_app(self) -> ASGIApp:
        """The app uvicorn serves: the body limit, then (with routing) the session router, then the app."""
        app = self.setup_webserver()
        app.add_middleware(ServerErrorsAsJson)
        states = self.session_states() if self.worker_id is not None and self.config.durable_sessions else None
        durable = None if states is None else DurableSessions(SessionStore(store_path(self.name)), states, self.worker_id)
        if durable is not None:
            app.add_middleware(WriteThrough, sessions=durable, end_paths=self.session_end_paths, tokens=token_serializer(self.secret))
        app.add_middleware(SessionIdMiddleware, owner=self.worker_id)
        app.add_middleware(SessionMiddleware, **self.session_options)
        local = CancelOnDisconnect(app)
        if self.worker_id is None:
            return BodyLimit(local, self.config.max_body_bytes)
        owners = OwnerReader(self.session_options, token_serializer(self.secret))
        if durable is not None:
            self.forwarder.adopter = Adopter(local, durable, owners, self.forwarder)
        return BodyLimit(SessionRouter(local, self.worker_id, owners, self.forwarder, self.placement), self.config.max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.server_client.close)
            if self.socket_dir is None:
                yield
                return
            life_lock = LifeLock(self.socket_dir, self.worker_id or new_worker_id())
            stack.callback(life_lock.release)
            if self.worker_id is not None:
                # Other workers reach this one's sessions only once its own start-up is done.
                private = PrivateServer(app, socket_path(self.socket_dir, self.worker_id))
                stack.push_async_callback(self.forwarder.close)
                await private.start()
                stack.push_async_callback(private.stop)
                self.placement.open()
                stack.callback(self.placement.close)
            # Held from now until the private socket is gone: while it is, this worker is alive.
            life_lock.hold()
            yield

    async def liveness(self) -> dict[str, str]:
        return {"status": "ok"}

    async def unhandled_error(self, request: Request, error: Exception) -> JSONResponse:
        """An error outside the session layer (the layer inside it answers the handlers' own)."""
        return server_error(error)


class ServerApp:
    """A server module's module-level ``app``, which uvicorn imports in every worker.

    It is built on first use from the config the launcher put in the environment, so importing the
    module (in tests, or to read its request models) starts nothing.
    """

    def __init__(self, server_class: type[SimpleServer]) -> None:
        self.server_class = server_class
        self._app: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = self.server_class.from_environment().build_app()
        await self._app(scope, receive, send)


def set_cookies(response: Any, cookies: dict[str, str]) -> None:
    """Hand the cookies of every server a session touched back to the caller."""
    for key, value in cookies.items():
        response.set_cookie(key, value, httponly=True, samesite="lax")


def checked(reply: ServerReply, what: str) -> ServerReply:
    """Pass a failed hop on to the caller: a client error keeps its status (a lost session stays a 410)."""
    if reply.ok:
        return reply
    status = reply.status if 400 <= reply.status < 500 else 502
    raise HTTPException(status, f"{what} answered {reply.status}: {reply.text}")
