"""Which routes are MCP tools (nemo_gym.mcp_tools.tools): the default choice, a server's own, and the start-up check."""

from __future__ import annotations

import logging

import pytest
import uvicorn
from fastapi import FastAPI, Request

from nemo_gym.mcp_tools import McpToolRouteError
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.unit_tests.mcp_tools.mcp_servers import EchoRequest, SessionEchoServer, http_client, make_server, mcp_session, seed, serving, text_of

@pytest.mark.anyio
async def test_tools_list_shows_the_servers_tools_with_their_schemas_and_never_the_framework_routes():
    server = make_server(SessionEchoServer)
    async with serving(server) as url, mcp_session(url) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}

    assert set(tools) == {"increment_counter", "get_counter_value", "echo", "boom"}
    increment = tools["increment_counter"].input_schema
    assert increment["type"] == "object"
    assert increment["properties"]["count"]["type"] == "integer"
    assert increment["required"] == ["count"]
    assert tools["get_counter_value"].input_schema["properties"] == {}
    assert tools["echo"].description == "Say the text back, with the session it was said in."
    assert tools["echo"].input_schema["description"] == "What the echo tool is asked to say back."



class WithDebugRoute(CounterServer):
    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.get("/debug_dump")(self.debug_dump)
        return app

    async def debug_dump(self) -> dict[str, int]:
        return self.counters


class TailoredTools(WithDebugRoute):
    def mcp_tool_routes(self, app: FastAPI) -> list:
        return [route for route in super().mcp_tool_routes(app) if route.path == "/get_counter_value"]


@pytest.mark.anyio
async def test_a_server_tailors_its_tools_by_overriding_mcp_tool_routes():
    server = make_server(TailoredTools)
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client)
        async with mcp_session(url, mcp["headers"]) as session:
            tools = [tool.name for tool in (await session.list_tools()).tools]
            left_out = await session.call_tool("increment_counter", {"count": 1})

    assert tools == ["get_counter_value"]
    assert left_out.is_error and "Available tools: get_counter_value." in text_of(left_out)


def server_with_route(register) -> type[CounterServer]:
    class WithRoute(CounterServer):
        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()
            register(app)
            return app

    return WithRoute


async def takes_path_parameter(key: str) -> dict:
    return {}


async def takes_query_parameter(request: Request, limit: int) -> dict:
    return {}


async def takes_dict_body(request: Request, body: dict) -> dict:
    return {}


async def takes_two_bodies(first: EchoRequest, second: EchoRequest) -> dict:
    return {}


BAD_ROUTES = {
    "path parameters": (lambda app: app.post("/lookup/{key}")(takes_path_parameter), r"POST /lookup/\{key\}.*path parameters \(key\)"),
    "not a POST": (WithDebugRoute.setup_webserver, r"GET /debug_dump.*answers GET, and a tool call is dispatched as one POST"),
    "query parameters": (lambda app: app.post("/search")(takes_query_parameter), r"POST /search.*query parameters \(limit\)"),
    "body not a pydantic model": (lambda app: app.post("/raw")(takes_dict_body), r"POST /raw.*'body' is .*dict.*not a pydantic model"),
    "body in two parts": (lambda app: app.post("/pair")(takes_two_bodies), r"POST /pair.*several parameters"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("shape", BAD_ROUTES)
async def test_a_route_that_cannot_be_dispatched_faithfully_fails_start_up_naming_the_route_and_why(shape):
    register, message = BAD_ROUTES[shape]
    server_class = WithDebugRoute if shape == "not a POST" else server_with_route(register)
    app = make_server(server_class).setup_webserver()

    with pytest.raises(McpToolRouteError, match=message):
        async with app.router.lifespan_context(app):
            pass


@pytest.mark.anyio
async def test_uvicorn_refuses_to_start_a_server_with_a_route_that_cannot_be_a_tool(caplog):
    server = make_server(server_with_route(lambda app: app.post("/lookup/{key}")(takes_path_parameter)))
    config = uvicorn.Config(server.build_app(), host="127.0.0.1", port=server.config.port, lifespan="on", log_config=None)
    uv = uvicorn.Server(config)

    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(caplog.handler)
    try:
        with pytest.raises(SystemExit) as exited:
            await uv.serve()
    finally:
        uvicorn_log.removeHandler(caplog.handler)

    assert exited.value.code == 3  # uvicorn's start-up failure, which also stops a multi-worker parent
    assert not uv.started
    assert "POST /lookup/{key} cannot be served as an MCP tool" in caplog.text


