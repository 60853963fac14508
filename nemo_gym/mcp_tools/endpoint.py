"""A resources server's own ``POST /<tool>`` routes, served as MCP tools at ``/mcp``.

CLI harnesses in sandboxes keep only the session token minted at ``/seed_session`` and send it in the
``X-NeMo-Gym-Session-Token`` header. This module is everything between that header and the handler:

- which routes are tools (``default_tool_routes``) and the start-up check that each one can be
  dispatched faithfully (``tool_route``): a ``POST /<name>`` whose only input is one pydantic body;
- the ``/mcp`` endpoint (``McpToolEndpoint``): the official SDK's low-level server over stateless
  streamable HTTP with JSON replies. A tool call is refused without a valid token; otherwise it is
  dispatched in-process through the app's own router as ``POST /<name>`` carrying the session the
  token names, so body validation and the handler run once, exactly as over HTTP, and a handler
  reading ``request.session["session_id"]`` sees the session's id;
- the ``mcp`` metadata added to every successful ``/seed_session`` reply (``SeedSessionMcpMetadata``).

Routing the token to the worker that owns the session is the router's job (``nemo_gym.routing``),
which runs before any of this.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp.types as types
from itsdangerous import URLSafeSerializer
from fastapi import FastAPI, params
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.tool_name_validation import validate_tool_name
from pydantic import BaseModel
from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection, Request
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.session_token import TOKEN_HEADER, read_token

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
# The key of the MCP metadata in a /seed_session reply (upstream's NEMO_GYM_MCP_METADATA_KEY).
MCP_METADATA_KEY = "mcp"
SEED_SESSION_PATH = "/seed_session"
NEVER_TOOLS = frozenset({"seed_session", "verify", "aggregate_metrics", "reverify_mode", "mcp"})
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Headers of the /mcp request that do not describe the tool call's own body.
_NOT_FORWARDED = {b"content-type", b"content-length", b"transfer-encoding", b"cookie", b"accept"}


class McpToolRouteError(RuntimeError):
    """A route chosen as an MCP tool that a tool call cannot reach exactly as an HTTP call would."""


@dataclass(frozen=True)
class ToolRoute:
    """One route served as an MCP tool: the tool's name is the route's path without its slash."""

    name: str
    path: str
    description: str
    input_schema: dict[str, Any]

    def as_tool(self) -> types.Tool:
        return types.Tool(name=self.name, description=self.description, input_schema=self.input_schema)


def default_tool_routes(app: FastAPI) -> list[BaseRoute]:
    """Every HTTP route the server registered, except ``/``, FastAPI's docs, and the never-tools."""
    docs = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    chosen = []
    for route in app.routes:
        if not isinstance(route, Route) or route.path == "/" or route.path in docs:
            continue
        if route.path.strip("/").split("/")[0] in NEVER_TOOLS:
            continue
        chosen.append(route)
    return chosen


def tool_route(route: BaseRoute, server_name: str) -> ToolRoute:
    """Check that a route can be dispatched faithfully as a tool, and describe it; else say why not."""
    path = getattr(route, "path", repr(route))
    methods = sorted(getattr(route, "methods", None) or [])
    where = f"{', '.join(methods) or 'route'} {path}"

    def refuse(why: str) -> McpToolRouteError:
        return McpToolRouteError(
            f"{server_name}: {where} cannot be served as an MCP tool: {why}. "
            "Leave it out by overriding SimpleResourcesServer.mcp_tool_routes, or change the route."
        )

    if not isinstance(route, APIRoute):
        raise refuse("it is not a FastAPI route, so it has no request model to take the tool's arguments")
    name = path[1:]
    if name in NEVER_TOOLS:
        raise refuse(f"{', '.join(sorted(NEVER_TOOLS))} are never tools")
    if route.param_convertors:
        raise refuse(f"it has path parameters ({', '.join(route.param_convertors)}), which a tool call has no place for")
    if "/" in name or not validate_tool_name(name).is_valid:
        raise refuse("its path must be one segment, '/<tool name>', of letters, digits, '_', '-' or '.'")
    if methods != ["POST"]:
        raise refuse(f"it answers {', '.join(methods)}, and a tool call is dispatched as one POST")
    dependants = _all_dependants(route.dependant)
    for kind in ("query", "header", "cookie"):
        names = [field.alias for dependant in dependants for field in getattr(dependant, f"{kind}_params")]
        if names:
            raise refuse(f"it takes {kind} parameters ({', '.join(names)}), which a tool's arguments cannot carry")
    bodies = {field.name: field for dependant in dependants for field in dependant.body_params}
    if not bodies:
        schema: dict[str, Any] = {"type": "object", "properties": {}}
    else:
        (field, *others) = bodies.values()
        model = field.field_info.annotation
        if others:
            raise refuse(f"its body is split over several parameters ({', '.join(bodies)}), not one pydantic model")
        if isinstance(field.field_info, params.Form):
            raise refuse("its body is a form, not a JSON pydantic model")
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise refuse(f"its body parameter {field.name!r} is {model!r}, not a pydantic model")
        if getattr(field.field_info, "embed", False):
            raise refuse(f"its body is embedded under {field.alias!r}, so the arguments would not be the model")
        schema = model.model_json_schema()
        if schema.get("type") != "object":
            raise refuse(f"its request model {model.__name__} is not a JSON object, and tool arguments are one")
    description = route.description or route.summary or f"POST {path} on {server_name}."
    return ToolRoute(name=name, path=path, description=description, input_schema=schema)


