"""Refuse a request body over the server's limit with 413 before it is buffered, forwarded or not."""

from __future__ import annotations

import traceback

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised to the app from ``receive()`` once the body streamed so far is over the limit."""


class BodyLimit:
    """Answers 413 to a body over ``max_body_bytes``, and closes the connection without reading the rest.

    A declared ``Content-Length`` over the limit is refused before the app runs. A body without one
    (chunked) is counted as the app reads it; the read that crosses the limit raises BodyTooLarge, and
    whatever the app then answers is replaced by the 413.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if declared_length(scope) > self.max_body_bytes:
            await self.refuse(scope, receive, send)
            return
        received = 0
        over: BodyTooLarge | None = None
        started = False

        async def counting_receive() -> Message:
            nonlocal received, over
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                over = BodyTooLarge(f"the request body is over {self.max_body_bytes} bytes")
                raise over
            return message

        async def send_unless_over(message: Message) -> None:
            nonlocal started
            if over:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, send_unless_over)
        except Exception:
            if not over:
                raise
        if over:
            # The frames the error passed through hold the body read so far, in reference cycles that
            # only a garbage collection would free; clearing them frees it now.
            traceback.clear_frames(over.__traceback__)
            if started:
                # Too late for a 413: an error makes the server drop the connection mid-reply.
                raise BodyTooLarge(f"the request body went over {self.max_body_bytes} bytes after the reply started")
            await self.refuse(scope, receive, send)

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"The request body is larger than this server's limit of {self.max_body_bytes} bytes (max_body_bytes)."
        await JSONResponse(status_code=413, content={"detail": detail}, headers={"Connection": "close"})(scope, receive, send)


def declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0
