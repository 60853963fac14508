"""The Responses API models: the SDK's shapes, every responses.create parameter, and refusal of what the API refuses."""

from __future__ import annotations

import pytest
from openai.types.responses import Response, ResponseFunctionWebSearch
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import ValidationError

from nemo_gym.base_responses_api_agent import BaseRunRequest
from nemo_gym.openai_utils import (
    REQUIRED_TOKEN_METADATA_FIELDS,
    TOKEN_METADATA_FIELDS,
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymEasyInputMessage,
    NeMoGymEasyInputMessageForTraining,
    NeMoGymFunctionCallOutput,
    NeMoGymMessage,
    NeMoGymResponse,
    NeMoGymResponseCreateParams,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInputImage,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymResponseUsage,
    NeMoGymSummary,
    accumulate_response_usage,
    new_response,
    response_usage,
)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
    "strict": True,
}
# Task rows in the shape of upstream's data/example.jsonl files, one per kind of row they hold.
UPSTREAM_SHAPED_ROWS = {
    "tool task with a system prompt": {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What's the weather in Paris?"},
            ],
            "tools": [WEATHER_TOOL],
        },
        "expected_city": "Paris",
    },
    "math with sampling and reasoning settings": {
        "responses_create_params": {
            "input": [{"role": "user", "content": "What is 7 * 6? Put the answer in \\boxed{}."}],
            "temperature": 0.6,
            "top_p": 0.95,
            "max_output_tokens": 4096,
            "reasoning": {"effort": "high"},
        },
        "expected_answer": "42",
        "agent_ref": {"type": "responses_api_agents", "name": "math_simple_agent"},
    },
    "image question": {
        "responses_create_params": {
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "How many circles are in the picture?"},
                        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "high"},
                    ],
                }
            ]
        },
        "expected_count": 3,
    },
    "structured output, stateless": {
        "responses_create_params": {
            "input": "Name a colour.",
            "instructions": "Answer in JSON.",
            "text": {"format": {"type": "json_schema", "name": "colour", "schema": {"type": "object"}, "strict": True}},
            "store": False,
            "truncation": "auto",
            "include": ["reasoning.encrypted_content"],
        },
        "_ng_task_index": 3,
        "_ng_rollout_index": 0,
    },
    "conversation carried over with tool results": {
        "responses_create_params": {
            "input": [
                {"role": "developer", "content": "Use the tools."},
                {"role": "user", "content": "Weather in Oslo?"},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should call the tool."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}', "id": "fc_1", "status": "completed"},
                {"type": "function_call_output", "call_id": "call_1", "output": "Snow, -3 C"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "It snows.", "annotations": []}]},
                {"role": "user", "content": "And tomorrow?"},
            ],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
            "max_tool_calls": 4,
            "metadata": {"source": "example"},
        }
    },
}


@pytest.mark.parametrize("row", UPSTREAM_SHAPED_ROWS.values(), ids=UPSTREAM_SHAPED_ROWS)
def test_upstream_shaped_task_rows_are_valid_run_requests(row):
    request = BaseRunRequest.model_validate(row)
    assert request.responses_create_params.model_dump(mode="json", by_alias=True, exclude_unset=True) == row["responses_create_params"]


def test_every_parameter_of_the_sdks_responses_create_is_a_field():
    assert set(ResponseCreateParamsNonStreaming.__annotations__) <= set(NeMoGymResponseCreateParamsNonStreaming.model_fields)


def test_string_input_is_one_user_message():
    params = NeMoGymResponseCreateParamsNonStreaming(input="Add 1 to the counter.")
    [message] = params.input_items()
    assert isinstance(message, NeMoGymEasyInputMessage)
    assert (message.role, message.content) == ("user", "Add 1 to the counter.")


def test_input_items_parse_into_their_own_types():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        UPSTREAM_SHAPED_ROWS["conversation carried over with tool results"]["responses_create_params"]
    )
    assert [type(item) for item in params.input_items()] == [
        NeMoGymEasyInputMessage,
        NeMoGymEasyInputMessage,
        NeMoGymResponseReasoningItem,
        NeMoGymResponseFunctionToolCall,
        NeMoGymFunctionCallOutput,
        NeMoGymResponseOutputMessage,
        NeMoGymEasyInputMessage,
    ]


def test_image_input_is_accepted_with_detail_auto_when_none_is_given():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]}
    )
    [image] = params.input_items()[0].content
    assert isinstance(image, NeMoGymResponseInputImage) and image.detail == "auto"


