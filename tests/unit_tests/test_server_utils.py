"""nemo_gym.server_utils: upstream's ServerClient interface and reply helpers, against a real server.

Its ServerClient spreads new sessions over an instance's replicas (its ``replicas`` setting, or the head's view of it):
three in-process replicas of two workers each on loopback (``replica_set``); each replica's public address reaches
its first worker, so a session started there is that worker's. The client is upstream's ``ServerClient`` with
``cookies=``, or the reading client built from the head's view.

Upstream's small helpers here, as upstream's servers import them: get_global_aiohttp_client and
is_global_aiohttp_client_request_debug_enabled (remote_agent), ServerClient.poll_for_status (local_vllm_model_proxy).
"""

from __future__ import annotations

import asyncio
import collections
import http.server
import json
import socket
import threading

import aiohttp
import pytest
import yarl
from fastapi import FastAPI, HTTPException, Request, Response
from multidict import CIMultiDict, CIMultiDictProxy
from omegaconf import OmegaConf
from pydantic import BaseModel

from nemo_gym import config as gym_config
from nemo_gym import global_config, server_utils
from nemo_gym.client.reading import ReadingClient
from nemo_gym.env import ENTRYPOINT_ENV, WORKER_ENV
from nemo_gym.process.head import build_app, fetch_instances
from nemo_gym.routing.replica import REPLICA_KEY
from nemo_gym.server_utils import ServerClient, apply_rollout_prefix, get_response_json, is_nemo_gym_fastapi_entrypoint, raise_for_status, rollout_path_prefix
from nemo_gym.sessions.worker import OWNER_KEY, WORKER_HEADER
from tests.session_cookies import signed_session
from tests.unit_tests.in_process_server import serving
from tests.unit_tests.routing.replica_sets import Replica, replica_set, session


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


def config(given: Replica, listed: list[Replica]) -> dict:
    """A config whose instance is at ``given``'s public address and lists ``listed`` as its replicas."""
    worker = given.workers[0]
    host, port = given.address.rsplit(":", 1)
    settings = {"host": host, "port": int(port), "replicas": [f"http://{replica.address}" for replica in listed]}
    return {worker.server.name: {"resources_servers": {"example_session_state_mgmt": settings}}}


def client_for(given: Replica, listed: list[Replica]) -> ServerClient:
    return ServerClient(global_config_dict=OmegaConf.create(config(given, listed)))


async def start_sessions(client: ServerClient, name: str, cookie_name: str, count: int) -> list[str]:
    """``count`` new sessions (requests with no cookie for the instance): their session cookies."""
    cookies = []
    for _ in range(count):
        response = await client.post(name, "/increment")
        assert response.status == 200, await response.text()
        cookies.append(response.cookies[cookie_name].value)
    return cookies


def owner_replicas(replica: Replica, cookies: list[str]) -> collections.Counter:
    worker = replica.workers[0]
    return collections.Counter(session(worker, {worker.server.session_cookie: cookie})[REPLICA_KEY] for cookie in cookies)


@pytest.mark.anyio
async def test_new_sessions_spread_evenly_over_the_instance_and_its_listed_replicas():
    async with replica_set(count=3) as (replicas, _):
        r1, r2, r3 = replicas
        server = r1.workers[0].server
        client = client_for(r1, [r2, r3])
        try:
            cookies = await start_sessions(client, server.name, server.session_cookie, 12)
        finally:
            await client.close()
        assert owner_replicas(r1, cookies) == {r1.address: 4, r2.address: 4, r3.address: 4}


@pytest.mark.anyio
async def test_later_requests_of_each_session_reach_its_owner_replica_directly():
    async with replica_set(count=3) as (replicas, _):
        r1, r2, r3 = replicas
        server = r1.workers[0].server
        client = client_for(r1, [r2, r3])
        try:
            cookies = await start_sessions(client, server.name, server.session_cookie, 9)
            assert len(owner_replicas(r1, cookies)) == 3  # spread: directness is across replicas
            for cookie in cookies:
                owner = session(r1.workers[0], {server.session_cookie: cookie})[OWNER_KEY]
                for count in (2, 3, 4):
                    response = await client.post(server.name, "/increment", cookies={server.session_cookie: cookie})
                    assert await response.json() == {"worker": owner, "count": count}
        finally:
            await client.close()
        assert all(worker.server.replicas.pools == {} for replica in replicas for worker in replica.workers)  # nothing forwarded


