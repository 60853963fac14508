"""vllm_model's converter: Responses API requests to chat completions requests, and chat completions back."""

from __future__ import annotations

import pytest

from nemo_gym.openai_utils import (
    NeMoGymFunctionCallOutput,
    NeMoGymResponseCreateParamsNonStreaming as Params,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseReasoningItem,
)
from responses_api_models.vllm_model.converter import BackendError, UnsupportedInput, from_chat_response, to_chat_request
from responses_api_models.vllm_model.tests.test_app import TOOL, completion


def chat(body: dict | Params) -> dict:
    """The chat completions request the body becomes, as sent."""
    body = body if isinstance(body, Params) else Params.model_validate(body)
    return to_chat_request(body, "m").model_dump(exclude_none=True)


def answer(data: dict, body: dict | None = None):
    return from_chat_response(data, Params.model_validate(body or {"input": "hi"}))


def test_instructions_become_a_system_message_and_string_input_a_user_message():
    assert chat({"input": "Add 1.", "instructions": "Use the tools."}) == {
        "model": "m",
        "messages": [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Add 1."}],
    }


def test_input_messages_keep_their_roles_and_text():
    body = {
        "input": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Add "}, {"type": "input_text", "text": "1."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
        ]
    }
    assert chat(body)["messages"] == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Add 1."},
        {"role": "assistant", "content": "Sure."},
    ]


def test_an_input_image_becomes_an_image_url_part_beside_the_text():
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, image]}]}
    assert chat(body)["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            ],
        }
    ]


def test_an_input_image_given_only_by_file_id_is_refused_saying_what_to_give():
    body = Params.model_validate({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]})
    with pytest.raises(UnsupportedInput, match="needs image_url"):
        to_chat_request(body, "m")


def test_function_calls_and_outputs_become_tool_calls_and_tool_messages():
    body = {
        "input": [
            {"role": "user", "content": "Add 1 then 2."},
            {"type": "function_call", "call_id": "call_a", "name": "increment_counter", "arguments": '{"count": 1}'},
            {"type": "function_call_output", "call_id": "call_a", "output": '{"success": true}', "id": "fco_1", "status": "completed"},
        ]
    }
    assert chat(body)["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "increment_counter", "arguments": '{"count": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"success": true}'},
    ]


def test_consecutive_function_calls_merge_into_one_assistant_message():
    body = Params(
        input=[
            NeMoGymResponseOutputMessage.model_validate({"content": [{"type": "output_text", "text": "Two calls:"}]}),
            NeMoGymResponseFunctionToolCall(call_id="call_a", name="increment_counter", arguments='{"count": 1}'),
            NeMoGymResponseFunctionToolCall(call_id="call_b", name="increment_counter", arguments='{"count": 2}'),
            NeMoGymFunctionCallOutput(call_id="call_a", output="ok a"),
            NeMoGymFunctionCallOutput(call_id="call_b", output="ok b"),
        ]
    )
    messages = chat(body)["messages"]
    assert [message["role"] for message in messages] == ["assistant", "tool", "tool"]
    assert messages[0]["content"] == "Two calls:"
    assert [call["id"] for call in messages[0]["tool_calls"]] == ["call_a", "call_b"]
    assert [(message["tool_call_id"], message["content"]) for message in messages[1:]] == [("call_a", "ok a"), ("call_b", "ok b")]


