"""nemo_gym.responses_converter: upstream's shared Responses <-> Chat Completions converter (ResponsesConverter)."""

from __future__ import annotations

import pytest

from nemo_gym.openai_utils import NeMoGymChatCompletion, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import (
    ResponsesConverter,
    VLLMConverter,
    VLLMConverterResponsesToChatCompletionsState,
    ResponsesConverterState,
    _usage_detail,
    split_responses_input_output_items,
)
from nemo_gym.openai_utils import NeMoGymResponse

TOKENS = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.5]}


def params(**fields) -> NeMoGymResponseCreateParamsNonStreaming:
    return NeMoGymResponseCreateParamsNonStreaming.model_validate(fields)


def chat_request(converter: ResponsesConverter, **fields) -> dict:
    return converter.responses_to_chat_completion_create_params(params(**fields)).model_dump(exclude_none=True)


def test_the_vllm_names_are_the_converter_and_its_state():
    assert (VLLMConverter, VLLMConverterResponsesToChatCompletionsState) == (ResponsesConverter, ResponsesConverterState)


def test_a_string_input_is_one_user_message_and_instructions_fold_the_leading_system_messages_into_one():
    converter = ResponsesConverter(return_token_id_information=False)
    assert chat_request(converter, input="hi")["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    request = chat_request(
        converter,
        instructions="Be brief.",
        input=[{"role": "developer", "content": "No jokes."}, {"role": "user", "content": "hi"}],
        max_output_tokens=64,
        reasoning={"effort": "low"},
    )
    assert request["messages"] == [{"role": "system", "content": "Be brief.\n\nNo jokes."}, {"role": "user", "content": "hi"}]
    assert (request["max_tokens"], request["reasoning_effort"]) == (64, "low")


def test_reasoning_and_calls_of_one_turn_become_one_assistant_message_with_think_tags_then_tool_messages():
    converter = ResponsesConverter(return_token_id_information=False)
    items = [
        {"role": "user", "content": "add"},
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "plan"}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        {"type": "message", "role": "assistant", "id": "m", "status": "completed", "content": [{"type": "output_text", "text": "3", "annotations": []}]},
    ]
    messages = chat_request(converter, input=items)["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": "<think>plan</think>",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
    }
    assert messages[2:] == [{"role": "tool", "tool_call_id": "c1", "content": "3"}, {"role": "assistant", "content": "3"}]


def test_function_tools_lose_type_and_strict_and_without_tools_tool_choice_goes_except_required():
    converter = ResponsesConverter(return_token_id_information=False)
    tool = {"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": True}
    request = chat_request(converter, input="hi", tools=[tool])
    assert request["tools"] == [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    assert "tool_choice" not in chat_request(converter, input="hi", tool_choice="auto")
    with pytest.raises(ValueError, match="tool_choice='required'"):
        chat_request(converter, input="hi", tool_choice="required")


def test_an_item_with_no_chat_counterpart_is_refused_naming_its_type():
    converter = ResponsesConverter(return_token_id_information=False)
    with pytest.raises(NotImplementedError, match="'web_search_call'"):
        chat_request(converter, input=[{"type": "web_search_call", "id": "w", "status": "completed", "action": {"type": "search", "query": "q"}}])


def test_an_assistant_turn_carries_its_token_ids_when_asked():
    converter = ResponsesConverter(return_token_id_information=True)
    items = [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "id": "m", "status": "completed", "content": [{"type": "output_text", "text": "yo", "annotations": []}], **TOKENS},
    ]
    assert chat_request(converter, input=items)["messages"][1] == {"role": "assistant", "content": "yo", **TOKENS}


def test_a_chat_reply_becomes_reasoning_from_think_tags_a_message_and_calls():
    converter = ResponsesConverter(return_token_id_information=False)
    tool_call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    items = converter.postprocess_assistant_message_dict({"role": "assistant", "content": "<think>hmm</think>sure", "tool_calls": [tool_call]})
    assert [item.type for item in items] == ["reasoning", "message", "function_call"]
    assert (items[0].summary[0].text, items[1].content[0].text, items[2].call_id) == ("hmm", "sure", "c1")
    plain = ResponsesConverter(return_token_id_information=False, uses_reasoning_parser=False)
    assert plain.postprocess_assistant_message_dict({"role": "assistant", "content": "<think>x</think>y"})[0].content[0].text == "<think>x</think>y"
    # An empty reply is still one (empty) message.
    assert [item.type for item in converter.postprocess_assistant_message_dict({"role": "assistant", "content": None})] == ["message"]


def test_the_last_generated_item_carries_the_token_ids_and_partial_ids_are_refused():
    converter = ResponsesConverter(return_token_id_information=True)
    [message] = converter.postprocess_assistant_message_dict({"role": "assistant", "content": "yo", **TOKENS})
    assert (type(message).__name__, message.generation_token_ids) == ("NeMoGymResponseOutputMessageForTraining", [2])
    with pytest.raises(ValueError, match="generation_log_probs"):
        converter.postprocess_assistant_message_dict({"role": "assistant", "content": "yo", "prompt_token_ids": [1], "generation_token_ids": [2]})


def test_a_chat_completion_becomes_the_response_to_the_request_with_its_usage_and_stop_reason():
    converter = ResponsesConverter(return_token_id_information=False)
    completion = NeMoGymChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 7,
            "model": "backend",
            "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "par"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 1}},
        }
    )
    response = converter.chat_completion_to_response(params(input="hi", model="policy", temperature=0.5), completion)
    assert isinstance(response, NeMoGymResponse)
    assert (response.model, response.created_at, response.temperature, response.status) == ("policy", 7, 0.5, "incomplete")
    assert response.incomplete_details.reason == "max_output_tokens"
    assert (response.usage.total_tokens, response.usage.input_tokens_details.cached_tokens, response.usage.output_tokens_details.reasoning_tokens) == (6, 1, None)


def test_usage_detail_reads_the_nested_count_then_each_alias_and_never_makes_up_a_zero():
    assert _usage_detail({"prompt_tokens_details": {"cached_tokens": 4}}, "prompt_tokens_details", "cached_tokens", "cached_input_tokens") == 4
    assert _usage_detail({"prompt_tokens_details": None, "cached_input_tokens": 2}, "prompt_tokens_details", "cached_tokens", "cached_input_tokens") == 2
    assert _usage_detail({"prompt_tokens_details": {"cached_tokens": -1}}, "prompt_tokens_details", "cached_tokens") is None


def test_split_cuts_before_the_first_item_the_model_generated():
    items = params(
        input=[
            {"role": "user", "content": "q"},
            {"type": "function_call_output", "call_id": "c0", "output": "x"},
            {"type": "reasoning", "id": "rs", "summary": []},
            {"role": "user", "content": "later"},
        ]
    ).input
    prompt, generated = split_responses_input_output_items(items)
    assert ([item.type for item in prompt], [item.type for item in generated]) == (["message", "function_call_output"], ["reasoning", "message"])
    assert split_responses_input_output_items([]) == ([], [])
    assert split_responses_input_output_items(items[:2]) == (items[:2], [])
