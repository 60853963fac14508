"""The official openai SDK against real server processes: the model server and every agent speak the Responses API.

Every reply is checked strictly against ``openai.types.responses.Response``: all required fields, the
right types, and no key the SDK does not know, at any depth.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from nemo_gym.process.launcher import Launcher

COUNTER_TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "Add `count` to this session's counter.",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"], "additionalProperties": False},
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_counter_value",
        "description": "Read this session's counter.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        "strict": True,
    },
]
TASK = "The counter starts at 0. Add 2, then get the count and tell me."
POLICY, AGENT, MEMORY, RELAY = "policy_model", "counter_agent", "memory_agent", "relay_agent"
STACK = {
    "counter": {"resources_servers": {"example_session_state_mgmt": {}}},
    AGENT: {
        "responses_api_agents": {
            "simple_agent": {
                "resources_server": {"type": "resources_servers", "name": "counter"},
                "model_server": {"type": "responses_api_models", "name": POLICY},
            }
        }
    },
    MEMORY: {"responses_api_agents": {"memory_agent": {"model_server": {"type": "responses_api_models", "name": POLICY}}}},
    RELAY: {"responses_api_agents": {"legacy_agent": {"downstream_agent": {"type": "responses_api_agents", "name": AGENT}}}},
    POLICY: {
        "responses_api_models": {
            "vllm_model": {"backend_server": {"type": "responses_api_models", "name": "scripted_backend"}, "model": "scripted"}
        }
    },
    "scripted_backend": {"responses_api_models": {"scripted_backend": {}}},
}
SERVERS = [POLICY, AGENT, MEMORY, RELAY]
# One value for each optional parameter of responses.create.
OPTIONAL_PARAMETERS: dict[str, Any] = {
    "store": False,
    "reasoning": {"effort": "low", "summary": "auto"},
    "text": {"format": {"type": "json_schema", "name": "reply", "schema": {"type": "object"}, "strict": False}},
    "max_tool_calls": 5,
    "truncation": "auto",
    "include": ["reasoning.encrypted_content"],
    "instructions": "Use the tools.",
    "max_output_tokens": 256,
    "metadata": {"run": "e2e"},
    "parallel_tool_calls": False,
    "previous_response_id": "resp_earlier",
    "temperature": 0.5,
    "top_p": 0.9,
    "top_logprobs": 2,
    "tool_choice": "required",
    "user": "e2e-user",
    "service_tier": "auto",
    "background": False,
    "prompt_cache_key": "counter",
    "safety_identifier": "e2e",
    "conversation": "conv_e2e",
}


@pytest.fixture(scope="module")
def stack(start_module_servers) -> Launcher:
    return start_module_servers(STACK)


@pytest.fixture(scope="module")
def clients(stack: Launcher) -> Iterator[dict[str, openai.OpenAI]]:
    clients = {name: openai.OpenAI(base_url=f"{stack.instances[name].url}/v1", api_key="dummy", max_retries=0) for name in SERVERS}
    yield clients
    for client in clients.values():
        client.close()


def assert_no_unknown_keys(value: Any, where: str = "response") -> None:
    """Every key of every nested SDK model is one the SDK declares (its models let unknown keys through)."""
    if isinstance(value, openai.BaseModel):
        assert not value.model_extra, f"{where} has keys the SDK does not know: {sorted(value.model_extra)}"
        for name in type(value).model_fields:
            assert_no_unknown_keys(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            assert_no_unknown_keys(item, f"{where}[{index}]")


def strict_response(data: str | dict) -> Response:
    response = Response.model_validate_json(data if isinstance(data, str) else json.dumps(data), strict=True)
    assert_no_unknown_keys(response)
    return response


def create(client: openai.OpenAI, **parameters: Any) -> Response:
    """``responses.create`` with the SDK; the reply's raw JSON is validated strictly."""
    raw = client.responses.with_raw_response.create(model="scripted", input=parameters.pop("input", TASK), **parameters)
    return strict_response(raw.http_response.text)


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("parameter", OPTIONAL_PARAMETERS)
def test_each_optional_parameter_of_responses_create_is_answered_with_a_strict_response(clients, server, parameter):
    create(clients[server], tools=COUNTER_TOOLS, **{parameter: OPTIONAL_PARAMETERS[parameter]})


@pytest.mark.parametrize("server", SERVERS)
def test_image_input_is_accepted(clients, server):
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    content = [{"type": "input_text", "text": TASK}, image]
    response = create(clients[server], input=[{"role": "user", "content": content}], tools=COUNTER_TOOLS)
    assert response.output


@pytest.mark.parametrize("server", SERVERS)
def test_the_reply_states_tools_tool_choice_and_parallel_tool_calls(clients, server):
    response = create(clients[server], tools=COUNTER_TOOLS, tool_choice="auto", parallel_tool_calls=False)
    assert [tool.name for tool in response.tools] == ["increment_counter", "get_counter_value"]
    assert (response.tool_choice, response.parallel_tool_calls) == ("auto", False)


@pytest.mark.parametrize("server", SERVERS)
def test_usage_is_in_the_responses_shape(clients, server):
    usage = create(clients[server], tools=COUNTER_TOOLS).usage
    assert isinstance(usage.input_tokens, int) and usage.input_tokens > 0
    assert isinstance(usage.output_tokens, int) and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert (usage.input_tokens_details.cached_tokens, usage.output_tokens_details.reasoning_tokens) == (0, 0)


def test_the_agents_usage_adds_up_every_model_call(clients):
    single = create(clients[POLICY], tools=COUNTER_TOOLS).usage
    episode = create(clients[AGENT], tools=COUNTER_TOOLS).usage
    # The agent calls the model three times (two tool calls, one answer), each with a longer input.
    assert episode.input_tokens > 3 * single.input_tokens


@pytest.mark.parametrize("server", SERVERS)
def test_stream_true_is_read_by_the_sdks_streaming_iterator(clients, server):
    events = list(clients[server].responses.create(model="scripted", input=TASK, tools=COUNTER_TOOLS, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = strict_response(events[-1].response.model_dump(mode="json", by_alias=True, exclude_none=True))
    done = [event.item.id for event in events if event.type == "response.output_item.done"]
    assert done == [item.id for item in final.output]


@pytest.mark.parametrize("server", SERVERS)
def test_the_sdks_stream_helper_assembles_the_final_response(clients, server):
    with clients[server].responses.stream(model="scripted", input=TASK, tools=COUNTER_TOOLS) as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text
    assert final.status == "completed" and final.output


def test_the_agents_function_call_outputs_have_an_id_and_a_status(clients):
    response = create(clients[AGENT], tools=COUNTER_TOOLS)
    outputs = [item for item in response.output if item.type == "function_call_output"]
    assert len(outputs) == 2
    assert all(item.id and item.status == "completed" for item in outputs)
    assert len({item.id for item in outputs}) == 2


@pytest.mark.parametrize("server", SERVERS)
def test_an_unknown_parameter_is_a_422_naming_it(clients, server):
    with pytest.raises(openai.UnprocessableEntityError) as error:
        clients[server].responses.create(model="scripted", input=TASK, extra_body={"max_tokens": 5})
    assert "max_tokens" in str(error.value.body)
