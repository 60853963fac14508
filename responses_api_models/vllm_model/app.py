"""vllm_model: a Responses API model server in front of any OpenAI-compatible chat completions server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from fastapi import HTTPException, Request
from pydantic import Field, ValidationInfo, field_validator

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import is_nemo_gym_fastapi_entrypoint
from responses_api_models.vllm_model.converter import BackendError, UnsupportedInput, from_chat_response, to_chat_request


class VLLMModelConfig(BaseResponsesAPIModelConfig):
    """Where the chat completions backend is: ``base_url`` (any OpenAI-compatible server) or ``backend_server``."""

    base_url: str | None = None
    # Validated even when absent, so a config that names neither backend is an error at load time.
    backend_server: ModelServerRef | None = Field(default=None, validate_default=True)
    model: str = "default"
    api_key: str | None = None
    timeout_seconds: float = Field(default=120.0, gt=0)
    # Keys of upstream NeMo Gym's vllm_model, accepted so that its configs load unchanged; this server does not act on them.
    return_token_id_information: bool = False
    uses_reasoning_parser: bool = False
    uses_interleaved_reasoning: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    sampling_overrides: dict[str, Any] | None = None
    extra_body: dict[str, Any] | None = None
    default_headers: dict[str, str] | None = None
    replace_developer_role_with_system: bool = False
    is_responses_native: bool = False
    use_completions_api: bool = False
    render_chat_template: bool = False
    request_prompt_and_generation_token_ids: bool = False
    sequential_reasoning_allowed: bool = False

    @field_validator("backend_server")
    @classmethod
    def exactly_one_backend(cls, backend_server: ModelServerRef | None, info: ValidationInfo) -> ModelServerRef | None:
        if (backend_server is None) == (info.data.get("base_url") is None):
            raise ValueError(
                "give exactly one of base_url (an OpenAI-compatible URL) and backend_server (a ref to a model server);"
                " a later config file can drop the other by setting it to null"
            )
        return backend_server


class VLLMModel(SimpleResponsesAPIModel):
    config: VLLMModelConfig

    @property
    def base_url(self) -> str:
        if self.config.base_url:
            return self.config.base_url.rstrip("/")
        if self.config.backend_server:
            return f"{self.instances[self.config.backend_server.name].url}/v1"
        raise ValueError(f"{self.name}: set base_url or backend_server")

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        try:
            chat_request = to_chat_request(body, self.config.model)
        except UnsupportedInput as error:
            raise HTTPException(400, str(error)) from None
        url = f"{self.base_url}/chat/completions"
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else None
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_seconds)
        try:
            async with self.server_client.session().post(
                url, json=chat_request.model_dump(exclude_none=True), headers=headers, timeout=timeout
            ) as reply:
                # Bytes that are not UTF-8 are garbage like any other: decoded leniently, refused as JSON below.
                text = (await reply.read()).decode("utf-8", errors="replace")
        except (asyncio.TimeoutError, TimeoutError):
            raise HTTPException(504, f"model backend {url} did not answer within {self.config.timeout_seconds} s") from None
        except aiohttp.ClientError as error:
            raise HTTPException(502, f"model backend {url} is unreachable: {error}") from None
        if reply.status != 200:
            raise HTTPException(502, f"model backend {url} answered {reply.status}: {text[:500]}")
        try:
            return from_chat_response(json.loads(text), body)
        except (ValueError, BackendError) as error:
            raise HTTPException(502, f"model backend {url} answered garbage: {error}") from None



if __name__ == "__main__":
    VLLMModel.run_webserver()
elif is_nemo_gym_fastapi_entrypoint(__file__):
    app = VLLMModel.run_webserver()
