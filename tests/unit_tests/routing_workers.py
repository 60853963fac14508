"""Two (or more) workers of one server in this process, each on its own loopback port, sharing a real
socket directory: enough to send a request to exactly the worker a test chooses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import SimpleResourcesServer
from nemo_gym.client.reading import cookie_header
from nemo_gym.routing.transport.connection import OwnerConnection
from nemo_gym.sessions.worker import OWNER_KEY
from tests.unit_tests.in_process_server import serving


class EchoServer(SimpleResourcesServer):
    """Tells who handled a request and what arrived; keeps a per-session counter; can stream and hang."""

    cancelled: ClassVar[list[str]] = []
    hanging: ClassVar[list[str]] = []

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.api_route("/echo/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])(self.echo)
        app.post("/increment")(self.increment)
        app.post("/touch")(self.touch)
        app.post("/stream")(self.stream)
        app.post("/hang")(self.hang)
        self.counts: dict[str, int] = {}
        return app

    async def echo(self, request: Request, rest: str) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "session_id": request.session[SESSION_ID_KEY],
            "owner": request.session.get(OWNER_KEY),
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": [[name, value] for name, value in request.headers.items()],
            "body": (await request.body()).decode(),
            "client": list(request.client) if request.client else None,
        }

    async def increment(self, request: Request) -> dict[str, Any]:
        session_id = request.session[SESSION_ID_KEY]
        self.counts[session_id] = self.counts.get(session_id, 0) + 1
        return {"worker": self.worker_id, "count": self.counts[session_id]}

    async def touch(self, request: Request) -> dict[str, Any]:
        """Changes the session, so the reply carries a Set-Cookie."""
        request.session["touched_by"] = self.worker_id
        return {"worker": self.worker_id}

    async def stream(self, request: Request) -> StreamingResponse:
        body = await request.body()

        async def pieces():
            for start in range(0, len(body), 1000):
                yield body[start : start + 1000]
                await asyncio.sleep(0)

        return StreamingResponse(pieces(), media_type="application/octet-stream", headers={"x-worker": self.worker_id or ""})

    async def hang(self, request: Request) -> dict[str, str]:
        EchoServer.hanging.append(request.session[SESSION_ID_KEY])
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            EchoServer.cancelled.append(request.session[SESSION_ID_KEY])
            raise
        return {"status": "finished"}


class McpPathEchoServer(EchoServer):
    """EchoServer that also echoes under /mcp, the path where the session token outranks the cookie."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.api_route("/mcp/{rest:path}", methods=["POST"])(self.echo)
        return app


def instances(name: str, num_workers: int, **settings: Any) -> dict[str, gym_config.Instance]:
    """A config whose only instance is an EchoServer (implemented in the counter's directory's place).

    Balanced placement is off (the default) unless a test asks for it: these tests choose the worker a
    session lives on.
    """
    instance = gym_config.Instance(
        name,
        "resources_servers",
        "example_session_state_mgmt",
        {"host": "127.0.0.1", "port": 0, "num_workers": num_workers, "entrypoint": "app.py", **settings},
    )
    return {name: instance}


class Worker:
    """One worker: an EchoServer app on a loopback port (lifespan on, so its private socket runs)."""

    def __init__(
        self, name: str, num_workers: int, socket_dir: str | None, server_class: type[EchoServer] = EchoServer, **settings: Any
    ) -> None:
        self.server = server_class.for_instance(name, instances(name, num_workers, **settings))
        self.app = self.server.build_app(socket_dir)
        self.port = gym_config.free_port()
        self.serving = contextlib.AsyncExitStack()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> "Worker":
        await self.serving.enter_async_context(serving(self.app, self.port))
        return self

    async def stop(self) -> None:
        await self.serving.aclose()


@contextlib.asynccontextmanager
async def two_workers(server_class: type[EchoServer] = EchoServer, **settings: Any) -> AsyncIterator[tuple["Worker", "Worker", "Caller"]]:
    """Workers A and B of one server (same name, so the same secret) sharing a real socket directory,
    and a caller; everything is stopped, and the directory removed, at the end."""
    socket_dir = tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp")
    name = f"echo_{uuid.uuid4().hex[:8]}"
    a = await Worker(name, 2, socket_dir, server_class, **settings).start()
    b = await Worker(name, 2, socket_dir, server_class, **settings).start()
    caller = Caller()
    try:
        yield a, b, caller
    finally:
        await caller.close()
        await asyncio.gather(a.stop(), b.stop())  # at once: each waits out uvicorn's shutdown ticks
        os.rmdir(socket_dir)


class Caller:
    """A caller with no cookie jar: it sends exactly the cookies a test gives it."""

    def __init__(self) -> None:
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=30))

    async def post(self, worker: Worker, path: str, cookies: dict[str, str] | None = None, **kwargs: Any):
        """``headers`` may be a list of pairs, to send a header more than once."""
        headers = kwargs.pop("headers", {})
        headers = list(headers.items()) if isinstance(headers, dict) else list(headers)
        if cookies:
            headers.append(("Cookie", cookie_header(cookies)))
        return await self.http.post(worker.url + path, headers=headers, **kwargs)

    async def close(self) -> None:
        await self.http.close()


def set_cookies(response: aiohttp.ClientResponse) -> list[str]:
    return response.headers.getall("Set-Cookie", [])


async def new_session(caller: Caller, worker: Worker) -> dict[str, str]:
    """A session started on ``worker``: its cookies."""
    response = await caller.post(worker, "/increment")
    assert response.status == 200
    return {key: morsel.value for key, morsel in response.cookies.items()}


@contextlib.contextmanager
def unreachable(forwarding: Worker, owner: Worker) -> Iterator[None]:
    """The owner's socket takes none of ``forwarding``'s new connections (as when its backlog is full)."""
    transport = forwarding.server.transport
    opened = transport.open_connection

    async def nobody_there(address: str) -> OwnerConnection:
        return await opened("test-nobody-listens-here" if address == owner.server.worker_id else address)

    transport.open_connection = nobody_there
    try:
        yield
    finally:
        del transport.open_connection
