"""simple_agent: the multi-step loop and /run, with every server of the episode on a real uvicorn."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import free_port
from nemo_gym.openai_utils import NeMoGymResponseFunctionToolCall
from nemo_gym.process import discovery
from resources_servers.example_session_state_mgmt.app import CounterServer
from responses_api_agents.simple_agent.app import SimpleAgent
from responses_api_models.scripted_backend.app import ScriptedBackend
from responses_api_models.vllm_model.app import VLLMModel
from tests.unit_tests.in_process_server import serving

AGENT, COUNTER, POLICY, SCRIPTED = "agent", "counter", "policy", "scripted"
CLASSES = {AGENT: SimpleAgent, COUNTER: CounterServer, POLICY: VLLMModel, SCRIPTED: ScriptedBackend}
DATA = gym_config.REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "data" / "example.jsonl"
TOOLS = json.loads(DATA.read_text().splitlines()[0])["responses_create_params"]["tools"]
# A task whose counter does not start at 0, so tool calls that miss the seeded session cannot score.
ROW = {
    "responses_create_params": {"input": "The counter starts at 10. Add 3, then add 4, then get the count and tell me.", "tools": TOOLS},
    "initial_count": 10,
    "expected_count": 17,
}

Script = Callable[[list[dict]], dict]


def config(model: dict, max_steps: int | None = None) -> dict:
    agent = {
        "resources_server": {"type": "resources_servers", "name": COUNTER},
        "model_server": {"type": "responses_api_models", "name": POLICY},
    }
    if max_steps:
        agent["max_steps"] = max_steps
    return {
        COUNTER: {"resources_servers": {"example_session_state_mgmt": {}}},
        AGENT: {"responses_api_agents": {"simple_agent": agent}},
        POLICY: {"responses_api_models": {"vllm_model": {"model": "test", **model}}},
    }


def chat_backend(script: Script) -> FastAPI:
    """A tiny chat completions server whose every assistant turn is ``script(messages)``."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> dict:
        message = script((await request.json())["messages"])
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "test", "choices": [choice]}

    return app


def tool_call(name: str, arguments: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}]}


def say_what_the_tool_said(first_turn: dict) -> Script:
    """Turn 1 is ``first_turn``; then a final message quoting the last tool result the model was shown."""

    def script(messages: list[dict]) -> dict:
        results = [message["content"] for message in messages if message["role"] == "tool"]
        return {"role": "assistant", "content": f"The tool said: {results[-1]}"} if results else first_turn

    return script


@contextlib.asynccontextmanager
async def episode_servers(script: Script | None = None, model_url: str | None = None, max_steps: int | None = None) -> AsyncIterator[ReadingClient]:
    """Counter, agent and vllm_model in front of ``script``, ``model_url``, or the embedded scripted backend."""
    async with contextlib.AsyncExitStack() as stack:
        if script is not None:
            model_url = f"{await stack.enter_async_context(serving(chat_backend(script)))}/v1"
        if model_url is not None:
            data = config({"base_url": model_url, "timeout_seconds": 5}, max_steps)
        else:
            data = config({"backend_server": {"type": "responses_api_models", "name": SCRIPTED}}, max_steps)
            data[SCRIPTED] = {"responses_api_models": {"scripted_backend": {}}}
        instances = gym_config.parse(data)
        discovery.check_settings(instances)
        for name, instance in instances.items():
            await stack.enter_async_context(serving(CLASSES[name].for_instance(name, instances).build_app(), instance.port))
        client = ReadingClient(instances)
        stack.push_async_callback(client.close)
        yield client


def agent_for_unit_tests() -> SimpleAgent:
    return SimpleAgent.for_instance(AGENT, gym_config.parse(config({"base_url": "http://127.0.0.1:9/v1"}), check_ports=False))


@pytest.mark.anyio
async def test_a_tool_call_with_unparsable_arguments_becomes_an_error_output():
    call = NeMoGymResponseFunctionToolCall(call_id="call_1", name="increment_counter", arguments='{"count": 1')
    output = await agent_for_unit_tests().call_tool(call, {})
    assert output.call_id == "call_1"
    assert output.output.startswith("Error: arguments are not valid JSON")


@pytest.mark.anyio
async def test_a_tool_call_whose_arguments_are_not_an_object_becomes_an_error_output():
    call = NeMoGymResponseFunctionToolCall(call_id="call_1", name="increment_counter", arguments="[1, 2]")
    output = await agent_for_unit_tests().call_tool(call, {})
    assert output.output == "Error: arguments must be a JSON object"


