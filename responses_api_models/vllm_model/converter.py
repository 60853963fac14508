"""Responses API requests to chat completions requests, and chat completions back to Responses API responses.

What a chat backend has no counterpart for is left out: hosted tools (only function tools go on),
non-message items of the input other than function calls, their outputs and reasoning, and the
parameters about OpenAI's own hosting (``store``, ``previous_response_id``, ``truncation``, ``include``, ...).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ValidationError

from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
    NeMoGymResponseReasoningItem,
    new_id,
    new_response,
    response_usage,
)

# Why a chat completion stopped early -> why the response is incomplete.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}

# How past reasoning items go back to the backend: as vLLM's reasoning fields of the assistant message
# they preceded, inline in its content between <think> tags, or not at all.
PastReasoning = Literal["fields", "inline", "drop"]


class BackendError(ValueError):
    """The backend answered something that is not a chat completion."""


class UnsupportedInput(ValueError):
    """The request holds something a chat completions backend cannot be given."""


def chat_content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    """Message content for chat: text alone stays a string; with images or files, a list of chat content parts."""
    if isinstance(content, str):
        return content
    if all(part.type == "input_text" for part in content):
        return "".join(part.text for part in content)
    return [chat_part(part) for part in content]


def chat_part(part: Any) -> dict[str, Any]:
    if part.type == "input_text":
        return {"type": "text", "text": part.text}
    if part.type == "input_image":
        if not part.image_url:
            raise UnsupportedInput("an input_image needs image_url (a URL or a data: URL) to reach a chat completions backend")
        image = {"url": part.image_url, **({"detail": part.detail} if part.detail in ("low", "high", "auto") else {})}
        return {"type": "image_url", "image_url": image}
    file = {key: getattr(part, key) for key in ("file_data", "file_id", "filename") if getattr(part, key)}
    return {"type": "file", "file": file}


def said(message: NeMoGymResponseOutputMessage) -> str:
    return "".join(part.text if part.type == "output_text" else part.refusal for part in message.content)


def assistant_turn(content: str | None, thoughts: list[str], past_reasoning: PastReasoning) -> dict[str, Any]:
    """An assistant message with the reasoning that preceded it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thoughts and past_reasoning == "fields":
        # vLLM before 0.16 reads reasoning_content, later versions reasoning.
        message["reasoning_content"] = message["reasoning"] = "\n".join(thoughts)
    elif thoughts and past_reasoning == "inline":
        message["content"] = "".join(f"<think>{thought}</think>" for thought in thoughts) + (content or "")
    return message


def chat_messages(
    body: NeMoGymResponseCreateParamsNonStreaming, developer_as_system: bool = False, past_reasoning: PastReasoning = "drop"
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    thoughts: list[str] = []  # reasoning summaries waiting for the assistant turn they preceded
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    for item in [*body.input_items(), None]:
        if isinstance(item, NeMoGymResponseReasoningItem):
            thoughts += [part.text for part in item.summary]
            continue
        if isinstance(item, NeMoGymResponseOutputMessage):
            messages.append(assistant_turn(said(item), thoughts, past_reasoning))
        elif isinstance(item, NeMoGymResponseFunctionToolCall):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if messages and messages[-1]["role"] == "assistant" and not thoughts:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({**assistant_turn(None, thoughts, past_reasoning), "tool_calls": [call]})
        elif thoughts and past_reasoning != "drop":
            # A turn of reasoning alone, followed by no assistant message or call (None ends the input).
            messages.append(assistant_turn("", thoughts, past_reasoning))
        if isinstance(item, NeMoGymEasyInputMessage):
            role = "system" if developer_as_system and item.role == "developer" else item.role
            messages.append({"role": role, "content": chat_content(item.content)})
        elif isinstance(item, NeMoGymFunctionCallOutput):
            output = item.output if isinstance(item.output, str) else "".join(getattr(part, "text", "") for part in item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        thoughts = []
    return messages


def response_format(body: NeMoGymResponseCreateParamsNonStreaming) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``; plain text needs none."""
    form = body.text.format if body.text else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_schema":
        schema = {"name": form.name, "schema": form.schema_, "strict": form.strict, "description": form.description}
        return {"type": "json_schema", "json_schema": {key: value for key, value in schema.items() if value is not None}}
    return {"type": form.type}


def to_chat_request(
    body: NeMoGymResponseCreateParamsNonStreaming,
    model: str,
    developer_as_system: bool = False,
    past_reasoning: PastReasoning = "drop",
) -> NeMoGymChatCompletionCreateParamsNonStreaming:
    """Translate a Responses API request into a chat completions request."""
    request: dict[str, Any] = {"model": body.model or model, "messages": chat_messages(body, developer_as_system, past_reasoning)}
    tools = [
        {"type": "function", "function": tool.model_dump(include={"name", "description", "parameters", "strict"}, exclude_none=True)}
        for tool in body.tools
        if tool.type == "function"
    ]
    if tools:
        choice = body.tool_choice
        request["tools"] = tools
        request["parallel_tool_calls"] = body.parallel_tool_calls
        if isinstance(choice, str):
            request["tool_choice"] = choice
        elif choice.type == "function":
            request["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    optional = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_tokens": body.max_output_tokens,
        "reasoning_effort": body.reasoning.effort if body.reasoning else None,
        "response_format": response_format(body),
        "user": body.user,
    }
    request.update({key: value for key, value in optional.items() if value is not None})
    return NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(request)


def from_chat_response(data: Any, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
    """Translate a chat completion into the response to ``body``; refuse anything else."""
    try:
        completion = NeMoGymChatCompletion.model_validate(data)
        choice = completion.choices[0]
    except (ValidationError, IndexError) as error:
        raise BackendError(f"not a chat completion ({error!r}): {json.dumps(data)[:500]}") from None
    message = choice.message
    output: list[Any] = []
    reasoning = message.reasoning_content or message.reasoning
    if reasoning:
        summary = [{"type": "summary_text", "text": reasoning}]
        output.append(NeMoGymResponseReasoningItem(id=new_id("rs"), summary=summary, status="completed"))
    parts = [NeMoGymResponseOutputText(text=message.content)] if message.content else []
    parts += [{"type": "refusal", "refusal": message.refusal}] if message.refusal else []
    if parts:
        output.append(NeMoGymResponseOutputMessage(content=parts))
    for call in message.tool_calls or []:
        function = call.function
        output.append(
            NeMoGymResponseFunctionToolCall(
                call_id=call.id, id=f"fc_{call.id}", name=function.name, arguments=function.arguments, status="completed"
            )
        )
    fields: dict[str, Any] = {"model": completion.model, "output": output}
    if choice.finish_reason in INCOMPLETE_REASONS:
        fields.update(status="incomplete", incomplete_details={"reason": INCOMPLETE_REASONS[choice.finish_reason]})
    if completion.usage is not None:
        counted = completion.usage
        cached = counted.prompt_tokens_details.cached_tokens if counted.prompt_tokens_details else None
        reasoning = counted.completion_tokens_details.reasoning_tokens if counted.completion_tokens_details else None
        fields["usage"] = response_usage(counted.prompt_tokens, counted.completion_tokens, cached or 0, reasoning or 0)
    return new_response(body, **fields)
