"""The OpenAI Responses and Chat Completions types the Gym's servers speak, built on the ``openai`` package's own.

Replies subclass the SDK's models, so a reply that validates here validates as an
``openai.types.responses.Response``. Items keep the SDK's rule of passing unknown keys through (token
ids and other extras travel unchanged); the request body refuses unknown keys, so a typo is an error.
"""

from __future__ import annotations

import time
import typing
import uuid
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Optional, Union

from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.responses import (
    EasyInputMessage,
    FunctionToolParam,
    Response,
    ResponseFunctionToolCall,
    ResponseIncludable,
    ResponseInputFile,
    ResponseInputImage,
    ResponseInputItem,
    ResponseInputText,
    ResponseInputTextParam,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponsePrompt,
    ResponseReasoningItem,
    ResponseTextConfig,
    ResponseUsage,
    Tool,
)
from openai.types.responses.response import ToolChoice
from openai.types.responses.response_function_tool_call_output_item import ResponseFunctionToolCallOutputItem
from openai.types.responses.response_input_item import Message
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from openai.types.shared import Reasoning
from pydantic import BaseModel, ConfigDict, Discriminator, Field, SerializerFunctionWrapHandler, Tag, model_serializer

from nemo_gym.openai_client import RATE_LIMIT_ERROR_CODES, RETRY_ERROR_CODES, NeMoGymAsyncOpenAI  # noqa: F401 (upstream's path)
from nemo_gym.token_metadata import (  # noqa: F401 (upstream's path)
    REQUIRED_TOKEN_METADATA_FIELDS,
    TOKEN_METADATA_FIELDS,
    RoutedExperts,
    TokenIDLogProbMixin,
    carries_token_metadata,
    field_of,
)

