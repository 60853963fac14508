"""A resources server's tools over MCP: each promise of nemo_gym.mcp_tools, through the official mcp client.

Every test serves a real server with uvicorn on a free loopback port in the test's own event loop and
talks to it with the SDK's ``ClientSession`` over ``streamable_http_client`` (and plain HTTP for
``/seed_session`` and ``/verify``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import SimpleResourcesServer
from nemo_gym.client import ServerClient
from nemo_gym.mcp_tools import McpToolRouteError
from nemo_gym.openai_utils import new_response
from nemo_gym.routing.transport.unix import make_socket_dir, remove_socket_dir
from nemo_gym.routing.worker import OWNER_KEY, is_worker_id
from nemo_gym.session_token import TOKEN_HEADER, read_token, token_serializer
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
async def http_client(server: SimpleResourcesServer) -> AsyncIterator[ServerClient]:
    client = ServerClient(server.instances)
    try:
        yield client
    finally:
        await client.close()


async def seed(client: ServerClient, initial_count: int = 0) -> tuple[dict[str, str], dict[str, Any]]:
    """Seed a session over HTTP; returns its cookies and the reply's ``mcp`` metadata."""
    reply = await client.post(NAME, "/seed_session", json={"initial_count": initial_count})
    assert reply.status == 200, reply.text
    return reply.cookies, reply.body["mcp"]


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content)


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


@pytest.mark.anyio
async def test_seed_session_replies_carry_the_mcp_metadata_without_the_handler_changing():
    server = make_server()
    async with serving(server), http_client(server) as client:
        reply = await client.post(NAME, "/seed_session", json={"initial_count": 5})

    assert reply.status == 200
    mcp = reply.body["mcp"]
    assert set(mcp) == {"server_name", "url_path", "transport", "headers"}
    assert (mcp["server_name"], mcp["url_path"], mcp["transport"]) == (NAME, "/mcp", "http")
    assert set(mcp["headers"]) == {TOKEN_HEADER}
    assert read_token(token_serializer(server.secret), mcp["headers"][TOKEN_HEADER]) is not None


@pytest.mark.anyio
async def test_the_seed_token_lets_tools_act_on_that_sessions_state_and_verify_over_http_sees_it():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        cookies, mcp = await seed(client, initial_count=10)
        other_cookies, other_mcp = await seed(client, initial_count=100)
        async with mcp_session(url, mcp["headers"]) as session:
            first = await session.call_tool("increment_counter", {"count": 1})
            await session.call_tool("increment_counter", {"count": 2})
            count = await session.call_tool("get_counter_value", {})
        verified = await client.post(NAME, "/verify", json={**VERIFY_BODY, "expected_count": 13}, cookies=cookies)
        untouched = await client.post(NAME, "/verify", json={**VERIFY_BODY, "expected_count": 100}, cookies=other_cookies)

    assert not first.is_error and first.structured_content == {"success": True}
    assert count.structured_content == {"count": 13}
    assert text_of(count) == '{"count":13}'
    assert (verified.body["count"], verified.body["reward"]) == (13, 1.0)
    assert (untouched.body["count"], untouched.body["reward"]) == (100, 1.0)


@pytest.mark.anyio
async def test_the_token_works_the_same_on_the_stateless_2026_protocol():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client, initial_count=7)
        for headers in (mcp["headers"], {}):
            async with (
                create_mcp_http_client(headers=headers) as http,
                streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.discover()
                assert session.protocol_version == "2026-07-28"
                if headers:
                    await session.call_tool("increment_counter", {"count": 1})
                    count = await session.call_tool("get_counter_value", {})
                else:
                    with pytest.raises(MCPError, match=TOKEN_HEADER):
                        await session.call_tool("get_counter_value", {})

    assert count.structured_content == {"count": 8}


@pytest.mark.anyio
async def test_a_tool_call_runs_the_handler_once_in_the_session_it_would_see_over_http():
    server = make_server(SessionEchoServer)
    async with serving(server) as url, http_client(server) as client:
        cookies, mcp = await seed(client)
        over_http = await client.post(NAME, "/echo", json={"text": "http"}, cookies=cookies)
        async with mcp_session(url, mcp["headers"]) as session:
            over_mcp = await session.call_tool("echo", {"text": "mcp"})

    session_id = over_http.body["session_id"]
    assert over_mcp.structured_content == {"text": "mcp", "session_id": session_id}
    assert server.calls == [session_id, session_id]


@pytest.mark.anyio
async def test_a_tool_call_without_a_token_is_refused_with_a_clear_error():
    server = make_server()
    async with serving(server) as url, mcp_session(url) as session:
        with pytest.raises(MCPError) as refused:
            await session.call_tool("increment_counter", {"count": 1})

    assert TOKEN_HEADER in refused.value.message
    assert "/seed_session" in refused.value.message


@pytest.mark.anyio
async def test_a_badly_signed_token_is_refused_with_a_clear_error():
    server = make_server()
    forged = token_serializer("not this server's secret").dumps({SESSION_ID_KEY: "someone-elses-session"})
    async with serving(server) as url:
        for token in (forged, "garbage"):
            async with mcp_session(url, {TOKEN_HEADER: token}) as session:
                with pytest.raises(MCPError) as refused:
                    await session.call_tool("get_counter_value", {})
            assert "bad signature" in refused.value.message
            assert TOKEN_HEADER in refused.value.message


@pytest.mark.anyio
async def test_an_unknown_tool_gets_an_error_result_listing_the_available_tools():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client)
        async with mcp_session(url, mcp["headers"]) as session:
            result = await session.call_tool("verify", {})

    assert result.is_error
    assert "Unknown tool 'verify'" in text_of(result)
    assert "Available tools: increment_counter, get_counter_value" in text_of(result)