def test_items_of_other_sdk_types_are_validated_by_the_sdk():
    item = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}}
    [parsed] = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [item]}).input_items()
    assert isinstance(parsed, ResponseFunctionWebSearch)


def test_an_item_of_an_unknown_type_is_refused_naming_the_item_and_the_known_types():
    with pytest.raises(ValidationError) as error:
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [{"role": "user", "content": "hi"}, {"type": "telepathy"}]})
    [problem] = error.value.errors()
    assert problem["loc"] == ("input", "items", 1)
    assert "function_call_output" in problem["msg"] and "web_search_call" in problem["msg"]


def test_unknown_request_key_is_refused():
    with pytest.raises(ValidationError) as error:
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "max_tokens": 5})
    assert error.value.errors()[0]["loc"] == ("max_tokens",)


def test_the_non_streaming_body_refuses_stream_true_and_the_streaming_one_drops_it():
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "stream": True})
    body = NeMoGymResponseCreateParams.model_validate({"input": "hi", "stream": True, "temperature": 0.5})
    assert body.non_streaming().model_dump(exclude_unset=True) == {"input": "hi", "temperature": 0.5}


def test_a_user_message_cannot_claim_an_unknown_role():
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [{"role": "robot", "content": "beep"}]})


def test_a_new_response_validates_strictly_as_the_sdks_response_and_echoes_the_request():
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {"input": "hi", "tools": [WEATHER_TOOL], "temperature": 0.3, "reasoning": {"effort": "low"}, "store": False}
    )
    output = [
        NeMoGymResponseFunctionToolCall(call_id="c", name="get_weather", arguments="{}", id="fc_c", status="completed"),
        NeMoGymFunctionCallOutput(call_id="c", output="sunny", id="fco_c", status="completed"),
        NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputText(text="It is sunny.")]),
    ]
    response = new_response(params, model="m", output=output, usage=response_usage(5, 7))
    sdk = Response.model_validate_json(response.model_dump_json(by_alias=True, exclude_none=True), strict=True)
    assert (sdk.tools[0].name, sdk.tool_choice, sdk.parallel_tool_calls) == ("get_weather", "auto", True)
    assert (sdk.temperature, sdk.reasoning.effort, sdk.output_text) == (0.3, "low", "It is sunny.")
    assert (sdk.usage.input_tokens, sdk.usage.output_tokens, sdk.usage.total_tokens) == (5, 7, 12)
    assert NeMoGymResponse.model_validate_json(response.model_dump_json(by_alias=True)) == response


def test_a_response_without_its_required_fields_is_refused():
    with pytest.raises(ValidationError) as error:
        NeMoGymResponse.model_validate({"output": []})
    missing = {problem["loc"][0] for problem in error.value.errors()}
    assert missing == {"id", "created_at", "model", "object", "parallel_tool_calls", "tool_choice", "tools"}


def test_an_agent_conversation_can_be_sent_back_as_input():
    """What an agent produced (calls, outputs, messages) is valid input for the next request."""
    output = [
        NeMoGymResponseFunctionToolCall(call_id="c", name="increment_counter", arguments='{"count": 1}', id="fc_c", status="completed"),
        NeMoGymFunctionCallOutput(call_id="c", output="ok", id="fco_c", status="completed"),
        NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputText(text="done")]),
    ]
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [item.model_dump(exclude_none=True) for item in output]})
    assert params.input_items() == output


def test_usage_of_several_calls_adds_up_and_none_counts_as_nothing():
    total = accumulate_response_usage(accumulate_response_usage(None, response_usage(3, 4, cached_tokens=1)), response_usage(10, 2, reasoning_tokens=2))
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (13, 6, 19)
    assert (total.input_tokens_details.cached_tokens, total.output_tokens_details.reasoning_tokens) == (1, 2)
    assert accumulate_response_usage(None, None) is None



TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}


@pytest.mark.parametrize(
    "item, training_class",
    [
        ({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}, NeMoGymResponseOutputMessageForTraining),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, NeMoGymResponseFunctionToolCallForTraining),
        ({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]}, NeMoGymResponseReasoningItemForTraining),
    ],
)
def test_an_output_item_with_token_ids_is_its_for_training_class_and_keeps_them_through_a_dump(item, training_class):
    response = new_response(output=[{**item, **TOKENS, "routed_experts": "nrlre1:opaque"}])
    (read,) = NeMoGymResponse.model_validate(response.model_dump(mode="json")).output
    assert type(read) is training_class
    assert read.model_dump(include=set(TOKENS) | {"routed_experts"}) == {**TOKENS, "routed_experts": "nrlre1:opaque"}


