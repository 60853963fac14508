"""Upstream NeMo Gym's client side of a server, under its names: ``ServerClient`` and the reply helpers.

``ServerClient.request/get/post(server_name, url_path, ...)`` call another instance of the running
config by name and return the ``aiohttp.ClientResponse`` itself; ``raise_for_status`` and
``get_response_json`` read it (its body is already read, so the connection is free again). One pooled
aiohttp session per client, with no cookie jar: callers pass ``cookies=`` explicitly (aiohttp's own
argument), the way an agent threading many sessions must. A call whose session cookie names an owner
worker goes on a connection to that worker (``nemo_gym.client.owner_pool``), so it needs no hop; in a
replica set, at its owner replica. A call with no session cookie for the instance (one that starts a
session) goes to the instance's URL or to one of the other replicas its ``replicas`` setting lists, in turn.
Every call, the module-level ``request``'s too, goes through ``nemo_gym.client.retries.send``: a call that may
change state carries an ``Idempotency-Key``, and a 503 with ``Retry-After`` or a cut connection is retried with it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import Any, Literal

import aiohttp
from omegaconf import DictConfig, open_dict
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from nemo_gym import SESSION_ID_KEY
from nemo_gym.client.owner_pool import OwnerPool, read_in_full
from nemo_gym.client.retries import MAX_NUM_TRIES, send  # noqa: F401 (upstream's name)
from nemo_gym.config_types import ROLLOUT_PATH_PREFIX, TOKEN_CAPTURE_PATH_SEGMENT, BaseServerConfig
from nemo_gym.env import DEFAULT_HEAD_PORT as DEFAULT_HEAD_SERVER_PORT, ENTRYPOINT_ENV, WORKER_ENV  # noqa: F401 (upstream's name)
from nemo_gym.global_config import (
    HEAD_SERVER_KEY_NAME,
    RAY_HEAD_NODE_ADDRESS_KEY_NAME,
    get_first_server_config_dict,
    get_global_config_dict,
    maybe_get_global_config_dict,
)
from nemo_gym.ray_cluster import cluster as ray_cluster
from nemo_gym.routing.replica import other_replica_urls
from nemo_gym.sessions.cookie import session_cookie_name

__all__ = [
    "SESSION_ID_KEY",
    "ServerClient",
    "ServerStatus",
    "apply_rollout_prefix",
    "get_first_server_config_dict",
    "get_response_json",
    "get_server_url",
    "initialize_ray",
    "is_nemo_gym_fastapi_entrypoint",
    "raise_for_status",
    "request",
    "rollout_path_prefix",
]

DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=600, sock_connect=10)


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit), cookie_jar=aiohttp.DummyCookieJar(), timeout=DEFAULT_TIMEOUT
    )


def json_ready(kwargs: dict[str, Any]) -> dict[str, Any]:
    """aiohttp's keyword arguments, a pydantic ``json=`` body dumped to plain JSON."""
    if isinstance(kwargs.get("json"), BaseModel):
        kwargs["json"] = kwargs["json"].model_dump(mode="json", exclude_unset=True)
    return kwargs


def cookie_value(cookies: Any, name: str) -> str | None:
    """The value of cookie ``name`` in aiohttp's ``cookies=`` argument (a mapping of values or morsels)."""
    value = cookies.get(name) if isinstance(cookies, Mapping) else None
    return getattr(value, "value", value)


