"""nemo_gym.server_utils: upstream's ServerClient interface and reply helpers, against a real server."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import yarl
from fastapi import FastAPI, HTTPException, Request, Response
from multidict import CIMultiDict, CIMultiDictProxy
from omegaconf import OmegaConf
from pydantic import BaseModel

from nemo_gym import config as gym_config
from nemo_gym.env import ENTRYPOINT_ENV, WORKER_ENV
from nemo_gym.sessions.worker import OWNER_KEY, WORKER_HEADER
from nemo_gym.server_utils import ServerClient, apply_rollout_prefix, get_response_json, is_nemo_gym_fastapi_entrypoint, raise_for_status, rollout_path_prefix
from tests.unit_tests.in_process_server import serving
from tests.session_cookies import signed_session


class Partial(BaseModel):
    a: int = 1
    b: int | None = None


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"body": await request.json(), "cookies": dict(request.cookies)}

    @app.post("/connection")
    async def connection(request: Request, response: Response) -> None:
        # Each connection plays one worker: its reply names it, as a routed server's replies do.
        response.headers[WORKER_HEADER] = f"{request.client.port:016x}"

    @app.get("/teapot")
    async def teapot() -> None:
        raise HTTPException(418, "short and stout")

    return app


@pytest.fixture
async def client():
    port = gym_config.free_port()
    client = ServerClient(global_config_dict=OmegaConf.create({"echo": {"resources_servers": {"x": {"host": "127.0.0.1", "port": port}}}}))
    async with serving(echo_app(), port):
        yield client
    await client.close()


@pytest.mark.anyio
async def test_post_by_instance_name_returns_the_aiohttp_response_and_sends_cookies_as_given(client):
    response = await client.post(server_name="echo", url_path="/echo", json={"n": 1}, cookies={"echo_session": "abc"})
    assert isinstance(response, aiohttp.ClientResponse)
    await raise_for_status(response)
    assert await get_response_json(response) == {"body": {"n": 1}, "cookies": {"echo_session": "abc"}}


@pytest.mark.anyio
async def test_a_pydantic_body_is_sent_with_only_the_fields_that_were_set(client):
    response = await client.post("echo", "/echo", json=Partial(b=2))
    assert (await get_response_json(response))["body"] == {"b": 2}


@pytest.mark.anyio
async def test_raise_for_status_raises_the_replys_own_error_with_its_body_as_response_content(client):
    response = await client.get("echo", "/teapot")
    with pytest.raises(aiohttp.ClientResponseError) as raised:
        await raise_for_status(response)
    assert (raised.value.status, raised.value.message) == (418, "I'm a Teapot")
    assert b"short and stout" in raised.value.response_content


class StandInReply:
    """A reply as upstream's tests mock one: ``ok``, ``read()`` and its own ``raise_for_status()``, no ``status``."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok

    async def read(self) -> bytes:
        return b"rate limited"

    def raise_for_status(self) -> None:
        url = yarl.URL("http://judge/v1/responses")
        raise aiohttp.ClientResponseError(aiohttp.RequestInfo(url, "POST", CIMultiDictProxy(CIMultiDict()), url), (), status=429, message="Too Many Requests")


@pytest.mark.anyio
async def test_raise_for_status_judges_a_reply_by_its_ok_alone():
    await raise_for_status(StandInReply(ok=True))
    with pytest.raises(aiohttp.ClientResponseError, match="429") as raised:
        await raise_for_status(StandInReply(ok=False))
    assert raised.value.response_content == b"rate limited"


@pytest.mark.anyio
async def test_an_unknown_instance_name_is_a_key_error_naming_it(client):
    with pytest.raises(KeyError, match="no server instance named 'nope'"):
        await client.post("nope", "/echo", json={})


@pytest.mark.anyio
async def test_a_sessions_calls_go_on_a_connection_to_the_worker_its_cookie_names(client):
    """Upstream's interface gets the owner pool: ``cookies=`` naming an owner steers the call to it."""

    def cookies(owner: str) -> dict[str, str]:
        return {"echo_session": signed_session("any secret", {"session_id": "s", OWNER_KEY: owner})}

    unknown = "f" * 16
    opened = await asyncio.gather(*(client.post("echo", "/connection", json={}, cookies=cookies(unknown)) for _ in range(3)))
    workers = {response.headers[WORKER_HEADER] for response in opened}
    assert len(workers) == 3
    for owner in sorted(workers):
        replies = [await client.post("echo", "/connection", json={}, cookies=cookies(owner)) for _ in range(4)]
        assert [response.headers[WORKER_HEADER] for response in replies] == [owner] * 4


@pytest.mark.anyio
async def test_a_reply_is_read_in_full_so_it_can_be_read_again_after_other_calls(client):
    first = await client.post("echo", "/echo", json={"n": 1})
    await client.post("echo", "/echo", json={"n": 2})
    assert (await first.read(), await get_response_json(first)) == (b'{"body":{"n":1},"cookies":{}}', {"body": {"n": 1}, "cookies": {}})


def test_is_nemo_gym_fastapi_entrypoint_only_in_a_launcher_worker_for_that_file(monkeypatch, tmp_path):
    app_py = tmp_path / "resources_servers" / "counter" / "app.py"
    assert not is_nemo_gym_fastapi_entrypoint(str(app_py))
    monkeypatch.setenv(WORKER_ENV, "1")
    monkeypatch.setenv(ENTRYPOINT_ENV, "resources_servers/counter/app.py")
    assert is_nemo_gym_fastapi_entrypoint(str(app_py))
    assert not is_nemo_gym_fastapi_entrypoint(str(tmp_path / "resources_servers" / "other" / "app.py"))


def test_a_rollouts_path_prefix_and_its_model_url():
    assert rollout_path_prefix("3-1") == "/ng-rollout/3-1"
    assert rollout_path_prefix("3-1", token_capture=True) == "/ng-rollout/3-1/training-token-capture"
    assert rollout_path_prefix(None) == ""
    assert apply_rollout_prefix("http://model:8000/", "3-1") == "http://model:8000/ng-rollout/3-1"
    assert apply_rollout_prefix("http://model:8000/", None) == "http://model:8000/"


class StandInBody:
    """A reply as upstream's tests mock one for ``get_response_json``: ``read()`` alone."""

    async def read(self) -> bytes:
        return b'{"verdict": "[[A]]"}'


@pytest.mark.anyio
async def test_get_response_json_parses_what_read_returns_so_a_stand_in_reply_works():
    assert await get_response_json(StandInBody()) == {"verdict": "[[A]]"}
