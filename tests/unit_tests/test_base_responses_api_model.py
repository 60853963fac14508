"""nemo_gym.base_responses_api_model: a model server answers under a rollout's prefix as upstream's does."""

from __future__ import annotations

import httpx
import pytest
from fastapi import Body, Request
from omegaconf import OmegaConf

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.server_utils import ServerClient
from tests.unit_tests.in_process_server import serving


def reply_saying(text: str) -> NeMoGymResponse:
    message = {"id": "m", "type": "message", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return NeMoGymResponse.model_validate(
        {"id": "r", "created_at": 1.0, "model": "m", "object": "response", "output": [message], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    )


class EchoModel(SimpleResponsesAPIModel):
    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        return reply_saying(f"{request.url.path} {current_rollout_id()}")


class BodyOnlyModel(SimpleResponsesAPIModel):
    """Upstream's openai_model and litellm_model shape: ``responses(self, body)``, no request."""

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        return reply_saying(f"echo {body.input}")


def model_server(server_class: type[SimpleResponsesAPIModel]) -> SimpleResponsesAPIModel:
    config = BaseResponsesAPIModelConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="policy")
    return server_class(config=config, server_client=ServerClient(global_config_dict=OmegaConf.create({})))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "seen"),
    [
        ("/v1/responses", "/v1/responses None"),
        ("/ng-rollout/3-1/v1/responses", "/v1/responses 3-1"),
        ("/ng-rollout/3-1/training-token-capture/v1/responses", "/v1/responses 3-1"),
    ],
)
async def test_a_model_server_answers_under_a_rollout_prefix_with_or_without_the_capture_segment(path, seen):
    async with serving(model_server(EchoModel).setup_webserver()) as url, httpx.AsyncClient(base_url=url) as client:
        reply = await client.post(path, json={"input": "hi"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["output"][0]["content"][0]["text"] == seen


@pytest.mark.anyio
async def test_a_model_server_whose_responses_takes_the_body_alone_answers_as_upstreams_does():
    async with serving(model_server(BodyOnlyModel).setup_webserver()) as url, httpx.AsyncClient(base_url=url) as client:
        plain = await client.post("/v1/responses", json={"input": "hi"})
        streamed = await client.post("/v1/responses", json={"input": "hi", "stream": True})
    assert plain.status_code == 200, plain.text
    assert plain.json()["output"][0]["content"][0]["text"] == "echo hi"
    assert streamed.status_code == 200 and "event: response.completed" in streamed.text
