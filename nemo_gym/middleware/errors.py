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

    It sits inside the session layer, so a client that replaces its cookies with each reply's keeps
    its session through an error. An error after the reply has started, and before it is complete, can
    only close the connection. An error after the reply is complete (a background task raising) is
    logged, and the connection is kept: the server would otherwise close it under a request that the
    client (or the forwarding worker) has already sent on it, which no server then answers.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = finished = False

        async def send_and_note(message: Message) -> None:
            nonlocal started, finished
            started = started or message["type"] == "http.response.start"
            await send(message)
            finished = finished or (message["type"] == "http.response.body" and not message.get("more_body", False))

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as error:
            if finished:
                logger.exception("unhandled error in %s %s after its reply was sent", scope["method"], scope["path"])
                return
            if started:
                raise
            logger.exception("unhandled error in %s %s", scope["method"], scope["path"])
            await server_error(error)(scope, receive, send)