@pytest.mark.anyio
async def test_bad_arguments_get_the_routes_own_validation_error_and_a_failing_handler_its_500():
    server = make_server(SessionEchoServer)
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client)
        async with mcp_session(url, mcp["headers"]) as session:
            invalid = await session.call_tool("increment_counter", {"count": "three"})
            failed = await session.call_tool("boom", {"text": "bang"})

    assert invalid.is_error and "HTTP 422" in text_of(invalid) and '"loc":["body","count"]' in text_of(invalid)
    assert failed.is_error and "HTTP 500" in text_of(failed) and "boom: bang" in text_of(failed)


@pytest.mark.anyio
async def test_a_single_worker_server_mints_tokens_without_an_owner():
    server = make_server(SessionEchoServer)
    async with serving(server), http_client(server) as client:
        cookies, mcp = await seed(client)
        session_id = (await client.post(NAME, "/echo", json={"text": "who"}, cookies=cookies)).body["session_id"]

    assert server.worker_id is None
    assert read_token(token_serializer(server.secret), mcp["headers"][TOKEN_HEADER]) == {SESSION_ID_KEY: session_id}


@pytest.mark.anyio
async def test_a_multi_worker_server_puts_this_workers_id_in_the_token():
    socket_dir = make_socket_dir()
    try:
        instances = gym_config.parse(
            {NAME: {"resources_servers": {"example_session_state_mgmt": {"port": gym_config.free_port(), "num_workers": 2, "expose_tools_over_mcp": True}}}}
        )
        server = CounterServer.for_instance(NAME, instances)
        async with serving(server, socket_dir), http_client(server) as client:
            _, mcp = await seed(client)
    finally:
        remove_socket_dir(socket_dir)

    payload = read_token(token_serializer(server.secret), mcp["headers"][TOKEN_HEADER])
    assert is_worker_id(server.worker_id)
    assert payload[OWNER_KEY] == server.worker_id


@pytest.mark.anyio
async def test_mcp_replies_set_no_session_cookie():
    server = make_server()
    async with serving(server) as url, http_client(server) as client:
        _, mcp = await seed(client)
        async with create_mcp_http_client(headers=mcp["headers"]) as http:
            async with streamable_http_client(f"{url}/mcp", http_client=http) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("increment_counter", {"count": 1})
            assert not http.cookies


@pytest.mark.anyio
async def test_a_server_without_the_setting_has_no_mcp_endpoint_and_plain_seed_replies():
    server = make_server(expose_tools_over_mcp=False)
    async with serving(server), http_client(server) as client:
        reply = await client.post(NAME, "/seed_session", json={})
        mcp = await client.post(NAME, "/mcp", json={})

    assert reply.status == 200 and "mcp" not in reply.body
    assert mcp.status == 404


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


def test_upstreams_mcp_names_are_the_seed_session_key_and_the_token_header():
    from nemo_gym.base_resources_server import NEMO_GYM_MCP_METADATA_KEY, NEMO_GYM_MCP_SESSION_TOKEN_HEADER

    assert (NEMO_GYM_MCP_METADATA_KEY, NEMO_GYM_MCP_SESSION_TOKEN_HEADER) == ("mcp", TOKEN_HEADER)
