"""The Chat Completions message types under upstream NeMo Gym's names, built on the ``openai`` package's own.

The request-side types are the SDK's TypedDicts with list content (not the SDK's ``Iterable``, which
pydantic would read lazily); ``NeMoGymChatCompletionMessageParam`` validates one message of a
``messages`` list, an assistant turn carrying token ids as the training variant.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union

from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionContentPartImageParam,
    ChatCompletionContentPartInputAudioParam,
    ChatCompletionContentPartTextParam,
    ChatCompletionDeveloperMessageParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageToolCall,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat.chat_completion_assistant_message_param import ContentArrayOfContentPart
from openai.types.chat.chat_completion_content_part_param import File
from pydantic import BaseModel, Discriminator, Tag
from typing_extensions import NotRequired, Required, TypedDict

from nemo_gym.token_metadata import RoutedExperts, carries_token_metadata


class NeMoGymChatCompletionContentPartTextParam(ChatCompletionContentPartTextParam):
    pass


NeMoGymChatCompletionContentPartParam = Union[
    NeMoGymChatCompletionContentPartTextParam, ChatCompletionContentPartImageParam, ChatCompletionContentPartInputAudioParam, File
]


class NeMoGymChatCompletionUserMessageParam(ChatCompletionUserMessageParam):
    content: Required[Union[str, list[NeMoGymChatCompletionContentPartParam]]]


class NeMoGymChatCompletionSystemMessageParam(ChatCompletionSystemMessageParam):
    content: Required[Union[str, list[NeMoGymChatCompletionContentPartTextParam]]]


class NeMoGymChatCompletionDeveloperMessageParam(ChatCompletionDeveloperMessageParam):
    content: Required[Union[str, list[NeMoGymChatCompletionContentPartTextParam]]]


class NeMoGymChatCompletionToolMessageParam(ChatCompletionToolMessageParam):
    content: Required[Union[str, list[NeMoGymChatCompletionContentPartTextParam]]]


class NeMoGymChatCompletionMessageToolCallFunctionParam(TypedDict, total=False):
    arguments: Required[str]
    name: Required[str]


class NeMoGymChatCompletionMessageToolCallParam(ChatCompletionMessageFunctionToolCallParam):
    function: Required[NeMoGymChatCompletionMessageToolCallFunctionParam]


class NeMoGymChatCompletionAssistantMessageParam(ChatCompletionAssistantMessageParam, total=False):
    content: Union[str, list[ContentArrayOfContentPart], None]
    tool_calls: list[NeMoGymChatCompletionMessageToolCallParam]


class NeMoGymChatCompletionAssistantMessageForTrainingParam(NeMoGymChatCompletionAssistantMessageParam, total=False):
    prompt_token_ids: Required[list[int]]
    generation_token_ids: Required[list[int]]
    generation_log_probs: Required[list[float]]
    routed_experts: NotRequired[RoutedExperts]


def _message_kind(message: Any) -> Optional[str]:
    role = message.get("role") if isinstance(message, dict) else None
    return "assistant_for_training" if role == "assistant" and carries_token_metadata(message) else role


NeMoGymChatCompletionMessageParam = Annotated[
    Union[
        Annotated[NeMoGymChatCompletionDeveloperMessageParam, Tag("developer")],
        Annotated[NeMoGymChatCompletionSystemMessageParam, Tag("system")],
        Annotated[NeMoGymChatCompletionUserMessageParam, Tag("user")],
        Annotated[NeMoGymChatCompletionAssistantMessageParam, Tag("assistant")],
        Annotated[NeMoGymChatCompletionAssistantMessageForTrainingParam, Tag("assistant_for_training")],
        Annotated[NeMoGymChatCompletionToolMessageParam, Tag("tool")],
    ],
    Discriminator(_message_kind, custom_error_type="message_role", custom_error_message="a message's role is developer, system, user, assistant or tool"),
]


class NeMoGymFunction(BaseModel):
    """The function a model's tool call names, with its arguments as a JSON string."""

    arguments: str
    name: str


class NeMoGymChatCompletionMessageToolCall(ChatCompletionMessageToolCall):
    function: NeMoGymFunction
