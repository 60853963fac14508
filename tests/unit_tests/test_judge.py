"""judge_failsafe: a failed judge is a 200 row with reward 0.0 marked judge_failed, not a 500."""

from __future__ import annotations

import pytest
from fastapi import Request

from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer
from nemo_gym.client import ServerClient
from nemo_gym.judge import run_judge
from nemo_gym.openai_utils import new_response
from tests.unit_tests.in_process_server import serving

NAME = "judged"
VERIFY_BODY = {"responses_create_params": {"input": "2+2?"}, "response": new_response().model_dump(mode="json"), "question_id": 7}


class JudgedServer(SimpleResourcesServer):
    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        if body.model_extra.get("question_id") == 7:
            await run_judge(self.unreachable_judge())
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)

    async def unreachable_judge(self) -> None:
        raise ConnectionRefusedError("judge at 127.0.0.1:9 refused")


@pytest.fixture
async def client():
    instances = gym_config.parse({NAME: {"resources_servers": {"example_session_state_mgmt": {"port": gym_config.free_port()}}}})
    client = ServerClient(instances)
    async with serving(JudgedServer.for_instance(NAME, instances).build_app(), instances[NAME].port):
        yield client
    await client.close()


@pytest.mark.anyio
async def test_a_judge_error_in_verify_is_a_200_row_with_reward_zero_marked_judge_failed(client):
    reply = await client.post(NAME, "/verify", json=VERIFY_BODY)
    assert reply.status == 200
    assert reply.body["reward"] == 0.0
    assert reply.body["_ng_failure_class"] == "judge_failed"
    assert reply.body["_ng_failure_judge_error"] == "ConnectionRefusedError: judge at 127.0.0.1:9 refused"
    assert reply.body["question_id"] == 7 and reply.body["responses_create_params"]["input"] == "2+2?"
    assert reply.cookies  # the session survives, as on every reply


@pytest.mark.anyio
async def test_a_verify_without_judge_error_is_untouched(client):
    reply = await client.post(NAME, "/verify", json={**VERIFY_BODY, "question_id": 8})
    assert (reply.status, reply.body["reward"], "_ng_failure_class" in reply.body) == (200, 1.0, False)
