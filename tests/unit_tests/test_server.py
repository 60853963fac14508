"""The server base, served by a real uvicorn on a free loopback port inside each test."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import types
import unittest.mock
import urllib.request
from typing import Any, Dict

import aiohttp
import httpx
import pytest
from fastapi import FastAPI, Request
from omegaconf import OmegaConf
from pydantic import BaseModel, Field, ValidationError

from nemo_gym import SESSION_ID_KEY
from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import Instance, free_port
from nemo_gym.env import CONFIG_PATH_ENV, INSTANCE_ENV, WORKER_ENV
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.process.discovery import find_server_class
from nemo_gym.server import SimpleServer
from nemo_gym.server_utils import ServerClient
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
    """A running ProbeServer and a ReadingClient that reaches it by name."""
    instances = probe_instances()
    client = ReadingClient(instances)
    async with serving(ProbeServer.for_instance(NAME, instances).build_app(), instances[NAME].port):
        try:
            yield client
        finally:
            await client.close()


@pytest.mark.anyio
async def test_start_up_freezes_what_the_imports_and_the_app_made_out_of_the_collectors_way():
    app = ProbeServer.for_instance(NAME, probe_instances()).build_app()
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    async with serving(app, free_port()):
        assert gc.get_freeze_count() > 10_000


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
        reply = await probe.call(method, NAME, path, body, cookies, None)
        assert reply.status == status
        assert set(reply.cookies) == {f"{NAME}_session"}, (path, status)
        cookies = reply.cookies  # replaced, never merged: what upstream NeMo Gym's agents do
    again = await probe.get(NAME, "/whoami", cookies=cookies)
    assert again.body["session_id"] == first.body["session_id"]


class CounterConfig(BaseResourcesServerConfig):
    REVERIFY_MODE = ReverifyMode.STATELESS
    start: int = 0


class PydanticStateServer(SimpleResourcesServer):
    """Upstream's style: the config class from the annotation, state in pydantic fields and private attributes."""

    config: CounterConfig
    session_id_to_counter: Dict[str, int] = Field(default_factory=dict)

    def model_post_init(self, context: Any) -> None:
        self._calls = 0
        return super().model_post_init(context)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment")(self.increment)
        return app

    async def increment(self, request: Request) -> dict[str, int]:
        self._calls += 1
        session_id = request.session[SESSION_ID_KEY]
        self.session_id_to_counter[session_id] = self.session_id_to_counter.get(session_id, self.config.start) + 1
        return {"count": self.session_id_to_counter[session_id], "calls": self._calls}


def counter_instances(**settings: Any) -> dict[str, Instance]:
    data = {"pyd": {"resources_servers": {"example_session_state_mgmt": {"port": free_port(), **settings}}}}
    return gym_config.parse(data)


def test_the_config_class_is_the_annotation_of_config_with_the_instance_name_filled_in():
    server = PydanticStateServer.for_instance("pyd", counter_instances(start=5))
    assert PydanticStateServer.config_class is CounterConfig
    assert (type(server.config), server.config.name, server.config.start) == (CounterConfig, "pyd", 5)


def test_a_typo_in_an_upstream_style_config_is_an_error_naming_the_key():
    with pytest.raises(ValidationError, match="strat"):
        PydanticStateServer.validate_config("pyd", {"port": 1, "strat": 5})


@pytest.mark.anyio
async def test_pydantic_fields_and_private_attributes_hold_state_across_requests():
    instances = counter_instances(start=5)
    client = ReadingClient(instances)
    async with serving(PydanticStateServer.for_instance("pyd", instances).build_app(), instances["pyd"].port):
        first = await client.post("pyd", "/increment", json={})
        again = await client.post("pyd", "/increment", json={}, cookies=first.cookies)
        stranger = await client.post("pyd", "/increment", json={})
    await client.close()
    assert (first.body, again.body, stranger.body) == ({"count": 6, "calls": 1}, {"count": 7, "calls": 2}, {"count": 6, "calls": 3})


@pytest.mark.anyio
async def test_get_reverify_mode_answers_the_mode_the_config_class_declares():
    for server_class, mode in ((PydanticStateServer, "stateless"), (SimpleResourcesServer, "unknown")):
        instances = counter_instances()
        client = ReadingClient(instances)
        async with serving(server_class.for_instance("pyd", instances).build_app(), instances["pyd"].port):
            reply = await client.get("pyd", "/reverify_mode")
        await client.close()
        assert (reply.status, reply.body) == (200, mode)


@pytest.mark.anyio
async def test_the_base_seed_session_takes_the_body_alone_as_upstreams_and_serves_an_empty_reply():
    server = PydanticStateServer.for_instance("pyd", counter_instances())
    assert (await server.seed_session(BaseSeedSessionRequest())) == BaseSeedSessionResponse()
    instances = counter_instances()
    client = ReadingClient(instances)
    async with serving(PydanticStateServer.for_instance("pyd", instances).build_app(), instances["pyd"].port):
        reply = await client.post("pyd", "/seed_session", json={"any": "row key"})
    await client.close()
    assert (reply.status, reply.body) == (200, {})


