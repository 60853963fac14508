"""A finished response as Responses API events: each event is one the SDK knows, in the order its stream reader needs."""

from __future__ import annotations

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from nemo_gym.openai_utils import (
    NeMoGymFunctionCallOutput,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseReasoningItem,
    new_response,
    response_usage,
)
from nemo_gym.response_stream import response_events

EVENT = TypeAdapter(ResponseStreamEvent)
OUTPUT = [
    NeMoGymResponseReasoningItem(id="rs_1", summary=[{"type": "summary_text", "text": "Think."}]),
    NeMoGymResponseFunctionToolCall(id="fc_1", call_id="c", name="get_counter_value", arguments="{}", status="completed"),
    NeMoGymFunctionCallOutput(id="fco_1", call_id="c", output='{"count": 2}', status="completed"),
    NeMoGymResponseOutputMessage(
        content=[{"type": "output_text", "text": "It is 2."}, {"type": "refusal", "refusal": "No more."}]
    ),
]


def finished(**fields) -> list[dict]:
    params = NeMoGymResponseCreateParamsNonStreaming(input="hi")
    return response_events(new_response(params, model="m", output=OUTPUT, usage=response_usage(1, 2), **fields))


def test_every_event_is_a_stream_event_of_the_sdk():
    for event in finished():
        EVENT.validate_python(event, strict=True)


def test_events_open_with_created_and_close_with_completed_numbered_in_order():
    events = finished()
    assert [event["type"] for event in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["usage"]["total_tokens"] == 3
    assert [event["sequence_number"] for event in events] == list(range(len(events)))


def test_each_item_is_opened_filled_and_done_in_output_order():
    events = finished()
    added = [event["output_index"] for event in events if event["type"] == "response.output_item.added"]
    done = [event["item"]["id"] for event in events if event["type"] == "response.output_item.done"]
    assert added == [0, 1, 2, 3]
    assert done == [item.id for item in OUTPUT]
    deltas = {event["type"]: event["delta"] for event in events if event["type"].endswith(".delta")}
    assert deltas == {"response.function_call_arguments.delta": "{}", "response.output_text.delta": "It is 2.", "response.refusal.delta": "No more."}


@pytest.mark.parametrize("status, last", [("incomplete", "response.incomplete"), ("failed", "response.failed")])
def test_a_response_that_did_not_complete_ends_with_its_own_event(status, last):
    assert finished(status=status)[-1]["type"] == last
