"""nemo_gym.base_responses_api_agent: when an agent correlates its calls with a rollout, as upstream's does; and
its /v1/responses, which for an agent whose own ``responses`` takes another body (upstream's aviary_agent) is
served with that body, as upstream registers ``self.responses`` itself; and its /close_session, which closes its own
session and the session of each resources server whose cookie came with it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import aiohttp
import httpx
import pytest
from fastapi import FastAPI, Request, Response
from omegaconf import OmegaConf

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config import Instance, free_port
from nemo_gym.global_config import OBSERVABILITY_ENABLED_KEY_NAME, TOKEN_ID_CAPTURE_BLOCK
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming, new_response
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.server_utils import ServerClient
from tests.unit_tests.in_process_server import serving
from tests.unit_tests.lifecycle.test_middleware import HookedServer

ROW = {"responses_create_params": {"input": "q"}, "_ng_task_index": 3, "_ng_rollout_index": 1}


def agent(global_config: dict, *, token_id_capture: bool = False) -> SimpleResponsesAPIAgent:
    config = BaseResponsesAPIAgentConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="agent", token_id_capture=token_id_capture)
    client = ServerClient(head_server_config={"host": "127.0.0.1", "port": 2}, global_config_dict=OmegaConf.create(global_config))
    return SimpleResponsesAPIAgent(config=config, server_client=client)


def request(path: str, rollout_id: str | None) -> SimpleNamespace:
    return SimpleNamespace(path_params={"rollout_id": rollout_id} if rollout_id else {}, url=SimpleNamespace(path=path))


def test_the_key_names_are_upstreams():
    assert (OBSERVABILITY_ENABLED_KEY_NAME, TOKEN_ID_CAPTURE_BLOCK) == ("observability_enabled", "token_id_capture")


def test_without_model_call_capture_or_token_capture_a_run_has_no_rollout_id_and_paths_stay_plain():
    plain = agent({})
    assert plain.rollout_id_from_run(ROW) is None
    assert plain.url_path_for_run("/v1/responses", ROW) == "/v1/responses"


def test_with_observability_enabled_a_run_calls_under_its_rollout_prefix():
    observed = agent({OBSERVABILITY_ENABLED_KEY_NAME: True})
    assert observed._model_call_capture_enabled()
    assert observed.rollout_id_from_run(ROW) == "3-1"
    assert observed.url_path_for_run("/v1/responses", ROW) == "/ng-rollout/3-1/v1/responses"


@pytest.mark.parametrize(
    ("block", "agent_flag", "enabled"),
    [
        ({"enabled": True}, True, True),
        ({"enabled": True}, False, False),
        ({"enabled": True, "all_agents": True}, False, True),
        ({"enabled": False, "all_agents": True}, True, False),
    ],
)
def test_token_capture_needs_the_run_level_switch_and_the_agents_own_flag_or_all_agents(block, agent_flag, enabled):
    capturing = agent({TOKEN_ID_CAPTURE_BLOCK: block}, token_id_capture=agent_flag)
    assert capturing._token_id_capture_enabled() is enabled
    expected = "/ng-rollout/3-1/training-token-capture/v1/responses" if enabled else "/v1/responses"
    assert capturing.url_path_for_run("/v1/responses", ROW) == expected


def test_a_request_that_came_in_under_a_prefix_passes_it_on_with_its_capture_segment():
    plain = agent({})
    assert plain.url_path_for_request("/v1/responses", request("/ng-rollout/3-1/v1/responses", "3-1")) == "/ng-rollout/3-1/v1/responses"
    captured = request("/ng-rollout/3-1/training-token-capture/v1/responses", "3-1")
    assert plain.url_path_for_request("/v1/responses", captured) == "/ng-rollout/3-1/training-token-capture/v1/responses"
    assert plain.url_path_for_request("/v1/responses", request("/v1/responses", None)) == "/v1/responses"
    assert plain.url_path_for_request("/v1/responses", None) == "/v1/responses"


class RolloutEchoAgent(SimpleResponsesAPIAgent):
    async def run(self, request: Request, body: BaseRunRequest) -> dict:
        return {"rollout_id": current_rollout_id()}


@pytest.mark.anyio
@pytest.mark.parametrize(("observed", "expected"), [(True, "3-1"), (False, None)])
async def test_a_run_is_inside_its_rollouts_context_when_calls_are_correlated(observed, expected):
    config = BaseResponsesAPIAgentConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="agent")
    client = ServerClient(global_config_dict=OmegaConf.create({OBSERVABILITY_ENABLED_KEY_NAME: observed}))
    agent = RolloutEchoAgent(config=config, server_client=client)
    async with serving(agent.setup_webserver()) as url, httpx.AsyncClient(base_url=url) as http:
        reply = await http.post("/run", json=ROW)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"rollout_id": expected}


NAME = "agent_probe"


class TaskRequest(BaseRunRequest):
    task_idx: int


class OwnBodyAgent(SimpleResponsesAPIAgent):
    async def responses(self, req: TaskRequest) -> NeMoGymResponse:
        return new_response(model=f"task-{req.task_idx}")


class BaseShapeAgent(SimpleResponsesAPIAgent):
    async def responses(self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        return new_response(model=body.model or "none")


def instances() -> dict[str, Instance]:
    settings = {"entrypoint": "app.py", "host": "127.0.0.1", "port": free_port(), "num_workers": 1, "session_secret": "agent-probe-" + "x" * 32}
    return {NAME: Instance(NAME, "responses_api_agents", "simple_agent", settings)}


@pytest.mark.anyio
async def test_an_agents_own_responses_body_is_what_v1_responses_reads_as_upstreams():
    async with serving(OwnBodyAgent.for_instance(NAME, instances()).setup_webserver()) as url, aiohttp.ClientSession() as session:
        row = {"task_idx": 7, "responses_create_params": {"input": [{"role": "user", "content": "hello"}]}}
        async with session.post(f"{url}/v1/responses", json=row) as reply:
            assert reply.status == 200, await reply.text()
            assert (await reply.json())["model"] == "task-7"


@pytest.mark.anyio
async def test_a_base_shaped_responses_still_answers_json_or_events():
    async with serving(BaseShapeAgent.for_instance(NAME, instances()).setup_webserver()) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/responses", json={"input": "hi", "model": "m"}) as reply:
            assert reply.status == 200 and (await reply.json())["model"] == "m"
        async with session.post(f"{url}/v1/responses", json={"input": "hi", "model": "m", "stream": True}) as reply:
            assert reply.status == 200 and reply.content_type == "text/event-stream"


class NoResponseParameterAgent(SimpleResponsesAPIAgent):
    """Upstream's agents may leave out the ``response`` parameter."""

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        return new_response(model=body.model or "none")


