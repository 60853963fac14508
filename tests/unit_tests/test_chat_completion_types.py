"""The Chat Completions message types: one validator per message kind, an assistant turn with token ids kept for training."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from nemo_gym.openai_utils import NeMoGymChatCompletionMessageParam, NeMoGymChatCompletionMessageToolCall, NeMoGymFunction

MESSAGES = TypeAdapter(list[NeMoGymChatCompletionMessageParam])
TOKENS = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}


def test_a_conversation_of_every_role_validates_with_list_content_kept_as_lists():
    conversation = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "2+2?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "[2,2]"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "4", **TOKENS},
    ]
    assert MESSAGES.validate_python(conversation) == conversation


def test_an_assistant_turn_with_part_of_the_token_ids_is_refused_naming_the_missing_field():
    with pytest.raises(ValidationError, match="generation_log_probs"):
        MESSAGES.validate_python([{"role": "assistant", "content": "4", "prompt_token_ids": [1], "generation_token_ids": [2]}])


def test_an_unknown_role_is_refused_with_the_roles_named():
    with pytest.raises(ValidationError, match="developer, system, user, assistant or tool"):
        MESSAGES.validate_python([{"role": "narrator", "content": "once upon a time"}])


def test_a_tool_call_of_a_reply_reads_its_function_as_nemo_gym_function():
    call = NeMoGymChatCompletionMessageToolCall.model_validate({"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}})
    assert call.function == NeMoGymFunction(name="add", arguments="{}")
