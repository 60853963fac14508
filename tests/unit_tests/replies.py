"""What an ASGI app sends in reply to a bare request, read back in process."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message


async def answered(app: ASGIApp) -> tuple[int, dict[str, str], dict]:
    """The reply's status, headers (names lowercase) and JSON body."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    await app({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, send)
    headers = {name.decode().lower(): value.decode() for name, value in sent[0]["headers"]}
    return sent[0]["status"], headers, json.loads(b"".join(message.get("body", b"") for message in sent[1:]))