@pytest.mark.anyio
async def test_a_responses_without_the_response_parameter_is_called_with_what_it_takes():
    async with serving(NoResponseParameterAgent.for_instance(NAME, instances()).setup_webserver()) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/responses", json={"input": "hi", "model": "m"}) as reply:
            assert reply.status == 200 and (await reply.json())["model"] == "m"


def test_server_client_builds_a_servers_base_url_as_upstreams_and_url_uses_it():
    config = OmegaConf.create({"judge": {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 8123}}}})
    client = ServerClient(global_config_dict=config)
    assert client._build_server_base_url(OmegaConf.create({"host": "127.0.0.1", "port": 8123})) == "http://127.0.0.1:8123"
    client._build_server_base_url = lambda settings: f"http://elsewhere:{settings['port']}"
    assert client.url("judge", "/v1/responses") == "http://elsewhere:8123/v1/responses"


def test_base_url_for_run_and_resolve_model_base_url_put_the_rollout_prefix_on_a_model_url_as_upstreams():
    agent = OwnBodyAgent.for_instance(NAME, instances())
    agent.server_client = ServerClient(
        global_config_dict=OmegaConf.create({OBSERVABILITY_ENABLED_KEY_NAME: True, "policy": {"responses_api_models": {"x": {"host": "h", "port": 2}}}})
    )
    row = BaseRunRequest.model_validate({"responses_create_params": {"input": "hi"}, "_ng_rollout_id": "r1"})
    assert agent.base_url_for_run("http://m:1", row) == "http://m:1/ng-rollout/r1"
    assert agent.base_url_for_run("http://m:1", BaseRunRequest.model_validate({"responses_create_params": {"input": "hi"}})) == "http://m:1"
    assert agent.resolve_model_base_url("policy") == "http://h:2/v1"
    assert agent.resolve_model_base_url("policy", "r2") == "http://h:2/ng-rollout/r2/v1"


SECRET = "agent-close-" + "x" * 32


class HookedAgent(SimpleResponsesAPIAgent):
    """Records its hook's calls; ``/ping`` is a request of its session."""

    ends: ClassVar[list[tuple[str, str]]] = []

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/ping")(self.ping)
        return app

    async def ping(self) -> dict[str, str]:
        return {"status": "ok"}

    async def on_session_end(self, session_id: str, reason: EndReason) -> None:
        HookedAgent.ends.append((session_id, str(reason)))


def closing_instances() -> dict[str, Instance]:
    common = {"entrypoint": "app.py", "host": "127.0.0.1", "num_workers": 1, "session_secret": SECRET}
    return {
        "env": Instance("env", "resources_servers", "example_session_state_mgmt", {**common, "port": free_port()}),
        "agent": Instance("agent", "responses_api_agents", "simple_agent", {**common, "port": free_port()}),
    }


@pytest.mark.anyio
async def test_an_agents_close_ends_its_session_and_the_environments_each_once():
    HookedServer.ends.clear()
    HookedAgent.ends.clear()
    config = closing_instances()
    env, agent = HookedServer.for_instance("env", config), HookedAgent.for_instance("agent", config)
    async with (
        serving(env.build_app(), config["env"].settings["port"]) as env_url,
        serving(agent.build_app(), config["agent"].settings["port"]) as agent_url,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        async with http.post(f"{env_url}/increment") as reply:
            jar = {key: morsel.value for key, morsel in reply.cookies.items()}
        async with http.post(f"{agent_url}/ping") as reply:
            jar.update({key: morsel.value for key, morsel in reply.cookies.items()})
        async with http.post(f"{agent_url}/close_session", cookies=jar) as reply:
            first = await reply.json()
        async with http.post(f"{agent_url}/close_session", cookies=jar) as reply:
            second = await reply.json()
        assert (first["status"], first["resources_servers"]) == ("closed", {"env": "closed"})
        assert (second["status"], second["resources_servers"]) == ("already closed", {"env": "already closed"})
        assert [reason for _, reason, _ in HookedServer.ends] == ["close"] and [reason for _, reason in HookedAgent.ends] == ["close"]
        async with http.post(f"{env_url}/increment", cookies=jar) as reply:
            assert reply.status == 410
        async with http.post(f"{agent_url}/close_session") as reply:
            assert reply.status == 400
