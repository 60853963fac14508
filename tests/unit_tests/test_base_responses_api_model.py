"""nemo_gym.base_responses_api_model: a model server answers under a rollout's prefix as upstream's does."""

from __future__ import annotations

import httpx
import pytest
from fastapi import Request
from omegaconf import OmegaConf

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.server_utils import ServerClient
from tests.unit_tests.in_process_server import serving


class EchoModel(SimpleResponsesAPIModel):
    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        text = f"{request.url.path} {current_rollout_id()}"
        message = {"id": "m", "type": "message", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}
        return NeMoGymResponse.model_validate(
            {"id": "r", "created_at": 1.0, "model": "m", "object": "response", "output": [message], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
        )


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
    config = BaseResponsesAPIModelConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="policy")
    model = EchoModel(config=config, server_client=ServerClient(global_config_dict=OmegaConf.create({})))
    async with serving(model.setup_webserver()) as url, httpx.AsyncClient(base_url=url) as client:
        reply = await client.post(path, json={"input": "hi"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["output"][0]["content"][0]["text"] == seen