@pytest.mark.anyio
async def test_the_model_sees_the_error_of_a_tool_call_with_unparsable_arguments():
    script = say_what_the_tool_said(tool_call("increment_counter", '{"count": one}'))
    async with episode_servers(script) as client:
        reply = await client.post(AGENT, "/v1/responses", json={"input": "Add one.", "tools": TOOLS})
    assert reply.status == 200, reply.text
    call, output, message = reply.body["output"]
    assert (call["type"], call["arguments"]) == ("function_call", '{"count": one}')
    assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
    assert output["output"].startswith("Error: arguments are not valid JSON")
    assert message["content"][0]["text"] == f"The tool said: {output['output']}"


@pytest.mark.anyio
async def test_the_model_sees_the_reply_of_a_call_to_an_unknown_tool():
    script = say_what_the_tool_said(tool_call("reset_universe", "{}"))
    async with episode_servers(script) as client:
        reply = await client.post(AGENT, "/v1/responses", json={"input": "Reset.", "tools": TOOLS})
    assert reply.status == 200, reply.text
    _, output, message = reply.body["output"]
    assert json.loads(output["output"]) == {"detail": "Not Found"}
    assert "Not Found" in message["content"][0]["text"]


@pytest.mark.anyio
async def test_the_loop_stops_after_max_steps_when_the_model_never_answers():
    async with episode_servers(lambda messages: tool_call("get_counter_value", "{}"), max_steps=3) as client:
        reply = await client.post(AGENT, "/v1/responses", json={"input": "Loop.", "tools": TOOLS})
    assert reply.status == 200, reply.text
    assert [item["type"] for item in reply.body["output"]] == ["function_call", "function_call_output"] * 3


@pytest.mark.anyio
async def test_run_threads_the_session_cookies_through_seed_responses_and_verify():
    async with episode_servers() as client:
        reply = await client.post(AGENT, "/run", json=ROW)
    assert reply.status == 200, reply.text
    verdict = reply.body
    assert (verdict["reward"], verdict["count"], verdict["expected_count"]) == (1.0, 17, 17)
    names = [item.get("name") for item in verdict["response"]["output"] if item["type"] == "function_call"]
    assert names == ["increment_counter", "increment_counter", "get_counter_value"]
    assert f"{COUNTER}_session" in reply.cookies


@pytest.mark.anyio
async def test_run_hands_back_one_agent_session_cookie():
    async with episode_servers() as client:
        async with client.session().post(client.url(AGENT, "/run"), json=ROW) as reply:
            assert reply.status == 200, await reply.text()
            set_cookies = reply.headers.getall("Set-Cookie", [])
    assert [cookie.split("=")[0] for cookie in set_cookies].count(f"{AGENT}_session") == 1


@pytest.mark.anyio
async def test_run_with_a_model_backend_that_is_down_is_a_502_naming_the_hop():
    async with episode_servers(model_url=f"http://127.0.0.1:{free_port()}/v1") as client:
        reply = await client.post(AGENT, "/run", json=ROW)
    assert reply.status == 502
    assert reply.body["detail"].startswith(f"{AGENT}/v1/responses answered 502")
    assert "unreachable" in reply.body["detail"]


@pytest.mark.anyio
async def test_responses_hands_the_resources_servers_cookie_back_to_the_caller():
    async with episode_servers() as client:
        seed = await client.post(COUNTER, "/seed_session", json=ROW)
        reply = await client.post(AGENT, "/v1/responses", json=ROW["responses_create_params"], cookies=seed.cookies)
        assert reply.status == 200, reply.text
        assert f"{COUNTER}_session" in reply.cookies
        verify = await client.post(COUNTER, "/verify", json={**ROW, "response": reply.body}, cookies=reply.cookies)
    assert (verify.body["reward"], verify.body["count"]) == (1.0, 17)


@pytest.mark.anyio
async def test_run_passes_a_lost_session_on_as_410():
    lost = FastAPI()

    @lost.post("/seed_session")
    async def seed_session() -> JSONResponse:
        return JSONResponse({"detail": "worker w1 is gone"}, 410)

    instances = gym_config.parse(config({"base_url": "http://127.0.0.1:9/v1"}))
    client = ReadingClient(instances)
    async with serving(lost, instances[COUNTER].port), serving(SimpleAgent.for_instance(AGENT, instances).build_app(), instances[AGENT].port):
        reply = await client.post(AGENT, "/run", json=ROW)
    await client.close()
    assert reply.status == 410
    assert reply.body["detail"] == f'{COUNTER}/seed_session answered 410: {{"detail":"worker w1 is gone"}}'
