"""nemo_gym.judge: a failed judge call is a JudgeError, and judge_failsafe makes it a 200 row with reward 0.0 marked judge_failed, not a 500."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, HTTPException, Request
from omegaconf import OmegaConf
from pydantic import BaseModel

from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer
from nemo_gym.client.reading import ReadingClient
from nemo_gym.judge import JudgeError, call_judge, reraise_judge_errors
from nemo_gym.openai_utils import new_response
from nemo_gym.server_utils import ServerClient
from tests.unit_tests.in_process_server import serving

NAME = "judged"
VERIFY_BODY = {"responses_create_params": {"input": "2+2?"}, "response": new_response().model_dump(mode="json"), "question_id": 7}


class JudgedServer(SimpleResourcesServer):
    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        if body.model_extra.get("question_id") == 7:
            await reraise_judge_errors(self.unreachable_judge())
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)

    async def unreachable_judge(self) -> None:
        raise ConnectionRefusedError("judge at 127.0.0.1:9 refused")


@pytest.fixture
async def client():
    instances = gym_config.parse({NAME: {"resources_servers": {"example_session_state_mgmt": {"port": gym_config.free_port()}}}})
    client = ReadingClient(instances)
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


class Verdict(BaseModel):
    verdict: str


def judge_model_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/responses")
    async def judge(body: dict) -> dict:
        if body.get("input") == "overloaded":
            raise HTTPException(503, "judge overloaded")
        if body.get("input") == "odd":
            return {"no_verdict": True}
        return {"verdict": f"[[A]] for {body['input']}"}

    return app


@pytest.fixture
async def judge_client():
    port = gym_config.free_port()
    config = {"judge_model": {"responses_api_models": {"x": {"host": "127.0.0.1", "port": port}}}}
    client = ServerClient(global_config_dict=OmegaConf.create(config))
    async with serving(judge_model_app(), port):
        yield client
    await client.close()


async def ask(client: ServerClient, text: str) -> Verdict:
    return await call_judge(client, server_name="judge_model", url_path="/v1/responses", json={"input": text}, response_model=Verdict)


@pytest.mark.anyio
async def test_call_judge_posts_to_the_judge_instance_and_returns_its_reply_as_the_response_model(judge_client):
    assert await ask(judge_client, "2+2=4") == Verdict(verdict="[[A]] for 2+2=4")


@pytest.mark.anyio
async def test_call_judge_reports_an_error_status_as_a_judge_error_naming_the_status_not_a_validation_error(judge_client):
    with pytest.raises(JudgeError, match=r"^ClientResponseError: 503, message='Service Unavailable'") as raised:
        await ask(judge_client, "overloaded")
    assert b"judge overloaded" in raised.value.__cause__.response_content


@pytest.mark.anyio
async def test_call_judge_reports_a_reply_that_is_not_the_response_model_as_a_judge_error(judge_client):
    with pytest.raises(JudgeError, match=r"^ValidationError: "):
        await ask(judge_client, "odd")


@pytest.mark.anyio
async def test_call_judge_reports_an_unreachable_judge_as_a_judge_error():
    config = {"judge_model": {"responses_api_models": {"x": {"host": "127.0.0.1", "port": gym_config.free_port()}}}}
    client = ServerClient(global_config_dict=OmegaConf.create(config))
    with pytest.raises(JudgeError, match=r"^ClientConnectorError: "):
        await ask(client, "anyone?")
    await client.close()


@pytest.mark.anyio
async def test_reraise_judge_errors_passes_a_judge_error_through_unwrapped():
    async def fails() -> None:
        raise JudgeError("already a judge error")

    with pytest.raises(JudgeError, match="^already a judge error$"):
        await reraise_judge_errors(fails())
