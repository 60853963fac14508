"""SimpleResponsesAPIAgent's /v1/responses: an agent whose own ``responses`` takes another body (upstream's
aviary_agent: ``responses(self, req: AviaryAgentRunRequest)``) is served with that body, as upstream
registers ``self.responses`` itself; one of the base's shape keeps the JSON-or-events reply."""

from __future__ import annotations

import aiohttp
import pytest
from fastapi import Request, Response

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.config import Instance, free_port
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming, new_response
from tests.unit_tests.in_process_server import serving

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
    from omegaconf import OmegaConf

    from nemo_gym.server_utils import ServerClient

    config = OmegaConf.create({"judge": {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 8123}}}})
    client = ServerClient(global_config_dict=config)
    assert client._build_server_base_url(OmegaConf.create({"host": "127.0.0.1", "port": 8123})) == "http://127.0.0.1:8123"
    client._build_server_base_url = lambda settings: f"http://elsewhere:{settings['port']}"
    assert client.url("judge", "/v1/responses") == "http://elsewhere:8123/v1/responses"


def test_base_url_for_run_and_resolve_model_base_url_put_the_rollout_prefix_on_a_model_url_as_upstreams():
    from omegaconf import OmegaConf

    from nemo_gym.server_utils import ServerClient

    agent = OwnBodyAgent.for_instance(NAME, instances())
    row = BaseRunRequest.model_validate({"responses_create_params": {"input": "hi"}, "_ng_rollout_id": "r1"})
    assert agent.base_url_for_run("http://m:1", row) == "http://m:1/ng-rollout/r1"
    assert agent.base_url_for_run("http://m:1", BaseRunRequest.model_validate({"responses_create_params": {"input": "hi"}})) == "http://m:1"
    agent.server_client = ServerClient(global_config_dict=OmegaConf.create({"policy": {"responses_api_models": {"x": {"host": "h", "port": 2}}}}))
    assert agent.resolve_model_base_url("policy") == "http://h:2/v1"
    assert agent.resolve_model_base_url("policy", "r2") == "http://h:2/ng-rollout/r2/v1"
