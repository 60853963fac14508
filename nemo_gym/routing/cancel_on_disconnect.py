"""Cancel a handler whose caller has gone, so a cancelled forward stops the owner's work too."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CancelOnDisconnect:
    """Reads the connection's messages on the handler's behalf and cancels it on ``http.disconnect``.

    The handler still sees every message (the body, then the disconnect) in order, one at a time.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        messages: asyncio.Queue[Message] = asyncio.Queue(maxsize=1)
        replied = False

        async def send_and_note(message: Message) -> None:
            nonlocal replied
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                replied = True
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, messages.get, send_and_note))

        async def pump() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect" and not replied:
                    handler.cancel()
                await messages.put(message)
                if message["type"] == "http.disconnect":
                    return

        pumping = asyncio.ensure_future(pump())
        try:
            await handler
        except asyncio.CancelledError:
            if not handler.cancelled():
                raise
        finally:
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping
