"""The embedded scripted backend: it plays the counter tasks one tool call per turn, then answers."""

from __future__ import annotations

import json

import pytest

from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import REPO_ROOT, Instance, free_port
from responses_api_models.scripted_backend.app import ScriptedBackend, next_turn
from tests.unit_tests.in_process_server import serving

BACKEND = "scripted_backend"
DATA = REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "data" / "example.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


@pytest.fixture
async def backend():
    port = free_port()
    settings = {"entrypoint": "app.py", "host": "127.0.0.1", "port": port, "num_workers": 1}
    instances = {BACKEND: Instance(BACKEND, "responses_api_models", "scripted_backend", settings)}
    client = ReadingClient(instances)
    async with serving(ScriptedBackend.for_instance(BACKEND, instances).build_app(), port):
        try:
            yield client
        finally:
            await client.close()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


async def complete(client: ReadingClient, messages: list[dict]) -> dict:
    reply = await client.post(BACKEND, "/v1/chat/completions", json={"model": "scripted", "messages": messages})
    assert reply.status == 200, reply.text
    assert reply.body["object"] == "chat.completion"
    return reply.body["choices"][0]


@pytest.mark.anyio
@pytest.mark.parametrize("row", ROWS, ids=[f"task{n}" for n in range(1, len(ROWS) + 1)])
async def test_it_plays_each_counter_task_one_tool_call_per_turn_then_a_final_message(backend, row):
    count = row["initial_count"]
    messages = [{"role": message["role"], "content": message["content"]} for message in row["responses_create_params"]["input"]]
    for _ in range(10):
        choice = await complete(backend, messages)
        message = choice["message"]
        if not message.get("tool_calls"):
            break
        assert choice["finish_reason"] == "tool_calls"
        [call] = message["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        if call["function"]["name"] == "increment_counter":
            count += arguments["count"]
            result = {"success": True}
        else:
            assert (call["function"]["name"], arguments) == ("get_counter_value", {})
            result = {"count": count}
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}]
    else:
        pytest.fail("the backend never gave a final message")
    assert choice["finish_reason"] == "stop"
    assert count == row["expected_count"]
    assert json.dumps({"count": row["expected_count"]}) in message["content"]


def test_the_calls_of_a_task_come_in_the_order_the_task_gives_them():
    messages = [user("The counter starts at 0. Add 1, then add -2, then get the count and tell me.")]
    played = []
    for result in ["a", "b", "c"]:
        message = next_turn(messages)
        [call] = message["tool_calls"]
        played.append((call["function"]["name"], json.loads(call["function"]["arguments"])))
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": result}]
    assert played == [("increment_counter", {"count": 1}), ("increment_counter", {"count": -2}), ("get_counter_value", {})]
    assert next_turn(messages) == {"role": "assistant", "content": "Done. The last tool said: c"}


@pytest.mark.anyio
async def test_an_unknown_task_gets_a_plain_message(backend):
    choice = await complete(backend, [user("Write me a poem about otters.")])
    assert choice["finish_reason"] == "stop"
    assert not choice["message"].get("tool_calls")
    assert "no script for this task" in choice["message"]["content"]


@pytest.mark.anyio
async def test_a_request_without_messages_is_refused_with_400(backend):
    reply = await backend.post(BACKEND, "/v1/chat/completions", json={"model": "scripted", "messages": []})
    assert reply.status == 400
    assert reply.body == {"detail": "messages must not be empty"}


@pytest.mark.anyio
async def test_a_request_without_a_model_is_answered_by_the_backends_own_name(backend):
    reply = await backend.post(BACKEND, "/v1/chat/completions", json={"messages": [user("Write me a poem about otters.")]})
    assert (reply.status, reply.body["model"]) == (200, BACKEND)
