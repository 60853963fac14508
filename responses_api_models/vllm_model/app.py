"""vllm_model: a Responses API model server in front of any OpenAI-compatible chat completions server."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

import aiohttp
from fastapi import HTTPException, Request
from pydantic import Field, ValidationInfo, field_validator

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming, NeMoGymResponseReasoningItem, new_response
from nemo_gym.server_utils import is_nemo_gym_fastapi_entrypoint
from responses_api_models.vllm_model.converter import PastReasoning, UnsupportedInput, from_chat_response, to_chat_request

# Upstream keys this server cannot act on, and why: refused when true, so that no config believes it took effect.
REFUSED_WHEN_TRUE = {
    "return_token_id_information": "token ids and log probs need vLLM's own extensions (return_tokens_as_token_ids,"
    " prompt token ids) and the training item types, which this server does not produce; set it to false",
    "use_completions_api": "this server sends chat to /v1/chat/completions (or, with is_responses_native, /v1/responses);"
    " it does not render prompts for /v1/completions; set it to false",
}
# Upstream keys that is_responses_native cannot honour, with the value they must keep.
NOT_WITH_RESPONSES_NATIVE = {"replace_developer_role_with_system": False, "sequential_reasoning_allowed": True}


class VLLMModelConfig(BaseResponsesAPIModelConfig):
    """Where the chat completions backend is (``base_url``, any OpenAI-compatible server, or ``backend_server``), and
    upstream vllm_model's keys, each either honoured or refused at load:

    - ``default_headers``: sent on every backend request; an ``Authorization`` among them replaces the
      ``Bearer <api_key>`` one.
    - ``extra_body``: merged into every backend request under the request's own fields (a field the request
      sets keeps the request's value).
    - ``chat_template_kwargs``: sent as vLLM's ``chat_template_kwargs`` field.
    - A request's ``metadata`` may carry ``extra_body`` and ``chat_template_kwargs`` as JSON object strings
      (task rows do, e.g. per-sample thinking on or off); they update the config's for that request.
    - ``sampling_overrides``: set on every backend request last, over the request, ``extra_body`` and the
      metadata; keys are the backend's (``temperature``, ``top_p``, ``max_tokens``, ``top_k``, ...).
    - ``replace_developer_role_with_system``: ``developer`` messages go to the backend as ``system``.
    - ``uses_reasoning_parser`` (default true): the backend splits reasoning out (vLLM's ``reasoning_content`` or
      ``reasoning`` field, which become a reasoning item whatever this key says). With
      ``uses_interleaved_reasoning`` (default true) past reasoning items go back in those two fields of the
      assistant message they preceded, without it they are left out. With ``uses_reasoning_parser: false``
      past reasoning goes back inline, ``<think>...</think>`` before that message's text.
    - ``sequential_reasoning_allowed: false``: a request whose input ends with reasoning (the model's last turn
      was reasoning alone) is answered without calling the backend, with an ``incomplete`` response
      (reason ``content_filter``).
    - ``is_responses_native``: the request goes unconverted to the backend's ``/v1/responses``, with the keys
      above except the role replacement and ``sequential_reasoning_allowed: false`` (refused with it) and the
      reasoning keys (the backend handles reasoning).
    - ``return_token_id_information`` and ``use_completions_api``: refused when true (``REFUSED_WHEN_TRUE``).
      ``request_prompt_and_generation_token_ids`` and ``render_chat_template`` are consulted only with one of
      them, as upstream does, so they load and change nothing.
    """

    base_url: str | None = None
    # Validated even when absent, so a config that names neither backend is an error at load time.
    backend_server: ModelServerRef | None = Field(default=None, validate_default=True)
    model: str = "default"
    api_key: str | None = None
    timeout_seconds: float = Field(default=120.0, gt=0)
    # Before the keys checked against it.
    is_responses_native: bool = False
    default_headers: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    sampling_overrides: dict[str, Any] | None = None
    replace_developer_role_with_system: bool = False
    uses_reasoning_parser: bool = True
    uses_interleaved_reasoning: bool = True
    sequential_reasoning_allowed: bool = True
    return_token_id_information: bool = False
    use_completions_api: bool = False
    request_prompt_and_generation_token_ids: bool = False
    render_chat_template: bool = False

    @field_validator("backend_server")
    @classmethod
    def exactly_one_backend(cls, backend_server: ModelServerRef | None, info: ValidationInfo) -> ModelServerRef | None:
        if (backend_server is None) == (info.data.get("base_url") is None):
            raise ValueError(
                "give exactly one of base_url (an OpenAI-compatible URL) and backend_server (a ref to a model server);"
                " a later config file can drop the other by setting it to null"
            )
        return backend_server

    @field_validator(*REFUSED_WHEN_TRUE)
    @classmethod
    def not_honoured_here(cls, value: bool, info: ValidationInfo) -> bool:
        if value:
            raise ValueError(f"true is not supported by this vllm_model: {REFUSED_WHEN_TRUE[info.field_name]}")
        return value

    @field_validator(*NOT_WITH_RESPONSES_NATIVE)
    @classmethod
    def honoured_only_through_chat(cls, value: bool, info: ValidationInfo) -> bool:
        kept = NOT_WITH_RESPONSES_NATIVE[info.field_name]
        if info.data.get("is_responses_native") and value != kept:
            raise ValueError(
                f"{str(value).lower()} needs the chat completions path; with is_responses_native the request goes to"
                f" the backend unconverted, so set it to {str(kept).lower()}"
            )
        return value

    @property
    def past_reasoning(self) -> PastReasoning:
        if not self.uses_reasoning_parser:
            return "inline"
        return "fields" if self.uses_interleaved_reasoning else "drop"


def row_setting(metadata: dict[str, str] | None, key: str) -> dict[str, Any]:
    """A per-request setting a task row carries in ``metadata`` (whose values are strings): a JSON object."""
    text = (metadata or {}).get(key)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise HTTPException(400, f"metadata.{key} must be a JSON object written as a string, got {text[:200]!r}")
    return value


def ends_in_reasoning(body: NeMoGymResponseCreateParamsNonStreaming) -> bool:
    items = body.input_items()
    return bool(items) and isinstance(items[-1], NeMoGymResponseReasoningItem)


class VLLMModel(SimpleResponsesAPIModel):
    config: VLLMModelConfig

    @property
    def base_url(self) -> str:
        if self.config.base_url:
            return self.config.base_url.rstrip("/")
        if self.config.backend_server:
            return f"{self.instances[self.config.backend_server.name].url}/v1"
        raise ValueError(f"{self.name}: set base_url or backend_server")

    @property
    def headers(self) -> dict[str, str]:
        given = self.config.default_headers
        if self.config.api_key and not any(name.lower() == "authorization" for name in given):
            return {"Authorization": f"Bearer {self.config.api_key}", **given}
        return given

    def backend_body(self, fields: dict[str, Any], metadata: dict[str, str] | None) -> dict[str, Any]:
        """``fields`` as sent: ``extra_body`` under them, ``chat_template_kwargs`` beside them, ``sampling_overrides`` over all."""
        extra_body = {**(self.config.extra_body or {}), **row_setting(metadata, "extra_body")}
        template_kwargs = {**(self.config.chat_template_kwargs or {}), **row_setting(metadata, "chat_template_kwargs")}
        if template_kwargs:
            fields = {**fields, "chat_template_kwargs": template_kwargs}
        return {**extra_body, **fields, **(self.config.sampling_overrides or {})}

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        if self.config.is_responses_native:
            fields = {**body.model_dump(mode="json", exclude_unset=True), "model": body.model or self.config.model}
            return await self.ask_backend("/responses", self.backend_body(fields, body.metadata), NeMoGymResponse.model_validate)
        if not self.config.sequential_reasoning_allowed and ends_in_reasoning(body):
            incomplete = {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}}
            return new_response(body, model=body.model or self.config.model, **incomplete)
        try:
            chat_request = to_chat_request(
                body, self.config.model, self.config.replace_developer_role_with_system, self.config.past_reasoning
            )
        except UnsupportedInput as error:
            raise HTTPException(400, str(error)) from None
        payload = self.backend_body(chat_request.model_dump(exclude_none=True), body.metadata)
        return await self.ask_backend("/chat/completions", payload, lambda data: from_chat_response(data, body))

    async def ask_backend(self, path: str, payload: dict[str, Any], read: Callable[[Any], NeMoGymResponse]) -> NeMoGymResponse:
        """POST ``payload`` to the backend's ``path`` and ``read`` its JSON answer; a backend that fails is a 502 or 504."""
        url = f"{self.base_url}{path}"
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_seconds)
        try:
            async with self.server_client.session().post(url, json=payload, headers=self.headers, timeout=timeout) as reply:
                # Bytes that are not UTF-8 are garbage like any other: decoded leniently, refused as JSON below.
                text = (await reply.read()).decode("utf-8", errors="replace")
        except (asyncio.TimeoutError, TimeoutError):
            raise HTTPException(504, f"model backend {url} did not answer within {self.config.timeout_seconds} s") from None
        except aiohttp.ClientError as error:
            raise HTTPException(502, f"model backend {url} is unreachable: {error}") from None
        if reply.status != 200:
            raise HTTPException(502, f"model backend {url} answered {reply.status}: {text[:500]}")
        try:
            return read(json.loads(text))
        except ValueError as error:
            raise HTTPException(502, f"model backend {url} answered garbage: {error}") from None


if __name__ == "__main__":
    VLLMModel.run_webserver()
elif is_nemo_gym_fastapi_entrypoint(__file__):
    app = VLLMModel.run_webserver()
