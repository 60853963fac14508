"""vllm_model: a Responses API model server in front of any OpenAI-compatible chat completions server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from fastapi import HTTPException, Request
from pydantic import Field, ValidationInfo, field_validator

from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel
from nemo_gym.config import ServerRef
from nemo_gym.openai_types import (
    EasyInputMessage,
    FunctionCallOutput,
    Response,
    ResponseCreateParams,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from nemo_gym.server import ServerApp


class VLLMModelConfig(SimpleResponsesAPIModel.config_class):
    """Where the chat completions backend is: ``base_url`` (any OpenAI-compatible server) or ``backend_server``."""

    base_url: str | None = None
    # Validated even when absent, so a config that names neither backend is an error at load time.
    backend_server: ServerRef | None = Field(default=None, validate_default=True)
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
    def exactly_one_backend(cls, backend_server: ServerRef | None, info: ValidationInfo) -> ServerRef | None:
        if (backend_server is None) == (info.data.get("base_url") is None):
            raise ValueError(
                "give exactly one of base_url (an OpenAI-compatible URL) and backend_server (a ref to a model server);"
                " a later config file can drop the other by setting it to null"
            )
        return backend_server


class BackendError(ValueError):
    """The backend answered something that is not a chat completion."""


def to_chat_request(body: ResponseCreateParams, model: str) -> dict[str, Any]:
    """Translate a Responses API request into a chat completions request."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    for item in body.input_items():
        if isinstance(item, (EasyInputMessage, ResponseOutputMessage)):
            messages.append({"role": item.role, "content": item.text})
        elif isinstance(item, ResponseFunctionToolCall):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    request: dict[str, Any] = {"model": body.model or model, "messages": messages}
    if body.tools:
        request["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)} for tool in body.tools
        ]
    optional = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_tokens": body.max_output_tokens,
        "tool_choice": body.tool_choice,
        "parallel_tool_calls": body.parallel_tool_calls,
    }
    request.update({key: value for key, value in optional.items() if value is not None})
    return request


def from_chat_response(data: Any, model: str) -> Response:
    """Translate a chat completion into a Responses API response; refuse anything else."""
    try:
        message = data["choices"][0]["message"]
        output: list[Any] = []
        if message.get("content"):
            output.append(ResponseOutputMessage(content=[ResponseOutputText(text=message["content"])]))
        for call in message.get("tool_calls") or []:
            function = call["function"]
            output.append(
                ResponseFunctionToolCall(
                    call_id=call["id"], id=f"fc_{call['id']}", name=function["name"], arguments=function["arguments"], status="completed"
                )
            )
        return Response(model=data.get("model", model), output=output, usage=data.get("usage"))
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as error:
        raise BackendError(f"not a chat completion ({error!r}): {json.dumps(data)[:500]}") from None


class VLLMModel(SimpleResponsesAPIModel):
    config_class = VLLMModelConfig
    config: VLLMModelConfig

    @property
    def base_url(self) -> str:
        if self.config.base_url:
            return self.config.base_url.rstrip("/")
        if self.config.backend_server:
            return f"{self.instances[self.config.backend_server.name].url}/v1"
        raise ValueError(f"{self.name}: set base_url or backend_server")

    async def responses(self, request: Request, body: ResponseCreateParams) -> Response:
        url = f"{self.base_url}/chat/completions"
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else None
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_seconds)
        try:
            async with self.server_client.session().post(
                url, json=to_chat_request(body, self.config.model), headers=headers, timeout=timeout
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
            return from_chat_response(json.loads(text), self.config.model)
        except (ValueError, BackendError) as error:
            raise HTTPException(502, f"model backend {url} answered garbage: {error}") from None


app = ServerApp(VLLMModel)
