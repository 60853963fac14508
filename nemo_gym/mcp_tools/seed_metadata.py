"""The ``mcp`` block added to every successful ``/seed_session`` reply: where the tools are, and the token."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nemo_gym import SESSION_ID_KEY
from nemo_gym.mcp_tools import MCP_METADATA_KEY, MCP_PATH
from nemo_gym.sessions.token import TOKEN_HEADER

SEED_SESSION_PATH = "/seed_session"


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