def test_an_input_message_with_token_ids_is_an_easy_input_message_for_training():
    params = NeMoGymResponseCreateParamsNonStreaming(input=[{"role": "user", "content": "hi", **TOKENS}])
    assert type(params.input[0]) is NeMoGymEasyInputMessageForTraining


def test_token_metadata_missing_a_required_field_is_refused_naming_it():
    item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "prompt_token_ids": [1]}
    with pytest.raises(ValidationError, match="generation_token_ids"):
        new_response(output=[item])
    assert REQUIRED_TOKEN_METADATA_FIELDS | {"routed_experts"} == TOKEN_METADATA_FIELDS == {*TOKENS, "routed_experts"}


def test_an_item_without_token_ids_stays_its_plain_class():
    (read,) = new_response(output=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]).output
    assert type(read) is NeMoGymResponseFunctionToolCall


def test_a_chat_completion_message_with_token_ids_is_the_for_training_message():
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4", **TOKENS}}
    completion = NeMoGymChatCompletion.model_validate({"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]})
    assert type(completion.choices[0].message) is NeMoGymChatCompletionMessageForTraining
    assert completion.model_dump()["choices"][0]["message"]["generation_log_probs"] == [-0.5]


def test_usage_written_as_upstream_writes_it_validates_and_a_count_nobody_took_stays_unknown():
    known = NeMoGymResponseUsage(
        input_tokens=3,
        input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=1),
        output_tokens=4,
        output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=2),
        total_tokens=7,
    )
    unknown = response_usage(10, 2, cached_tokens=None, reasoning_tokens=5)
    total = NeMoGymResponseUsage.sum_from_list([known, unknown])
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (13, 6, 19)
    assert (total.input_tokens_details.cached_tokens, total.output_tokens_details.reasoning_tokens) == (None, 7)
    assert Response.model_validate(new_response(usage=known).model_dump()).usage.input_tokens_details.cache_write_tokens == 0


def test_sum_from_list_of_nothing_is_zero_usage():
    assert NeMoGymResponseUsage.sum_from_list([]) == response_usage(0, 0)


def test_a_refusal_and_a_summary_need_no_type_and_a_message_given_as_parts_is_completed():
    message = NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputRefusal(refusal="no")])
    assert message.model_dump()["content"][0] == {"refusal": "no", "type": "refusal"}
    assert NeMoGymSummary(text="thought").type == "summary_text"
    given = NeMoGymMessage(role="system", content=[{"type": "input_text", "text": "be brief"}])
    assert (given.status, given.type) == ("completed", "message")


def test_a_chat_completion_request_may_leave_the_model_to_the_backend():
    request = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert request.model is None and "model" not in request.model_dump(exclude_unset=True)


def test_a_response_whose_output_carries_the_conversations_given_messages_validates_as_upstreams_agents_build_it():
    given = NeMoGymEasyInputMessage(role="user", content="2+2?")
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}
    response = new_response(output=[given, {"role": "system", "content": "be brief", "type": "message"}, said])
    assert [type(item) for item in response.output] == [NeMoGymEasyInputMessage, NeMoGymEasyInputMessage, NeMoGymResponseOutputMessage]
    assert NeMoGymResponse.model_validate(response.model_dump()).output[0] == given


def test_messages_dump_as_upstreams_without_the_sdks_unset_phase():
    from nemo_gym.openai_utils import NeMoGymEasyInputMessage, NeMoGymResponseOutputMessage, NeMoGymResponseOutputText

    assert NeMoGymEasyInputMessage(role="user", content="Hello").model_dump(mode="json") == {"content": "Hello", "role": "user", "type": "message"}
    output = NeMoGymResponseOutputMessage(id="m", content=[NeMoGymResponseOutputText(text="hi")], status="completed")
    assert "phase" not in output.model_dump() and "phase" not in output.model_dump_json()
    kept = NeMoGymEasyInputMessage.model_validate({"role": "assistant", "content": "x", "phase": "final_answer"})
    assert kept.model_dump()["phase"] == "final_answer"


def test_an_output_message_with_bare_string_content_validates_as_upstreams_easy_message():
    from nemo_gym.openai_utils import NeMoGymEasyInputMessage, NeMoGymResponse

    response = NeMoGymResponse(
        id="resp_test", created_at=0.0, model="dummy", object="response", parallel_tool_calls=True, tool_choice="auto", tools=[],
        output=[{"id": "msg_1", "type": "message", "role": "assistant", "content": "((3))"}],
    )
    assert isinstance(response.output[0], NeMoGymEasyInputMessage) and response.output[0].content == "((3))"
