"""nemo_gym.middleware.errors: a handler's unhandled error before its reply is a JSON 500 (so the session layer
outside still sets the cookie); one after the reply started closes the connection; one after it is complete is
only logged."""

from __future__ import annotations

import json
import logging

import pytest
from starlette.types import Message

from nemo_gym.middleware.errors import ServerErrorsAsJson

pytestmark = pytest.mark.anyio

SCOPE = {"type": "http", "method": "POST", "path": "/verify", "headers": []}


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def served(app, scope=SCOPE) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await ServerErrorsAsJson(app)(scope, receive, send)
    return sent


def failing(messages_before: list[Message]):
    async def app(scope, receive, send):
        for message in messages_before:
            await send(message)
        raise KeyError("count")

    return app


START = {"type": "http.response.start", "status": 200, "headers": []}


async def test_an_error_before_the_reply_is_a_json_500_whose_detail_is_the_errors_repr(caplog):
    sent = await served(failing([]))
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"]) == {"detail": "KeyError('count')"}
    assert "unhandled error in POST /verify" in caplog.text


async def test_an_error_after_the_reply_started_is_raised_to_close_the_connection():
    with pytest.raises(KeyError):
        await served(failing([START, {"type": "http.response.body", "body": b"par", "more_body": True}]))


async def test_an_error_after_the_reply_is_complete_is_logged_and_the_reply_stands(caplog):
    with caplog.at_level(logging.ERROR):
        sent = await served(failing([START, {"type": "http.response.body", "body": b"done"}]))
    assert [message.get("status", message.get("body")) for message in sent] == [200, b"done"]
    assert "after its reply was sent" in caplog.text


async def test_a_reply_without_error_passes_untouched_and_other_scopes_pass_through():
    async def app(scope, receive, send):
        await send({**START, "status": 201})
        await send({"type": "http.response.body", "body": scope["type"].encode()})

    assert [message.get("status", message.get("body")) for message in await served(app)] == [201, b"http"]
    assert (await served(app, {"type": "websocket", "path": "/"}))[1]["body"] == b"websocket"

    with pytest.raises(KeyError):
        await served(failing([]), {"type": "lifespan"})
