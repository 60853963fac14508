"""nemo_gym.base_responses_api_agent: when an agent correlates its calls with a rollout, as upstream's does."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from fastapi import Request
from omegaconf import OmegaConf

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.global_config import OBSERVABILITY_ENABLED_KEY_NAME, TOKEN_ID_CAPTURE_BLOCK
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.server_utils import ServerClient
from tests.unit_tests.in_process_server import serving

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
