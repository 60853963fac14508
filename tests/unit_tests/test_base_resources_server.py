"""The Responses types' validators are built on first use, not at a server's start-up; then they validate as ever."""

from __future__ import annotations

import warnings

import httpx
import pytest
from pydantic import ValidationError

from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyRequest
from nemo_gym.openai_utils import NeMoGymResponseCreateParams, NeMoGymResponseCreateParamsNonStreaming, new_response
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.unit_tests.fresh_worker import worker_imports
from tests.unit_tests.in_process_server import serving

DEFERRED = ["BaseRunRequest", "BaseVerifyRequest", "BaseVerifyResponse", "NeMoGymResponseCreateParamsNonStreaming", "NeMoGymResponseCreateParams"]
PROBE = (
    "{name: getattr(module, name).__pydantic_complete__ for module in "
    "(sys.modules['nemo_gym.base_resources_server'], sys.modules['nemo_gym.openai_utils']) "
    f"for name in {DEFERRED!r} if hasattr(module, name)}}"
)


def test_a_resources_servers_start_up_builds_no_validator_of_the_responses_types():
    built = worker_imports("counter", "resources_servers", "example_session_state_mgmt", {"num_workers": 4}, PROBE)

    assert "/verify" in built["paths"]
    assert built["probe"] == dict.fromkeys(DEFERRED, False)


@pytest.mark.parametrize("model", [BaseRunRequest, BaseVerifyRequest, NeMoGymResponseCreateParamsNonStreaming, NeMoGymResponseCreateParams])
def test_a_deferred_model_validates_and_refuses_on_first_use_as_a_built_one(model):
    params = {"input": "count"}
    good = params if issubclass(model, NeMoGymResponseCreateParamsNonStreaming) else {"responses_create_params": params, "response": new_response().model_dump(mode="json")}
    bad = {**params, "no_such_parameter": 1} if good is params else {**good, "responses_create_params": {**params, "no_such_parameter": 1}}

    assert model.model_validate(good).model_dump(exclude_unset=True, mode="json") == good
    with pytest.raises(ValidationError, match="no_such_parameter"):
        model.model_validate(bad)
    assert model.__pydantic_complete__
    assert model.model_json_schema()["type"] == "object"


@pytest.mark.anyio
async def test_the_first_verify_builds_the_validator_without_a_warning_and_validates_as_ever():
    instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"port": gym_config.free_port()}}}})
    app = CounterServer.for_instance("counter", instances).build_app()
    body = {"responses_create_params": {"input": "count"}, "response": new_response().model_dump(mode="json")}
    with warnings.catch_warnings(record=True) as caught:
        async with serving(app, instances["counter"].port) as url, httpx.AsyncClient(base_url=url) as client:
            await client.post("/seed_session", json={"initial_count": 2})
            verified = await client.post("/verify", json={**body, "expected_count": 2})
            await client.post("/seed_session", json={"initial_count": 2})  # the verify ended the session: a new one
            refused = await client.post("/verify", json={**body, "responses_create_params": {"input": "count", "no_such_parameter": 1}})

    assert (verified.status_code, verified.json()["reward"]) == (200, 1.0)
    assert refused.status_code == 422 and "no_such_parameter" in refused.text
    assert [str(warning.message) for warning in caught] == []