ItemStatus = Literal["in_progress", "completed", "incomplete"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class NeMoGymResponseInputImage(ResponseInputImage):
    # The API takes an image without a detail level as "auto".
    detail: Literal["low", "high", "auto", "original"] = "auto"


NeMoGymResponseInputContent = Annotated[
    Union[ResponseInputText, NeMoGymResponseInputImage, ResponseInputFile], Field(discriminator="type")
]


class UnsetPhaseLeftOut(BaseModel):
    """A message the way upstream's dumps it: newer ``openai`` SDKs give messages a ``phase``, which upstream's
    messages lack, so an unset one is left out of dumps (one that is set is kept)."""

    @model_serializer(mode="wrap")
    def _leave_out_unset_phase(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("phase", "") is None:
            del data["phase"]
        return data


class NeMoGymEasyInputMessage(UnsetPhaseLeftOut, EasyInputMessage):
    """A message given as input: ``{"role": "user", "content": "..."}`` or with a list of text, image and file parts."""

    content: Union[str, list[NeMoGymResponseInputContent]]
    type: Literal["message"] = "message"


class NeMoGymResponseOutputText(ResponseOutputText):
    annotations: list[Any] = Field(default_factory=list)
    type: Literal["output_text"] = "output_text"


class NeMoGymResponseOutputRefusal(ResponseOutputRefusal):
    type: Literal["refusal"] = "refusal"


NeMoGymContent = Annotated[Union[NeMoGymResponseOutputText, NeMoGymResponseOutputRefusal], Field(discriminator="type")]


class NeMoGymResponseOutputMessage(UnsetPhaseLeftOut, ResponseOutputMessage):
    """An assistant message; as input (a past turn) it may come without id and status."""

    id: str = Field(default_factory=lambda: new_id("msg"))
    content: list[NeMoGymContent]
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "completed"
    type: Literal["message"] = "message"


class NeMoGymResponseFunctionToolCall(ResponseFunctionToolCall):
    """The model asks for a function to be called; ``arguments`` is a JSON string."""

    type: Literal["function_call"] = "function_call"


class NeMoGymFunctionCallOutput(ResponseFunctionToolCallOutputItem):
    """The result of a function call. Agents give theirs an id and a status, as a reply's items need."""

    call_id: str
    id: Optional[str] = None
    status: Optional[ItemStatus] = None
    type: Literal["function_call_output"] = "function_call_output"


class NeMoGymMessage(Message):
    """A user, system or developer message given as a list of content parts, with a status."""

    content: list[NeMoGymResponseInputContent]
    status: ItemStatus = "completed"
    type: Literal["message"] = "message"


class NeMoGymSummary(Summary):
    type: Literal["summary_text"] = "summary_text"


class NeMoGymResponseReasoningItem(ResponseReasoningItem):
    summary: list[NeMoGymSummary]
    type: Literal["reasoning"] = "reasoning"


class NeMoGymEasyInputMessageForTraining(NeMoGymEasyInputMessage, TokenIDLogProbMixin):
    pass


class NeMoGymMessageForTraining(NeMoGymMessage, TokenIDLogProbMixin):
    pass


class NeMoGymResponseOutputMessageForTraining(NeMoGymResponseOutputMessage, TokenIDLogProbMixin):
    pass


class NeMoGymResponseFunctionToolCallForTraining(NeMoGymResponseFunctionToolCall, TokenIDLogProbMixin):
    pass


class NeMoGymResponseReasoningItemForTraining(NeMoGymResponseReasoningItem, TokenIDLogProbMixin):
    pass


# An item of these kinds that carries token metadata is read as its ForTraining class, so the ids are kept.
TRAINABLE = ("message", "output_message", "function_call", "reasoning")


def _literal_values(annotation: Any) -> set[str]:
    if typing.get_origin(annotation) is Literal:
        return set(typing.get_args(annotation))
    return set().union(*(_literal_values(argument) for argument in typing.get_args(annotation)))


def _item_types(sdk_union: Any) -> set[str]:
    """The ``type`` names an SDK item union (``Annotated[Union[...], ...]``) knows."""
    members = typing.get_args(typing.get_args(sdk_union)[0])
    return set().union(*(_literal_values(member.model_fields["type"].annotation) for member in members))


def _item_tagger(sdk_types: set[str], input_messages: bool) -> typing.Callable[[Any], str]:
    """Which class an item is: its ``type``; among inputs, a message is past assistant output or a message given.

    Among outputs a message is the assistant's, unless it is a message given (a user, system or developer
    turn, an input message object, or one whose content is a bare string, as some backends send it: upstream's
    output union takes that as its easy input message): upstream's agents return the whole conversation as the output.
    """

    def tag(item: Any) -> str:
        kind = field_of(item, "type")
        if kind in (None, "message"):
            content = field_of(item, "content")
            parts = content if isinstance(content, list) else []
            said = field_of(item, "role") == "assistant" and any(field_of(part, "type") in ("output_text", "refusal") for part in parts)
            given = isinstance(item, EasyInputMessage) or field_of(item, "role") not in (None, "assistant") or isinstance(content, str)
            kind = ("output_message" if said else "message") if input_messages else ("message" if given else "output_message")
        elif kind not in ("function_call", "function_call_output", "reasoning"):
            return "other" if kind in sdk_types else "unknown"
        return f"{kind}_for_training" if kind in TRAINABLE and carries_token_metadata(item) else kind

    return tag


def _item_union(sdk_union: Any, input_messages: bool) -> Any:
    members = [
        Annotated[NeMoGymResponseOutputMessage, Tag("output_message")],
        Annotated[NeMoGymResponseOutputMessageForTraining, Tag("output_message_for_training")],
        Annotated[NeMoGymResponseFunctionToolCall, Tag("function_call")],
        Annotated[NeMoGymResponseFunctionToolCallForTraining, Tag("function_call_for_training")],
        Annotated[NeMoGymFunctionCallOutput, Tag("function_call_output")],
        Annotated[NeMoGymResponseReasoningItem, Tag("reasoning")],
        Annotated[NeMoGymResponseReasoningItemForTraining, Tag("reasoning_for_training")],
        # Any other item (hosted tool calls, item references, ...) is validated by the SDK's own union.
        Annotated[sdk_union, Tag("other")],
        Annotated[NeMoGymEasyInputMessage, Tag("message")],
        Annotated[NeMoGymEasyInputMessageForTraining, Tag("message_for_training")],
    ]
    sdk_types = _item_types(sdk_union)
    error = f"an item's type is one of the Responses API's: {', '.join(sorted(sdk_types))}"
    tagger = _item_tagger(sdk_types, input_messages)
    return Annotated[Union[tuple(members)], Discriminator(tagger, custom_error_type="item_type", custom_error_message=error)]


NeMoGymResponseInputItem = _item_union(ResponseInputItem, input_messages=True)
NeMoGymResponseOutputItem = _item_union(ResponseOutputItem, input_messages=False)
# A string or a list of items; tagged, so that an error names the item (``input.items.3``), not the union.
NeMoGymResponseInput = Annotated[
    Union[Annotated[str, Tag("text")], Annotated[list[NeMoGymResponseInputItem], Tag("items")]],
    Discriminator(lambda value: "text" if isinstance(value, str) else "items"),
]


class NeMoGymResponseCreateParamsNonStreaming(BaseModel):
    """The body of ``POST /v1/responses``: every parameter of the SDK's ``responses.create``, and nothing else.

    What a chat completions backend can use is passed on (see ``vllm_model``); the rest is accepted and
    ignored, the way a stateless server has to (``store``, ``previous_response_id``, ``conversation``, ...).
    The validator is built on first use (as the SDK's own models are), not at import.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    input: NeMoGymResponseInput
    model: Optional[str] = None
    instructions: Optional[str] = None
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: Optional[int] = None
    max_tool_calls: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_logprobs: Optional[int] = None
    reasoning: Optional[Reasoning] = None
    text: Optional[ResponseTextConfig] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    include: Optional[list[ResponseIncludable]] = None
    store: Optional[bool] = None
    background: Optional[bool] = None
    previous_response_id: Optional[str] = None
    prompt: Optional[ResponsePrompt] = None
    service_tier: Optional[str] = None
    stream: Optional[Literal[False]] = None
    # Parameters about OpenAI's own hosting (conversations, caching, moderation, ...): accepted, ignored.
    access_programs: Any = None
    background_options: Any = None
    context_management: Any = None
    conversation: Any = None
    image: Any = None
    moderation: Any = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Optional[str] = None
    safety_identifier: Optional[str] = None
    stream_options: Any = None

    def input_items(self) -> list[Any]:
        if isinstance(self.input, str):
            return [NeMoGymEasyInputMessage(role="user", content=self.input)]
        return list(self.input)


class NeMoGymResponseCreateParams(NeMoGymResponseCreateParamsNonStreaming):
    """The same body where ``stream: true`` is allowed too; the server then sends the finished response as events."""

    stream: Optional[bool] = None

    def non_streaming(self) -> NeMoGymResponseCreateParamsNonStreaming:
        fields = self.model_fields_set - {"stream"}
        return NeMoGymResponseCreateParamsNonStreaming.model_validate({name: getattr(self, name) for name in fields})


class NeMoGymResponseInputTokensDetails(InputTokensDetails):
    # None: the backend did not count them.
    cached_tokens: Optional[int]
    # Newer than upstream's SDK; a usage written for that SDK has none.
    cache_write_tokens: int = 0


class NeMoGymResponseOutputTokensDetails(OutputTokensDetails):
    reasoning_tokens: Optional[int]


def _add_counts(left: Optional[int], right: Optional[int]) -> Optional[int]:
    """Two token counts added; a count nobody took stays unknown."""
    return None if left is None or right is None else left + right


class NeMoGymResponseUsage(ResponseUsage):
    input_tokens_details: NeMoGymResponseInputTokensDetails
    output_tokens_details: NeMoGymResponseOutputTokensDetails

    @classmethod
    def sum_from_list(cls, usages: Iterable["NeMoGymResponseUsage"]) -> "NeMoGymResponseUsage":
        total = response_usage(0, 0)
        for usage in usages:
            total = accumulate_response_usage(total, usage)
        return total


class NeMoGymResponse(Response):
    """A Responses API response object: an ``openai.types.responses.Response`` with the Gym's item classes."""

    output: list[NeMoGymResponseOutputItem]
    usage: Optional[NeMoGymResponseUsage] = None


# The request settings a response states back, as the API does.
ECHOED_PARAMS = {
    "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "max_tool_calls", "temperature",
    "top_p", "top_logprobs", "reasoning", "text", "truncation", "metadata", "user", "background", "previous_response_id",
    "prompt",
}  # fmt: skip


def new_response(params: Optional[NeMoGymResponseCreateParamsNonStreaming] = None, **fields: Any) -> NeMoGymResponse:
    """A completed response (to ``params``, whose settings it states back) with a fresh id; ``fields`` fill in the rest."""
    params = params or NeMoGymResponseCreateParamsNonStreaming(input="")
    echoed = {name: getattr(params, name) for name in ECHOED_PARAMS if getattr(params, name) is not None}
    defaults = {"id": new_id("resp"), "created_at": int(time.time()), "object": "response", "status": "completed"}
    return NeMoGymResponse.model_validate({**defaults, "model": params.model or "", "output": [], **echoed, **fields})


def response_usage(input_tokens: int, output_tokens: int, cached_tokens: Optional[int] = 0, reasoning_tokens: Optional[int] = 0) -> NeMoGymResponseUsage:
    return NeMoGymResponseUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        input_tokens_details={"cached_tokens": cached_tokens},
        output_tokens_details={"reasoning_tokens": reasoning_tokens},
    )


def accumulate_response_usage(total: Optional[ResponseUsage], step: Optional[ResponseUsage]) -> Optional[NeMoGymResponseUsage]:
    """The usage of several model calls together (an agent's loop); None when no call reported any."""
    if total is None or step is None:
        usage = total or step
        return None if usage is None else NeMoGymResponseUsage.model_validate(usage.model_dump())
    return NeMoGymResponseUsage(
        input_tokens=total.input_tokens + step.input_tokens,
        output_tokens=total.output_tokens + step.output_tokens,
        total_tokens=total.total_tokens + step.total_tokens,
        input_tokens_details={"cached_tokens": _add_counts(total.input_tokens_details.cached_tokens, step.input_tokens_details.cached_tokens)},
        output_tokens_details={"reasoning_tokens": _add_counts(total.output_tokens_details.reasoning_tokens, step.output_tokens_details.reasoning_tokens)},
    )


class NeMoGymChatCompletionMessage(ChatCompletionMessage):
    # vLLM's reasoning parsers put the model's thinking here (reasoning_content before vLLM 0.16, reasoning after).
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None


class NeMoGymChatCompletionMessageForTraining(NeMoGymChatCompletionMessage, TokenIDLogProbMixin):
    pass


class NeMoGymChoice(Choice):
    message: Annotated[
        Union[Annotated[NeMoGymChatCompletionMessage, Tag("plain")], Annotated[NeMoGymChatCompletionMessageForTraining, Tag("training")]],
        Discriminator(lambda message: "training" if carries_token_metadata(message) else "plain"),
    ]


class NeMoGymChatCompletion(ChatCompletion):
    choices: list[NeMoGymChoice]


class NeMoGymChatCompletionCreateParamsNonStreaming(BaseModel):
    """The body of ``POST /v1/chat/completions``; backends (vLLM) take keys of their own, so extras pass."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]]
    # None: the backend's own model (vLLM serves one).
    model: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    max_tokens: Optional[int] = None
    reasoning_effort: Optional[str] = None
    response_format: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    stream: Optional[Literal[False]] = None


class NeMoGymResponseInputText(ResponseInputTextParam):
    pass


class NeMoGymFunctionToolParam(FunctionToolParam):
    pass


def __getattr__(name: str) -> Any:
    """The Chat Completions message types live in ``nemo_gym.chat_completion_types``; upstream imports them from here."""
    # Imported on first use: the Chat Completions types are many, and most processes never need them.
    import nemo_gym.chat_completion_types as chat_completion_types

    if name.startswith("NeMoGym") and hasattr(chat_completion_types, name):
        return getattr(chat_completion_types, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
