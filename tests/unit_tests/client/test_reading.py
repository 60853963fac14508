"""ReadingClient: no cookie jar; every call names its target and passes cookies explicitly."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse

from nemo_gym.client.reading import ReadingClient, cookie_header
from nemo_gym.config import Instance, free_port
from tests.unit_tests.in_process_server import serving

NAME = "cookie_echo"


def cookie_echo_app() -> FastAPI:
    """Sets a cookie on every reply and reports the cookies that arrived."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request, response: Response) -> dict:
        response.set_cookie("flavour", "oatmeal")
        return {"cookies": dict(request.cookies), "body": await request.json()}

    @app.get("/plain")
    async def plain() -> PlainTextResponse:
        return PlainTextResponse("just text", status_code=503)

    return app


@pytest.fixture
async def client():
    port = free_port()
    instances = {NAME: Instance(NAME, "resources_servers", "example_session_state_mgmt", {"host": "127.0.0.1", "port": port})}
    client = ReadingClient(instances)
    async with serving(cookie_echo_app(), port):
        try:
            yield client
        finally:
            await client.close()


@pytest.mark.anyio
async def test_cookies_set_by_one_reply_are_not_sent_on_the_next_call(client):
    first = await client.post(NAME, "/echo", json={"n": 1})
    assert first.cookies == {"flavour": "oatmeal"}
    second = await client.post(NAME, "/echo", json={"n": 2})
    assert second.body == {"cookies": {}, "body": {"n": 2}}


@pytest.mark.anyio
async def test_cookies_passed_explicitly_arrive(client):
    reply = await client.post(NAME, "/echo", json={}, cookies={"counter_session": "abc.def", "agent_session": "xyz"})
    assert reply.ok
    assert reply.body["cookies"] == {"counter_session": "abc.def", "agent_session": "xyz"}


@pytest.mark.anyio
async def test_one_pooled_session_serves_every_call(client):
    session = client.session()
    await client.post(NAME, "/echo", json={})
    await client.post(NAME, "/echo", json={})
    assert client.session() is session


@pytest.mark.anyio
async def test_a_reply_that_is_not_json_keeps_its_text_and_has_no_body(client):
    reply = await client.get(NAME, "/plain")
    assert (reply.status, reply.ok, reply.body, reply.text) == (503, False, None, "just text")


def test_unknown_instance_name_is_a_clear_error():
    with pytest.raises(KeyError, match="no server instance named 'nobody'"):
        ReadingClient({}).url("nobody", "/")


def test_cookie_header_joins_name_value_pairs():
    assert cookie_header({"a_session": "1", "b_session": "2"}) == "a_session=1; b_session=2"
