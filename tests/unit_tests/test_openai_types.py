"""The Responses API models: the shapes of the OpenAI API, and refusal of what it would refuse."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nemo_gym.openai_types import (
    EasyInputMessage,
    FunctionCallOutput,
    Response,
    ResponseCreateParams,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


def test_string_input_is_one_user_message():
    params = ResponseCreateParams(input="Add 1 to the counter.")
    [message] = params.input_items()
    assert isinstance(message, EasyInputMessage)
    assert (message.role, message.text) == ("user", "Add 1 to the counter.")


def test_input_items_parse_into_their_own_types():
    params = ResponseCreateParams.model_validate(
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Add 2."}]},
                {"type": "function_call", "call_id": "call_1", "name": "increment_counter", "arguments": '{"count": 2}'},
                {"type": "function_call_output", "call_id": "call_1", "output": '{"success": true}'},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
            ]
        }
    )
    kinds = [type(item) for item in params.input_items()]
    assert kinds == [EasyInputMessage, ResponseFunctionToolCall, FunctionCallOutput, ResponseOutputMessage]
    assert params.input_items()[0].text == "Add 2."


def test_a_response_round_trips_through_json_with_its_item_types():
    response = Response(
        model="m",
        output=[
            ResponseFunctionToolCall(call_id="call_1", name="get_counter_value", arguments="{}"),
            FunctionCallOutput(call_id="call_1", output='{"count": 3}'),
            ResponseOutputMessage(content=[ResponseOutputText(text="It is 3.")]),
        ],
    )
    again = Response.model_validate_json(response.model_dump_json())
    assert again == response
    assert again.output_text == "It is 3."
    assert again.object == "response" and again.id.startswith("resp_")


def test_an_agent_conversation_can_be_sent_back_as_input():
    """What an agent produced (calls, outputs, messages) is valid input for the next request."""
    output = [
        ResponseFunctionToolCall(call_id="c", name="increment_counter", arguments='{"count": 1}', id="fc_c", status="completed"),
        FunctionCallOutput(call_id="c", output="ok"),
        ResponseOutputMessage(content=[ResponseOutputText(text="done")]),
    ]
    params = ResponseCreateParams.model_validate({"input": [item.model_dump(exclude_none=True) for item in output]})
    assert params.input_items() == output


def test_unknown_request_key_is_refused():
    with pytest.raises(ValidationError) as error:
        ResponseCreateParams.model_validate({"input": "hi", "max_tokens": 5})
    assert error.value.errors()[0]["loc"] == ("max_tokens",)


def test_function_tools_keep_their_json_schema():
    params = ResponseCreateParams.model_validate(
        {
            "input": "hi",
            "tools": [{"type": "function", "name": "increment_counter", "parameters": {"type": "object"}, "strict": True}],
        }
    )
    [tool] = params.tools
    assert (tool.name, tool.parameters, tool.strict) == ("increment_counter", {"type": "object"}, True)


def test_a_user_message_cannot_claim_an_unknown_role():
    with pytest.raises(ValidationError):
        ResponseCreateParams.model_validate({"input": [{"role": "robot", "content": "beep"}]})