# Upstream's ServerClient.poll_for_status results.
ServerStatus = Literal["success", "connection_error", "timeout", "unknown_error"]
# Servers are reached directly, never through a proxy of the environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerClient(BaseModel):
    """Calls the instances of one config by name."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    head_server_config: BaseServerConfig | None = None
    global_config_dict: DictConfig
    limit: int = 0
    # A session's calls go on a connection to the worker that owns it, so they need no hop.
    owner_pool: OwnerPool = Field(default_factory=lambda: OwnerPool(timeout=DEFAULT_TIMEOUT), exclude=True)
    _session: aiohttp.ClientSession | None = PrivateAttr(None)
    _urls: dict[str, str] = PrivateAttr(default_factory=dict)
    _replicas: dict[str, list[str]] = PrivateAttr(default_factory=dict)

    @classmethod
    def load_from_global_config(cls, head_server_config: BaseServerConfig | None = None) -> "ServerClient":
        return cls(head_server_config=head_server_config, global_config_dict=get_global_config_dict())

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session(self.limit)
        return self._session

    def _build_server_base_url(self, server_config_dict: Any) -> str:
        """A server's root URL from its settings (upstream's name; its tests replace it to point elsewhere)."""
        return f"http://{server_config_dict['host']}:{server_config_dict['port']}"

    def url(self, server_name: str, url_path: str) -> str:
        base = self._urls.get(server_name)
        if base is None:
            settings = get_first_server_config_dict(self.global_config_dict, server_name)
            base = self._urls[server_name] = self._build_server_base_url(settings)
        return f"{base}{url_path}"

    def replica_urls(self, server_name: str) -> list[str]:
        """The root URLs of the instance's other replicas (its ``replicas`` setting), over which new sessions spread."""
        urls = self._replicas.get(server_name)
        if urls is None:
            urls = self._replicas[server_name] = other_replica_urls(get_first_server_config_dict(self.global_config_dict, server_name))
        return urls

    async def request(self, server_name: str, url_path: str, method: str, **kwargs: Any) -> aiohttp.ClientResponse:
        """``method url_path`` on the instance named ``server_name``; ``kwargs`` go to aiohttp (``json``, ``cookies`` ...)."""
        session_cookie = cookie_value(kwargs.get("cookies"), session_cookie_name(server_name))
        return await self.send(server_name, url_path, method, session_cookie, **kwargs)

    async def send(self, server_name: str, url_path: str, method: str, session_cookie: str | None, **kwargs: Any) -> aiohttp.ClientResponse:
        """The request on a connection to the owner worker of the session ``session_cookie`` names (``owner_pool``)."""
        url = self.url(server_name, url_path)
        replicas = self.replica_urls(server_name)
        kwargs = json_ready(kwargs)
        cookie_name = session_cookie_name(server_name)

        def attempt(kwargs: dict[str, Any]) -> Awaitable[aiohttp.ClientResponse]:
            # A 503 may have set the session cookie anew (its new owner): the retry goes to that owner.
            cookie = cookie_value(kwargs.get("cookies"), cookie_name) or session_cookie
            return self.owner_pool.request(self.session(), server_name, cookie, method, url, replicas, **kwargs)

        return await send(method, kwargs, attempt)

    def poll_for_status(self, server_name: str) -> ServerStatus:
        """Upstream's readiness probe (blocking): ``success`` when the server's root answers at all (any
        status), else ``connection_error``, ``timeout`` (5 s) or ``unknown_error``."""
        try:
            if server_name == HEAD_SERVER_KEY_NAME:
                settings = self.global_config_dict[HEAD_SERVER_KEY_NAME]
            else:
                settings = get_first_server_config_dict(self.global_config_dict, server_name)
            DIRECT.open(self._build_server_base_url(settings), timeout=5).close()
        except urllib.error.HTTPError:
            return "success"
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                return "timeout"
            return "connection_error" if isinstance(error.reason, OSError) else "unknown_error"
        except TimeoutError:
            return "timeout"
        except Exception:
            return "unknown_error"
        return "success"

    async def get(self, server_name: str, url_path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.request(server_name, url_path, "GET", **kwargs)

    async def post(self, server_name: str, url_path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.request(server_name, url_path, "POST", **kwargs)

    async def close(self) -> None:
        await self.owner_pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


# Each event loop's shared session, and the parked async generator that closes it with the loop.
_shared_sessions: dict[asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, AsyncIterator[None]]] = {}
REQUEST_DEBUG_KEY_NAME = "global_aiohttp_client_request_debug"


def get_global_aiohttp_client() -> aiohttp.ClientSession:
    """Upstream's name for the process's shared pooled session of the running event loop (the one
    ``request`` uses); call it from async code. It is closed when the loop shuts down its async
    generators (``asyncio.run`` and uvicorn do, at their end), so none is left open at exit."""
    loop = asyncio.get_running_loop()
    session, _ = _shared_sessions.get(loop, (None, None))
    if session is None or session.closed:
        session = new_session()
        _shared_sessions[loop] = session, closed_with_the_loop(loop, session)
    return session


def closed_with_the_loop(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> AsyncIterator[None]:
    """``closer`` run to its first ``yield``: the loop then holds it as one of its async generators, and
    closing those at its shutdown runs its ``finally``."""
    generator = closer(loop, session)
    with contextlib.suppress(StopIteration):
        generator.__anext__().send(None)
    return generator


async def closer(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> AsyncIterator[None]:
    try:
        yield
    finally:
        if _shared_sessions.get(loop, (None,))[0] is session:
            del _shared_sessions[loop]
        await session.close()


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """Upstream's switch for logging each request of the shared session: the config's
    ``global_aiohttp_client_request_debug`` (False outside the launcher)."""
    config = maybe_get_global_config_dict()
    return bool(config.get(REQUEST_DEBUG_KEY_NAME, False)) if config is not None else False


async def request(method: str, url: str, _internal: bool = False, **kwargs: Any) -> aiohttp.ClientResponse:
    """``method url`` on the process's shared pooled session (one per event loop)."""
    session = get_global_aiohttp_client()
    kwargs = json_ready(kwargs)
    return await send(method, kwargs, lambda kwargs: read_in_full(session.request(method, url, **kwargs)))


async def raise_for_status(response: aiohttp.ClientResponse) -> None:
    """A reply that is not ``ok`` raises its own ``raise_for_status()`` error, the body attached as ``response_content``.

    Upstream's check: only ``ok``, ``read()`` and ``raise_for_status()`` are used, so a stand-in reply works too.
    """
    if response.ok:
        return
    content = await response.read()
    try:
        response.raise_for_status()
    except aiohttp.ClientResponseError as error:
        error.response_content = content
        raise


async def get_response_json(response: aiohttp.ClientResponse) -> Any:
    """The reply's body as JSON, whatever its content type (upstream's: only ``read()`` is used)."""
    return json.loads(await response.read())


def rollout_path_prefix(rollout_id: str | None, *, token_capture: bool = False) -> str:
    """``/ng-rollout/<id>`` (``/training-token-capture`` after it for a capture), or "" with no rollout id."""
    if not rollout_id:
        return ""
    return f"/{ROLLOUT_PATH_PREFIX}/{rollout_id}" + (f"/{TOKEN_CAPTURE_PATH_SEGMENT}" if token_capture else "")


def apply_rollout_prefix(base_url: str, rollout_id: str | None, *, token_capture: bool = False) -> str:
    """A model server's root URL with the rollout's prefix after it."""
    return base_url.rstrip("/") + rollout_path_prefix(rollout_id, token_capture=token_capture) if rollout_id else base_url


def get_server_url(server_name: str) -> str:
    settings = get_first_server_config_dict(get_global_config_dict(), server_name)
    return f"http://{settings['host']}:{settings['port']}"


def is_nemo_gym_fastapi_entrypoint(file: str) -> bool:
    """Whether this process is a uvicorn worker the launcher started to serve the module at ``file``."""
    entrypoint = os.environ.get(ENTRYPOINT_ENV)
    if os.environ.get(WORKER_ENV) != "1" or not entrypoint:
        return False
    return Path(file).resolve().parts[-len(Path(entrypoint).parts) :] == Path(entrypoint).parts


# Whether this process started the Ray cluster it is connected to (upstream's flag).
_NEMO_GYM_STARTED_RAY_CLUSTER: bool = False


def initialize_ray() -> None:
    """Upstream's: connect this process to Ray once. With the config's ``ray_head_node_address``, join that
    cluster; without one, start a local cluster and write its address into this process's global config
    (``ray_head_node_address``), so that what this process hands the config to joins it. The launcher
    calls this for the servers that need Ray (docs/ray.md); ``RayMissing`` without the extra."""
    global _NEMO_GYM_STARTED_RAY_CLUSTER
    ray = ray_cluster.ray_module("initialize_ray")
    if ray.is_initialized():
        print("Ray already initialized")
        return
    global_config_dict = get_global_config_dict()
    address = global_config_dict.get(RAY_HEAD_NODE_ADDRESS_KEY_NAME)
    if address:
        print(f"Connecting to Ray cluster at specified address: {address}")
    else:
        print("NeMo Gym is starting a new Ray cluster...")
    gcs_address, started = ray_cluster.join(address)
    if started:
        _NEMO_GYM_STARTED_RAY_CLUSTER = True
        with open_dict(global_config_dict):
            global_config_dict[RAY_HEAD_NODE_ADDRESS_KEY_NAME] = gcs_address
        print(f"Started Ray cluster at {gcs_address}")


def maybe_ray_cluster_exit() -> None:
    """Upstream's: at exit, stop the Ray cluster this process started (a joined one is left running)."""
    global _NEMO_GYM_STARTED_RAY_CLUSTER
    if not _NEMO_GYM_STARTED_RAY_CLUSTER:
        return
    print("Shutting down Ray cluster spun up by NeMo Gym...")
    ray_cluster.leave()
    _NEMO_GYM_STARTED_RAY_CLUSTER = False


atexit.register(maybe_ray_cluster_exit)
