"""Servers and clients shared by the MCP tests: a real server served by uvicorn in the test's event loop, the official client.

Every test serves a real server with uvicorn on a free loopback port in the test's own event loop and
talks to it with the SDK's ``ClientSession`` over ``streamable_http_client`` (and plain HTTP for
``/seed_session`` and ``/verify``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import BaseModel

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import SimpleResourcesServer
from nemo_gym.client.reading import ReadingClient
from nemo_gym.openai_utils import new_response
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.unit_tests import in_process_server

NAME = "counter"
VERIFY_BODY = {"responses_create_params": {"input": "count"}, "response": new_response().model_dump(mode="json")}


class EchoRequest(BaseModel):
    """What the echo tool is asked to say back."""

    text: str


class SessionEchoServer(CounterServer):
    """The counter plus tools that report which session they ran in, how often, and one that fails."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/echo")(self.echo)
        app.post("/boom")(self.boom)
        return app

    async def echo(self, request: Request, body: EchoRequest) -> dict[str, str]:
        """Say the text back, with the session it was said in."""
        self.calls.append(request.session[SESSION_ID_KEY])
        return {"text": body.text, "session_id": request.session[SESSION_ID_KEY]}

    async def boom(self, request: Request, body: EchoRequest) -> dict[str, str]:
        raise RuntimeError(f"boom: {body.text}")


def make_server(server_class: type[SimpleResourcesServer] = CounterServer, **settings: Any) -> SimpleResourcesServer:
    settings = {"port": gym_config.free_port(), "expose_tools_over_mcp": True, **settings}
    instances = gym_config.parse({NAME: {"resources_servers": {"example_session_state_mgmt": settings}}})
    return server_class.for_instance(NAME, instances)


def serving(server: SimpleResourcesServer, socket_dir: str | None = None) -> contextlib.AbstractAsyncContextManager[str]:
    """Serve the server's app with uvicorn (lifespan on) on its configured port; yields its base URL."""
    return in_process_server.serving(server.build_app(socket_dir), server.config.port)


@contextlib.asynccontextmanager
async def mcp_session(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """The official client: a streamable HTTP client session on ``<url>/mcp``, sending ``headers``."""
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_client(server: SimpleResourcesServer) -> AsyncIterator[ReadingClient]:
    client = ReadingClient(server.instances)
    try:
        yield client
    finally:
        await client.close()


async def seed(client: ReadingClient, initial_count: int = 0) -> tuple[dict[str, str], dict[str, Any]]:
    """Seed a session over HTTP; returns its cookies and the reply's ``mcp`` metadata."""
    reply = await client.post(NAME, "/seed_session", json={"initial_count": initial_count})
    assert reply.status == 200, reply.text
    return reply.cookies, reply.body["mcp"]


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content)

