"""Cancel a handler whose caller has gone, so a cancelled forward stops the owner's work too."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A handler still running this long after its body was read gets a watcher. Most replies come sooner,
# and a watcher (a task of its own) cost about a tenth of a small request's CPU when every request had one.
WATCH_AFTER_SECONDS = 0.05


class CancelOnDisconnect:
    """Cancels the request's handler when ``http.disconnect`` arrives before its reply is complete.

    The handler reads its body as usual, and is cancelled if the caller leaves before it is whole. Once
    the body is read (at once, for a request without one) and the handler is still at work
    ``WATCH_AFTER_SECONDS`` later, a watcher takes over the connection's messages; a later ``receive()``
    by the handler waits for the watcher's word that the caller left. A handler that leaves a body
    unread is not watched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handler = asyncio.current_task()
        caller_left = asyncio.Event()
        replied = cancelled = body_read = False
        timer: asyncio.TimerHandle | None = None
        watcher: asyncio.Task | None = None

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            caller_left.set()
            if not replied:
                cancel()

        def cancel() -> None:
            nonlocal cancelled
            cancelled = True
            handler.cancel()

        def start_watching() -> None:
            nonlocal timer
            timer = asyncio.get_running_loop().call_later(WATCH_AFTER_SECONDS, begin_watching)

        def begin_watching() -> None:
            nonlocal watcher
            watcher = asyncio.ensure_future(watch())

        async def receive_body() -> Message:
            nonlocal body_read
            if body_read:
                await caller_left.wait()
                return {"type": "http.disconnect"}
            body_read = True
            if timer is not None:  # no body: the watcher reads the connection from the start
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.disconnect":
                # Cancelled here, before the app turns the disconnect into an error whose reference cycle
                # would keep the body read so far in memory until a garbage collection.
                cancel()
                await asyncio.sleep(0)
            elif message.get("more_body", False):
                body_read = False
            else:
                start_watching()
            return message

        async def send_and_note(message: Message) -> None:
            nonlocal replied
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                replied = True
            await send(message)

        if not has_body(scope):
            start_watching()
        try:
            await self.app(scope, receive_body, send_and_note)
        except asyncio.CancelledError:
            if not cancelled:
                raise
            handler.uncancel()
        finally:
            if timer is not None:
                timer.cancel()
            if watcher is not None:
                watcher.cancel()


def has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False