def _all_dependants(dependant: Dependant) -> list[Dependant]:
    found = [dependant]
    for sub in dependant.dependencies:
        found.extend(_all_dependants(sub))
    return found


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
        return types.ListToolsResult(tools=[tool.as_tool() for tool in self.tools.values()])

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
        status, body = await self.dispatch(tool, params.arguments or {}, session, request)
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

    async def dispatch(self, tool: ToolRoute, arguments: dict[str, Any], session: dict[str, Any], request: Request) -> tuple[int, bytes]:
        """Run ``POST <tool.path>`` through the app's router in-process, with ``session`` as the request's session.

        The sub-request gets the /mcp request's exception handlers, so a malformed body is a 422 and an
        ``HTTPException`` its own status, as over HTTP. Runs the handler exactly once.
        """
        assert self.app is not None
        body = json.dumps(arguments).encode()
        outer = request.scope
        headers = [(name, value) for name, value in outer["headers"] if name not in _NOT_FORWARDED]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"accept", b"application/json")]
        root_path = outer.get("root_path", "")
        status = 500
        chunks: list[bytes] = []
        started = False
        finished = anyio.Event()
        body_sent = False

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    finished.set()

        async with contextlib.AsyncExitStack() as stack:
            scope: Scope = {
                "type": "http",
                "asgi": outer.get("asgi", {"version": "3.0"}),
                "http_version": outer.get("http_version", "1.1"),
                "method": "POST",
                "scheme": outer.get("scheme", "http"),
                "server": outer.get("server"),
                "client": outer.get("client"),
                "root_path": root_path,
                "path": root_path + tool.path,
                "raw_path": (root_path + tool.path).encode(),
                "query_string": b"",
                "headers": headers,
                "state": dict(outer.get("state", {})),
                "app": self.app,
                "session": dict(session),
                "fastapi_middleware_astack": stack,
            }
            if "starlette.exception_handlers" in outer:
                scope["starlette.exception_handlers"] = outer["starlette.exception_handlers"]
            try:
                await self.app.router(scope, receive, send)
            except Exception as error:
                if started:
                    raise
                await self._unhandled(scope, error, send)
            finally:
                finished.set()
        return status, b"".join(chunks)

    async def _unhandled(self, scope: Scope, error: Exception, send: Send) -> None:
        """What the app answers over HTTP for an exception no handler caught: its own 500 handler."""
        assert self.app is not None
        logger.error("MCP tool call POST %s raised", scope["path"], exc_info=error)
        handler = self.app.exception_handlers.get(Exception) or self.app.exception_handlers.get(500)
        if handler is None:
            response = JSONResponse({"detail": "Internal Server Error"}, status_code=500)
        else:
            response = handler(Request(scope), error)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def mcp_metadata(server_name: str, token: str) -> dict[str, Any]:
    """The ``mcp`` block of a ``/seed_session`` reply: where the tools are and the header that names the session."""
    return {"server_name": server_name, "url_path": MCP_PATH, "transport": "http", "headers": {TOKEN_HEADER: token}}


class SeedSessionMcpMetadata:
    """ASGI middleware, inside SessionMiddleware: adds ``"mcp"`` to every successful ``/seed_session`` reply.

    It rewrites the reply the route produced, whatever response model the server's ``seed_session``
    returns, and mints the token for the session the reply belongs to. A successful reply that is not a
    JSON object cannot carry the metadata, so it becomes a 500 saying so.
    """

    def __init__(self, app: ASGIApp, server_name: str, mint: Callable[[str], str]) -> None:
        self.app = app
        self.server_name = server_name
        self.mint = mint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or _route_path(scope) != SEED_SESSION_PATH:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def buffered(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._send(scope, start, b"".join(chunks), send)
            else:
                await send(message)

        await self.app(scope, receive, buffered)

    async def _send(self, scope: Scope, start: Message, body: bytes, send: Send) -> None:
        headers = MutableHeaders(raw=list(start.get("headers", [])))
        if 200 <= start["status"] < 300:
            try:
                reply = json.loads(body) if headers.get("content-type", "").startswith("application/json") else None
            except ValueError:
                reply = None
            if isinstance(reply, dict):
                reply[MCP_METADATA_KEY] = mcp_metadata(self.server_name, self.mint(scope["session"][SESSION_ID_KEY]))
            else:
                start = {**start, "status": 500}
                reply = {"detail": f"{self.server_name}: /seed_session replied without a JSON object, so it cannot carry the mcp metadata"}
            body = json.dumps(reply, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
            headers["content-type"] = "application/json"
            headers["content-length"] = str(len(body))
        await send({**start, "headers": headers.raw})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _route_path(scope: Scope) -> str:
    path, root_path = scope["path"], scope.get("root_path", "")
    return path[len(root_path):] if root_path and path.startswith(root_path) else path
