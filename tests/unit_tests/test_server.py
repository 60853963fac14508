"""The server base, served by a real uvicorn on a free loopback port inside each test."""

from __future__ import annotations

import aiohttp
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel

from nemo_gym import SESSION_ID_KEY
from nemo_gym.client import ServerClient
from nemo_gym.config import Instance, free_port
from nemo_gym.server import SimpleServer
from tests.unit_tests.in_process_server import serving

NAME = "probe"


class CountBody(BaseModel):
    count: int


class ProbeServer(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.get("/whoami")(self.whoami)
        app.post("/boom")(self.boom)
        app.post("/count")(self.count)
        return app

    async def whoami(self, request: Request) -> dict[str, str]:
        return {"session_id": request.session[SESSION_ID_KEY]}

    async def boom(self) -> None:
        raise RuntimeError("the tool broke")

    async def count(self, body: CountBody) -> dict[str, int]:
        return {"count": body.count}


def probe_instances() -> dict[str, Instance]:
    settings = {"entrypoint": "app.py", "host": "127.0.0.1", "port": free_port(), "num_workers": 1, "session_secret": "probe-secret-" + "x" * 32}
    return {NAME: Instance(NAME, "resources_servers", "example_session_state_mgmt", settings)}


@pytest.fixture
async def probe():
    """A running ProbeServer and a ServerClient that reaches it by name."""
    instances = probe_instances()
    client = ServerClient(instances)
    async with serving(ProbeServer(NAME, instances).build_app(), instances[NAME].port):
        try:
            yield client
        finally:
            await client.close()


@pytest.mark.anyio
async def test_liveness_answers_status_ok(probe):
    reply = await probe.get(NAME, "/")
    assert (reply.status, reply.body) == (200, {"status": "ok"})


@pytest.mark.anyio
async def test_every_request_gets_a_session_id_in_a_cookie_named_after_the_instance(probe):
    first = await probe.get(NAME, "/whoami")
    assert first.status == 200
    assert set(first.cookies) == {f"{NAME}_session"}
    assert first.body["session_id"]

    again = await probe.get(NAME, "/whoami", cookies=first.cookies)
    assert again.body["session_id"] == first.body["session_id"]

    stranger = await probe.get(NAME, "/whoami")
    assert stranger.body["session_id"] != first.body["session_id"]


@pytest.mark.anyio
async def test_unhandled_error_becomes_a_500_whose_json_body_holds_the_errors_repr(probe):
    reply = await probe.post(NAME, "/boom", json={})
    assert reply.status == 500
    assert reply.body == {"detail": repr(RuntimeError("the tool broke"))}


@pytest.mark.anyio
async def test_body_that_is_not_json_gives_422_saying_so(probe):
    url = probe.url(NAME, "/count")
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=b"{not json", headers={"Content-Type": "application/json"}) as reply:
            status, body = reply.status, await reply.json()
    assert status == 422
    [problem] = body["detail"]
    assert problem["type"] == "json_invalid"
    assert problem["loc"][0] == "body"


@pytest.mark.anyio
async def test_body_with_a_wrong_field_type_gives_422_naming_the_field(probe):
    reply = await probe.post(NAME, "/count", json={"count": "many"})
    assert reply.status == 422
    [problem] = reply.body["detail"]
    assert problem["loc"] == ["body", "count"]
    assert "integer" in problem["msg"]


@pytest.mark.anyio
async def test_body_missing_a_field_gives_422_naming_the_field(probe):
    reply = await probe.post(NAME, "/count", json={})
    assert reply.status == 422
    [problem] = reply.body["detail"]
    assert (problem["type"], problem["loc"]) == ("missing", ["body", "count"])


@pytest.mark.anyio
async def test_unknown_route_gives_404_with_a_json_detail(probe):
    reply = await probe.post(NAME, "/no_such_tool", json={})
    assert reply.status == 404
    assert reply.body == {"detail": "Not Found"}


@pytest.mark.anyio
async def test_every_reply_sets_the_session_cookie_errors_included_so_a_replacing_client_keeps_its_session(probe):
    first = await probe.get(NAME, "/whoami")
    cookies = first.cookies
    for method, path, body, status in [
        ("GET", "/whoami", None, 200),
        ("POST", "/count", {"count": "many"}, 422),
        ("POST", "/no_such_tool", {}, 404),
        ("POST", "/boom", {}, 500),
        ("POST", "/count", {"count": 1}, 200),
    ]:
        reply = await probe.request(method, NAME, path, body, cookies, None)
        assert reply.status == status
        assert set(reply.cookies) == {f"{NAME}_session"}, (path, status)
        cookies = reply.cookies  # replaced, never merged: what upstream NeMo Gym's agents do
    again = await probe.get(NAME, "/whoami", cookies=cookies)
    assert again.body["session_id"] == first.body["session_id"]
