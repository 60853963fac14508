"""Unhandled errors become a JSON 500 inside the session layer, so the reply still sets the cookie."""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)


def server_error(error: BaseException) -> JSONResponse:
    return JSONResponse(status_code=500, content={"detail": repr(error)})


class ServerErrorsAsJson:
    """Answers a handler's unhandled exception with a 500 whose JSON ``detail`` is the error's repr.

    It sits inside SessionMiddleware, so a client that replaces its cookies with each reply's keeps
    its session through an error. An error after the reply has started can only close the connection.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as error:
            if started:
                raise
            logger.exception("unhandled error in %s %s", scope["method"], scope["path"])
            await server_error(error)(scope, receive, send)
