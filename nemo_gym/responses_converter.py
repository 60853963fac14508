"""Upstream's shared Responses <-> Chat Completions converter, ``ResponsesConverter`` (alias ``VLLMConverter``).

Requests: the Responses input becomes chat messages. The items of one assistant turn (reasoning,
text, function calls) become one assistant message, its reasoning inline as ``<think>...</think>``
before its text, with the turn's token ids when ``return_token_id_information``. ``instructions`` and
the leading system/developer messages become one system message. An item with no chat counterpart
is refused, naming its type. Replies: ``<think>`` spans in the content become a reasoning item (with
``uses_reasoning_parser``), then the text, then the calls; the last item carries the token ids.

This project's own vllm_model keeps its converter (responses_api_models/vllm_model/converter.py),
which makes other choices (reasoning fields, images, ``response_format``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Optional
from uuid import uuid4

from pydantic import BaseModel, Field

from nemo_gym.openai_utils import (
    REQUIRED_TOKEN_METADATA_FIELDS,
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChoice,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputText,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymResponseUsage,
    NeMoGymSummary,
    TokenIDLogProbMixin,
)

TRAINING_VARIANTS = {
    NeMoGymResponseOutputMessage: NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseFunctionToolCall: NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseReasoningItem: NeMoGymResponseReasoningItemForTraining,
}
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}
# Items that open the model's own generation; what comes before the first of them is replayed prompt.
# Client-supplied results (``*_output``, approvals) never open it; an assistant message does.
GENERATED_ITEM_TYPES = frozenset(
    """code_interpreter_call computer_call custom_tool_call file_search_call function_call image_generation_call
    local_shell_call mcp_approval_request mcp_call mcp_list_tools reasoning web_search_call""".split()
)


def _count(value: Any) -> Optional[int]:
    return value if type(value) is int and value >= 0 else None


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def _usage_detail(usage: Any, detail_group: str, detail_name: str, *top_level_aliases: str) -> Optional[int]:
    """A token count from ``usage.<group>.<name>``, else the first alias at the top level that holds one; never a made-up 0."""
    nested = _count(_get(_get(usage, detail_group), detail_name))
    if nested is not None:
        return nested
    return next((count for count in (_count(_get(usage, alias)) for alias in top_level_aliases) if count is not None), None)


def _token_information(mapping: dict[str, Any]) -> Optional[TokenIDLogProbMixin]:
    """The token ids a message carries: all three, or none (a ValueError naming what is missing)."""
    present = {key for key in REQUIRED_TOKEN_METADATA_FIELDS if mapping.get(key) is not None}
    if not present:
        return None
    if present != REQUIRED_TOKEN_METADATA_FIELDS:
        raise ValueError(f"token metadata is all or none: missing {', '.join(sorted(REQUIRED_TOKEN_METADATA_FIELDS - present))}")
    return TokenIDLogProbMixin.model_validate(mapping)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


class ResponsesConverterState(BaseModel):
    """The chat messages made so far, and the assistant turn being gathered."""

    return_token_id_information: bool
    messages: list[dict[str, Any]] = Field(default_factory=list)
    content_buffer: str = ""
    tool_calls_buffer: list[dict[str, Any]] = Field(default_factory=list)
    assistant_item_buffered: bool = False
    token_information: Optional[TokenIDLogProbMixin] = None

    def flush_assistant(self) -> None:
        """End the assistant turn being gathered, as one message (none if it holds nothing)."""
        if self.assistant_item_buffered or self.content_buffer or self.tool_calls_buffer:
            message: dict[str, Any] = {"role": "assistant", "content": self.content_buffer or None}
            if self.tool_calls_buffer:  # never an empty list: OpenAI refuses one
                message["tool_calls"] = self.tool_calls_buffer
            if self.return_token_id_information and self.token_information is not None:
                message.update(self.token_information.model_dump(exclude_none=True))
            self.messages.append(message)
        self.content_buffer, self.tool_calls_buffer, self.assistant_item_buffered, self.token_information = "", [], False, None


class ResponsesConverter(BaseModel):
    return_token_id_information: bool
    uses_reasoning_parser: bool = True

    THINK_TAG_PATTERN: ClassVar[re.Pattern[str]] = re.compile(r"<think>(.*?)</think>", re.DOTALL)

    @staticmethod
    def _wrap_reasoning_in_think_tags(texts: list[str]) -> str:
        return "".join(f"<think>{text}</think>" for text in texts if text)

    @classmethod
    def _parse_think_tags(cls, content: str) -> tuple[list[str], str]:
        return cls.THINK_TAG_PATTERN.findall(content), cls.THINK_TAG_PATTERN.sub("", content)

    def _extract_reasoning_from_content(self, content: str) -> tuple[list[str], str]:
        return self._parse_think_tags(content)

    # --- Responses request -> chat completions request

    def responses_to_chat_completion_create_params(
        self, responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymChatCompletionCreateParamsNonStreaming:
        fields = responses_create_params.model_dump(mode="json", exclude_unset=True)
        state = ResponsesConverterState(return_token_id_information=self.return_token_id_information)
        given = fields.pop("input")
        items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": given}]}] if isinstance(given, str) else given
        for item in items:
            self._add_item(item, state)
        state.flush_assistant()

        instructions = fields.pop("instructions", None)
        if instructions:
            leading = [instructions]
            while state.messages and state.messages[0]["role"] in ("system", "developer"):
                leading.append(_text(state.messages.pop(0)["content"]))
            state.messages.insert(0, {"role": "system", "content": "\n\n".join(leading)})
        if fields.get("max_output_tokens") is not None:
            fields["max_tokens"] = fields.pop("max_output_tokens")
        reasoning = fields.pop("reasoning", None) or {}
        if reasoning.get("effort") is not None:
            fields["reasoning_effort"] = reasoning["effort"]
        tools = fields.pop("tools", None)
        if tools:
            fields["tools"] = [{"type": "function", "function": {k: v for k, v in tool.items() if k not in ("type", "strict")}} for tool in tools]
        else:
            if fields.get("tool_choice") == "required":
                raise ValueError("tool_choice='required' requires at least one tool")
            fields.pop("tool_choice", None)
            fields.pop("parallel_tool_calls", None)
        return NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({"messages": state.messages, **fields})

    def _add_item(self, item: dict[str, Any], state: ResponsesConverterState) -> None:
        kind = item.get("type") or ("message" if item.get("role") else None)
        if kind == "message" and item["role"] == "assistant":
            state.assistant_item_buffered = True
            state.content_buffer += _text(item.get("content"))
        elif kind == "message":
            state.flush_assistant()
            state.messages.append({"role": item["role"], "content": self._chat_content(item["content"])})
        elif kind == "reasoning":
            state.assistant_item_buffered = True
            state.content_buffer += self._wrap_reasoning_in_think_tags([part["text"] for part in item.get("summary") or []])
        elif kind == "function_call":
            state.assistant_item_buffered = True
            function = {"name": item["name"], "arguments": item["arguments"]}
            state.tool_calls_buffer.append({"id": item["call_id"], "type": "function", "function": function})
        elif kind == "function_call_output":
            state.flush_assistant()
            state.messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": self._tool_content(item)})
        else:
            raise NotImplementedError(
                f"{kind!r} has no Chat Completions representation, so this rollout cannot be converted: "
                "send it to a model server that takes Responses as they are"
            )
        if self.return_token_id_information:
            information = _token_information(item)
            if information is not None:
                state.token_information = information

    @staticmethod
    def _chat_content(content: Any) -> Any:
        if isinstance(content, str):
            return content
        parts = []
        for part in content:
            if part["type"] == "input_text":
                parts.append({"type": "text", "text": part["text"]})
            elif part["type"] == "input_image" and part.get("image_url"):
                parts.append({"type": "image_url", "image_url": {"url": part["image_url"], "detail": part.get("detail") or "auto"}})
            else:
                raise NotImplementedError(f"a {part['type']!r} content part has no Chat Completions form here")
        return parts

    @staticmethod
    def _tool_content(item: dict[str, Any]) -> Any:
        output = item["output"]
        if isinstance(output, str):
            return output
        unsupported = sorted({part.get("type", "<missing>") for part in output if part.get("type") != "input_text"})
        if unsupported:
            raise NotImplementedError(f"the output of call {item['call_id']!r} has part type(s) a chat tool message cannot hold: {unsupported}")
        return [{"type": "text", "text": part["text"]} for part in output]

    # --- chat completion -> Responses output

    def postprocess_chat_response(self, choice: NeMoGymChoice) -> list[Any]:
        return self.postprocess_assistant_message_dict(choice.message.model_dump(exclude_none=True))

    def postprocess_assistant_message_dict(self, message_dict: dict[str, Any]) -> list[Any]:
        content = message_dict.get("content") or ""
        thoughts, content = self._extract_reasoning_from_content(content) if self.uses_reasoning_parser else ([], content)
        output: list[Any] = []
        if thoughts:
            summary = [NeMoGymSummary(text=text, type="summary_text") for text in thoughts]
            output.append(NeMoGymResponseReasoningItem(id=f"rs_{uuid4().hex}", type="reasoning", summary=summary, status="completed"))
        calls = message_dict.get("tool_calls") or []
        if content or not (output or calls):
            text = NeMoGymResponseOutputText(type="output_text", text=content, annotations=[])
            output.append(
                NeMoGymResponseOutputMessage(id=f"msg_{uuid4().hex}", role="assistant", content=[text], status="completed", type="message")
            )
        for call in calls:
            function = call["function"]
            output.append(
                NeMoGymResponseFunctionToolCall(
                    id=call["id"], call_id=call["id"], name=function["name"], arguments=function["arguments"], type="function_call", status="completed"
                )
            )
        information = _token_information(message_dict) if self.return_token_id_information else None
        if information is not None:
            last = output[-1]
            output[-1] = TRAINING_VARIANTS[type(last)](**last.model_dump(), **information.model_dump(exclude_none=True))
        return output

    def chat_completion_to_response(
        self, responses_create_params: NeMoGymResponseCreateParamsNonStreaming, chat_completion: NeMoGymChatCompletion
    ) -> NeMoGymResponse:
        choice = chat_completion.choices[0]
        usage = None
        if chat_completion.usage:
            counted = chat_completion.usage
            cached = _usage_detail(counted, "prompt_tokens_details", "cached_tokens", "cached_input_tokens", "cache_read_input_tokens")
            reasoning = _usage_detail(counted, "completion_tokens_details", "reasoning_tokens", "reasoning_output_tokens")
            usage = NeMoGymResponseUsage(
                input_tokens=counted.prompt_tokens,
                input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=cached),
                output_tokens=counted.completion_tokens,
                output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=reasoning),
                # A provider's total may be counted otherwise than prompt + completion.
                total_tokens=counted.total_tokens,
            )
        reason = INCOMPLETE_REASONS.get(choice.finish_reason)
        request = responses_create_params
        echoed = ("tools", "temperature", "top_p", "background", "max_output_tokens", "max_tool_calls", "previous_response_id", "prompt")
        echoed += ("reasoning", "service_tier", "text", "top_logprobs", "truncation", "metadata", "instructions", "user")
        return NeMoGymResponse.model_validate(
            {
                **{key: getattr(request, key) for key in echoed},
                "id": f"resp_{uuid4().hex}",
                "created_at": chat_completion.created,
                "model": request.model,
                "object": "response",
                "output": [item.model_dump() for item in self.postprocess_chat_response(choice)],
                "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
                "parallel_tool_calls": request.parallel_tool_calls,
                "status": "incomplete" if reason else "completed",
                "incomplete_details": {"reason": reason} if reason else None,
                "usage": usage,
            }
        )


def split_responses_input_output_items(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """(replayed prompt, generated segment): cut before the first assistant message or generated item."""
    for index, item in enumerate(items):
        kind = getattr(item, "type", None)
        if (kind == "message" and getattr(item, "role", None) == "assistant") or kind in GENERATED_ITEM_TYPES:
            return list(items[:index]), list(items[index:])
    return list(items), []


VLLMConverter = ResponsesConverter
VLLMConverterResponsesToChatCompletionsState = ResponsesConverterState