def test_tools_and_sampling_options_translate_to_chat_completions_fields():
    body = {
        "input": "hi",
        "model": "asked-for",
        "tools": [TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_output_tokens": 64,
        "user": "u1",
    }
    request = chat(body)
    assert request["tools"] == [
        {
            "type": "function",
            "function": {"name": "increment_counter", "description": "Add `count` to the counter.", "parameters": TOOL["parameters"], "strict": True},
        }
    ]
    keys = ("model", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "max_tokens", "user")
    assert {key: request[key] for key in keys} == {
        "model": "asked-for",
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 64,
        "user": "u1",
    }


def test_a_named_function_choice_becomes_chats_function_choice_and_hosted_tools_stay_behind():
    request = chat({"input": "hi", "tools": [TOOL, {"type": "web_search"}], "tool_choice": {"type": "function", "name": "increment_counter"}})
    assert [tool["function"]["name"] for tool in request["tools"]] == ["increment_counter"]
    assert request["tool_choice"] == {"type": "function", "function": {"name": "increment_counter"}}


def test_reasoning_effort_and_a_json_schema_format_are_passed_on():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    request = chat(
        {"input": "hi", "reasoning": {"effort": "high"}, "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}}
    )
    assert request["reasoning_effort"] == "high"
    assert request["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def test_parameters_about_openais_hosting_are_not_sent_to_the_backend():
    stateless = {
        "store": False,
        "truncation": "auto",
        "max_tool_calls": 2,
        "include": ["reasoning.encrypted_content"],
        "previous_response_id": "resp_1",
        "background": False,
        "prompt_cache_key": "k",
        "safety_identifier": "s",
        "metadata": {"a": "b"},
    }
    assert chat({"input": "hi", **stateless}) == chat({"input": "hi"})


def test_a_completion_message_becomes_an_output_message_with_responses_usage():
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}
    response = answer(completion({"role": "assistant", "content": "The count is 3."}, usage=usage))
    [message] = response.output
    assert isinstance(message, NeMoGymResponseOutputMessage)
    assert (response.output_text, response.model, response.status) == ("The count is 3.", "served-model", "completed")
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (3, 2, 5)
    assert response.usage.input_tokens_details.cached_tokens == 1


def test_the_response_states_the_requests_settings_back():
    response = answer(completion({"role": "assistant", "content": "ok"}), {"input": "hi", "tools": [TOOL], "temperature": 0.4})
    assert (response.tools[0].name, response.tool_choice, response.parallel_tool_calls, response.temperature) == (
        "increment_counter",
        "auto",
        True,
        0.4,
    )


def test_a_completion_cut_at_max_tokens_is_an_incomplete_response():
    response = answer(completion({"role": "assistant", "content": "The count is"}, finish_reason="length"))
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")


def test_reasoning_content_becomes_a_reasoning_item_before_the_message():
    response = answer(completion({"role": "assistant", "content": "4", "reasoning_content": "2 + 2 is 4."}))
    reasoning, message = response.output
    assert isinstance(reasoning, NeMoGymResponseReasoningItem) and reasoning.summary[0].text == "2 + 2 is 4."
    assert message.content[0].text == "4"


def test_completion_tool_calls_become_function_calls_after_any_text():
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "increment_counter", "arguments": '{"count": 1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_counter_value", "arguments": "{}"}},
    ]
    response = answer(completion({"role": "assistant", "content": "Calling.", "tool_calls": calls}, finish_reason="tool_calls"))
    message, first, second = response.output
    assert isinstance(message, NeMoGymResponseOutputMessage) and message.content[0].text == "Calling."
    assert (first.call_id, first.name, first.arguments, first.status) == ("call_a", "increment_counter", '{"count": 1}', "completed")
    assert (second.call_id, second.name, second.arguments) == ("call_b", "get_counter_value", "{}")


def test_a_conversation_survives_the_round_trip_through_chat_completions():
    """What the model answered, sent back as input, is the assistant turn the backend produced."""
    calls = [{"id": "call_a", "type": "function", "function": {"name": "increment_counter", "arguments": '{"count": 1}'}}]
    response = answer(completion({"role": "assistant", "content": None, "tool_calls": calls}, finish_reason="tool_calls"))
    body = Params(input=[*response.output, NeMoGymFunctionCallOutput(call_id="call_a", output="ok")])
    assert chat(body)["messages"] == [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_a", "content": "ok"},
    ]


@pytest.mark.parametrize(
    "data",
    [{"error": "overloaded"}, {"choices": []}, {"choices": [{"message": "text"}]}, ["not", "an", "object"], None],
)
def test_anything_but_a_chat_completion_is_a_backend_error(data):
    with pytest.raises(BackendError, match="not a chat completion"):
        answer(data)