@pytest.mark.anyio
async def test_a_listed_replica_that_takes_no_connection_is_skipped_for_new_sessions_and_its_sessions_go_to_the_given_url():
    async with replica_set(count=3) as (replicas, caller):
        r1, r2, r3 = replicas
        a3, b3 = r3.workers
        server = r1.workers[0].server
        response = await caller.post(b3, "/increment")
        old = response.cookies[server.session_cookie].value
        await a3.stop()  # r3's public address takes no connection now; its forwarding port still does (b3)
        client = client_for(r1, [r2, r3])
        try:
            cookies = await start_sessions(client, server.name, server.session_cookie, 8)
            response = await client.post(server.name, "/increment", cookies={server.session_cookie: old})
            assert await response.json() == {"worker": b3.server.worker_id, "count": 2}
        finally:
            await client.close()
        assert owner_replicas(r1, cookies) == {r1.address: 4, r2.address: 4}
        assert r1.workers[0].server.replicas.pools != {}  # the old session crossed from the given URL's replica


@pytest.mark.anyio
async def test_the_head_lists_an_instances_replicas_and_a_client_of_its_view_spreads_over_them(tmp_path):
    async with replica_set(count=3) as (replicas, _):
        r1, r2, r3 = replicas
        server = r1.workers[0].server
        path = tmp_path / "resolved.json"
        path.write_text(json.dumps(config(r1, [r2, r3])))
        async with serving(build_app(str(path))) as head_url:
            instances = await asyncio.to_thread(fetch_instances, head_url)
        assert instances[server.name].settings["replicas"] == [f"http://{r2.address}", f"http://{r3.address}"]
        client = ReadingClient(instances)
        try:
            replies = [await client.post(server.name, "/increment") for _ in range(6)]
        finally:
            await client.close()
        cookies = [reply.cookies[server.session_cookie] for reply in replies]
        assert owner_replicas(r1, cookies) == {r1.address: 2, r2.address: 2, r3.address: 2}


@pytest.mark.anyio
async def test_get_global_aiohttp_client_is_the_one_pooled_session_request_uses():
    client = server_utils.get_global_aiohttp_client()
    assert isinstance(client, aiohttp.ClientSession) and not client.closed
    assert server_utils.get_global_aiohttp_client() is client
    await client.close()


def test_the_shared_session_of_an_event_loop_is_closed_when_asyncio_run_ends_the_loop():
    async def used_and_left_open() -> aiohttp.ClientSession:
        return server_utils.get_global_aiohttp_client()

    sessions = [asyncio.run(used_and_left_open()) for _ in range(2)]
    assert sessions[0] is not sessions[1] and all(session.closed for session in sessions)


def test_request_debug_is_off_unless_the_config_turns_it_on(tmp_path, monkeypatch):
    global_config.get_global_config_dict.cache_clear()
    monkeypatch.delenv(global_config.CONFIG_PATH_ENV, raising=False)
    assert server_utils.is_global_aiohttp_client_request_debug_enabled() is False
    (tmp_path / "config.json").write_text(json.dumps({"global_aiohttp_client_request_debug": True}))
    monkeypatch.setenv(global_config.CONFIG_PATH_ENV, str(tmp_path / "config.json"))
    global_config.get_global_config_dict.cache_clear()
    assert server_utils.is_global_aiohttp_client_request_debug_enabled() is True
    global_config.get_global_config_dict.cache_clear()


class NotFoundHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_error(404)

    def log_message(self, *args):
        pass


def test_poll_for_status_is_success_for_any_reply_and_connection_error_where_nothing_listens():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFoundHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    settings = {"host": "127.0.0.1", "entrypoint": "app.py"}
    config = OmegaConf.create({
        "up": {"responses_api_models": {"m": {**settings, "port": server.server_address[1]}}},
        "down": {"responses_api_models": {"m": {**settings, "port": closed_port}}},
        "head_server": {**settings, "port": server.server_address[1]},
    })
    client = server_utils.ServerClient(global_config_dict=config)
    try:
        assert [client.poll_for_status(name) for name in ("up", "down", "head_server")] == ["success", "connection_error", "success"]
    finally:
        server.shutdown()
        thread.join(timeout=10)