@pytest.mark.anyio
async def test_setup_webserver_works_on_a_server_built_with_model_post_init_patched_away_as_upstreams_tests_do():
    instances = counter_instances()
    with unittest.mock.patch.object(PydanticStateServer, "model_post_init"):
        server = PydanticStateServer.for_instance("pyd", instances)
    async with serving(server.setup_webserver()) as url, httpx.AsyncClient(base_url=url) as client:
        reply = await client.post("/seed_session", json={})
    assert (reply.status_code, server.worker_id) == (200, None)


def module_with(source: str, name: str = "fixture_module") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


HEADER = "from nemo_gym.base_resources_server import SimpleResourcesServer\n"


def test_find_server_class_takes_the_one_server_class_a_module_defines():
    module = module_with(HEADER + "class Base(SimpleResourcesServer): pass\nclass Counter(Base): pass\n")
    assert find_server_class(module) is module.Counter


def test_a_module_with_two_unrelated_server_classes_is_an_error_naming_them():
    module = module_with(HEADER + "class One(SimpleResourcesServer): pass\nclass Two(SimpleResourcesServer): pass\n")
    with pytest.raises(LookupError, match="found One, Two"):
        find_server_class(module)


def test_run_webserver_in_a_launcher_worker_returns_the_app_unserved(monkeypatch, tmp_path):
    instances = counter_instances(num_workers=1)
    (tmp_path / "config.json").write_text(json.dumps(instances["pyd"].to_dict()))
    monkeypatch.setenv(CONFIG_PATH_ENV, str(tmp_path / "config.json"))
    monkeypatch.setenv(INSTANCE_ENV, "pyd")
    monkeypatch.setenv(WORKER_ENV, "1")
    get_global_config_dict.cache_clear()
    try:
        app = PydanticStateServer.run_webserver()
    finally:
        get_global_config_dict.cache_clear()
    while not isinstance(app, FastAPI):  # inside the metrics endpoint, the body limit, served-here and cancel on disconnect
        app = app.app
    assert {"/increment", "/verify", "/reverify_mode"} <= {route.path for route in app.routes}


def unnamed_probe() -> ProbeServer:
    """A server built the way upstream's tests build one: an empty instance name, no launcher."""
    config = BaseResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="", name="")
    return ProbeServer(config=config, server_client=ServerClient(global_config_dict=OmegaConf.create({})))


@pytest.mark.anyio
async def test_setup_webserver_alone_gives_every_request_a_session_kept_by_its_cookie():
    async with serving(ProbeServer.for_instance(NAME, probe_instances()).setup_webserver()) as url:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:  # aiohttp's own jar (unsafe: an IP host)
            first = await (await session.get(f"{url}/whoami")).json()
            again = await (await session.get(f"{url}/whoami")).json()
    assert first["session_id"] and again == first


@pytest.mark.anyio
async def test_a_server_with_an_empty_instance_name_serves_its_openapi_and_keeps_sessions():
    async with serving(unnamed_probe().setup_webserver()) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/openapi.json")).json()["info"]["title"] == "ProbeServer"
        first = (await client.get("/whoami")).json()
        assert (await client.get("/whoami")).json() == first



def test_run_webserver_outside_a_worker_serves_the_instance_as_the_launcher_would(tmp_path):
    """Upstream's ``python app.py``, with the launcher's environment: the process serves its instance."""
    directory = gym_config.REPO_ROOT / "resources_servers" / "example_session_state_mgmt"
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"port": free_port()}}}})
    (tmp_path / "config.json").write_text(json.dumps(gym_config.config_of(instances)))
    env = {**os.environ, CONFIG_PATH_ENV: str(tmp_path / "config.json"), INSTANCE_ENV: "counter", "PYTHONPATH": str(gym_config.REPO_ROOT)}
    env.pop(WORKER_ENV, None)
    process = subprocess.Popen([sys.executable, "app.py"], cwd=directory, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read().decode()
            try:
                with urllib.request.urlopen(f"{instances['counter'].url}/", timeout=2) as reply:
                    assert json.load(reply) == {"status": "ok"}
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer GET / within 60 s"
                time.sleep(0.2)
        request = urllib.request.Request(f"{instances['counter'].url}/seed_session", data=b'{"initial_count": 4}', method="POST")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200 and "counter_session=" in reply.headers["Set-Cookie"]
    finally:
        process.terminate()
        process.wait(timeout=30)


class OwnAppServer(SimpleServer):
    """Upstream's style of gymnasium's base and mini_swe_agent_2: a FastAPI() of its own, sessions added to it."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        self.setup_session_middleware(app)

        async def whoami(request: Request) -> dict:
            return {"session_id": request.session[SESSION_ID_KEY]}

        app.get("/whoami")(whoami)
        return app


@pytest.mark.anyio
async def test_setup_session_middleware_gives_an_apps_own_fastapi_sessions_once_as_upstreams():
    server = OwnAppServer.for_instance(NAME, probe_instances())
    app = server.setup_webserver()
    assert [layer.cls.__name__ for layer in app.user_middleware] == ["SessionCookie", "SessionIdMiddleware"]
    async with serving(app) as url:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            first = await (await session.get(f"{url}/whoami")).json()
            again = await (await session.get(f"{url}/whoami")).json()
    assert first["session_id"] and again == first
