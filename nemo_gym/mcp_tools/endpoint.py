"""The ``/mcp`` endpoint of one server: the official SDK's low-level server over stateless streamable HTTP.

Replies are JSON. ``tools/list`` lists the tool routes; a ``tools/call`` is refused without a valid
session token, else dispatched in-process as ``POST /<name>`` carrying the session the token names
(``nemo_gym.mcp_tools.dispatch``), so a handler reading ``request.session["session_id"]`` sees the
session's id.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import mcp.types as types
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from itsdangerous import URLSafeSerializer
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.requests import HTTPConnection, Request
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from nemo_gym.mcp_tools import MCP_PATH
from nemo_gym.mcp_tools.dispatch import dispatch
from nemo_gym.mcp_tools.tools import McpToolRouteError, ToolRoute, tool_route
from nemo_gym.sessions.token import TOKEN_HEADER, read_token

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def security_settings(host: str) -> TransportSecuritySettings:
    """The SDK's own default: DNS-rebinding checks on a loopback server, none where sandboxes reach it by name."""
    if host not in LOOPBACK_HOSTS:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


class McpToolEndpoint:
    """The ``/mcp`` endpoint of one server. Tools are set at start-up (``serve``), inside ``run()``."""

    def __init__(self, server_name: str, serializer: URLSafeSerializer, session_cookie: str, host: str) -> None:
        self.server_name = server_name
        self.serializer = serializer
        self.session_cookie = session_cookie
        self.security = security_settings(host)
        self.mcp = Server(server_name, on_list_tools=self.list_tools, on_call_tool=self.call_tool)
        self.tools: dict[str, ToolRoute] = {}
        self.app: FastAPI | None = None
        self.manager: StreamableHTTPSessionManager | None = None

    def mount(self, app: FastAPI) -> None:
        app.add_route(MCP_PATH, self, include_in_schema=False)
        app.add_route(MCP_PATH + "/{path:path}", self, include_in_schema=False)

    def serve(self, app: FastAPI, routes: list[BaseRoute]) -> None:
        """Check and take the tool routes; a route that cannot be served faithfully raises, naming it."""
        tools: dict[str, ToolRoute] = {}
        for route in routes:
            tool = tool_route(route, self.server_name)
            if tool.name in tools:
                raise McpToolRouteError(f"{self.server_name}: two routes are both the MCP tool {tool.name!r}")
            tools[tool.name] = tool
        self.app, self.tools = app, tools

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The SDK's session manager, for the lifetime of the app (a fresh one per run: it runs once)."""
        manager = StreamableHTTPSessionManager(
            app=self.mcp, json_response=True, stateless=True, security_settings=self.security
        )
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._drop_new_cookie_session(scope)
        if self.manager is None:
            response = JSONResponse({"detail": f"{self.server_name}: the MCP endpoint is not running"}, status_code=503)
            await response(scope, receive, send)
            return
        if scope["method"] not in ("POST", "DELETE"):
            # Stateless: every reply rides its own POST, so there is no standalone stream to GET.
            detail = f"{self.server_name}: the MCP endpoint is stateless; send JSON-RPC requests with POST"
            await JSONResponse({"detail": detail}, status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)

    def _drop_new_cookie_session(self, scope: Scope) -> None:
        """A /mcp request without a session cookie gets no cookie back: its session is the token's."""
        session = scope.get("session")
        if session is not None and self.session_cookie not in HTTPConnection(scope).cookies:
            session.clear()

    async def list_tools(self, ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        tools = [types.Tool(name=tool.name, description=tool.description, input_schema=tool.input_schema) for tool in self.tools.values()]
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = self.tools.get(params.name)
        if tool is None:
            available = ", ".join(self.tools) or "none"
            return error_result(f"Unknown tool {params.name!r} on {self.server_name}. Available tools: {available}.")
        request: Request | None = ctx.request
        token = request.headers.get(TOKEN_HEADER) if request is not None else None
        if not token:
            raise MCPError(
                types.INVALID_REQUEST,
                f"Refused: tools/call on {self.server_name} needs the {TOKEN_HEADER} header, the session token "
                "in the mcp.headers of a /seed_session reply.",
            )
        session = read_token(self.serializer, token)
        if session is None:
            raise MCPError(
                types.INVALID_REQUEST,
                f"Refused: the {TOKEN_HEADER} header is not a session token signed by {self.server_name} "
                "(bad signature or no session in it). Use the token from a /seed_session reply of this server.",
            )
        assert self.app is not None
        status, body = await dispatch(self.app, tool.path, params.arguments or {}, session, request)
        text = body.decode("utf-8", errors="replace")
        if not 200 <= status < 300:
            return error_result(f"POST {tool.path} answered HTTP {status}: {text}")
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=reply if isinstance(reply, dict) else None,
        )


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
