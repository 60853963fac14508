"""A tool call run in-process as ``POST /<tool>`` through the app's own router, with the token's session.

The sub-request gets the ``/mcp`` request's exception handlers, so a malformed body is a 422 and an
``HTTPException`` its own status, as over HTTP; the handler runs exactly once.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.types import Message, Scope, Send

logger = logging.getLogger(__name__)

# Headers of the /mcp request that do not describe the tool call's own body.
_NOT_FORWARDED = {b"content-type", b"content-length", b"transfer-encoding", b"cookie", b"accept"}


async def dispatch(app: FastAPI, path: str, arguments: dict[str, Any], session: dict[str, Any], request: Request) -> tuple[int, bytes]:
    """Run ``POST <path>`` with ``arguments`` as its JSON body and ``session`` as its session; its status and body."""
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
            "path": root_path + path,
            "raw_path": (root_path + path).encode(),
            "query_string": b"",
            "headers": headers,
            "state": dict(outer.get("state", {})),
            "app": app,
            "session": dict(session),
            "fastapi_middleware_astack": stack,
        }
        if "starlette.exception_handlers" in outer:
            scope["starlette.exception_handlers"] = outer["starlette.exception_handlers"]
        try:
            await app.router(scope, receive, send)
        except Exception as error:
            if started:
                raise
            await _unhandled(app, scope, error, send)
        finally:
            finished.set()
    return status, b"".join(chunks)


async def _unhandled(app: FastAPI, scope: Scope, error: Exception, send: Send) -> None:
    """What the app answers over HTTP for an exception no handler caught: its own 500 handler."""
    logger.error("MCP tool call POST %s raised", scope["path"], exc_info=error)
    handler = app.exception_handlers.get(Exception) or app.exception_handlers.get(500)
    if handler is None:
        response = JSONResponse({"detail": "Internal Server Error"}, status_code=500)
    else:
        response = handler(Request(scope), error)
        if inspect.isawaitable(response):
            response = await response
    await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}
