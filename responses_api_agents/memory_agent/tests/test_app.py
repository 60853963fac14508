"""memory_agent: a second /v1/responses call of a session continues the conversation of the first."""

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from nemo_gym import config as gym_config
from nemo_gym.config import free_port
from nemo_gym.openai_utils import (
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
    new_response,
)
from responses_api_agents.memory_agent.app import MemoryAgent
from tests.unit_tests.in_process_server import serving


class Model:
    """The model server: a real server that answers 'reply N' and records the input of every call."""

    def __init__(self) -> None:
        self.status = 200
        self.inputs: list[list[dict]] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/responses")
        async def responses(body: dict) -> JSONResponse:
            self.inputs.append(body["input"])
            if self.status != 200:
                return JSONResponse({"detail": "backend down"}, self.status)
            message = NeMoGymResponseOutputMessage(content=[NeMoGymResponseOutputText(text=f"reply {len(self.inputs)}")])
            response = new_response(NeMoGymResponseCreateParamsNonStreaming.model_validate(body), output=[message])
            return JSONResponse(response.model_dump(mode="json"))

        return app


@contextlib.asynccontextmanager
async def memory_agent(model: Model, **settings) -> AsyncIterator[str]:
    """The agent and ``model`` on real servers; yields the agent's URL."""
    port = free_port()
    data = {
        "memory_agent": {"responses_api_agents": {"memory_agent": {"model_server": {"type": "responses_api_models", "name": "policy_model"}, **settings}}},
        "policy_model": {"responses_api_models": {"scripted_backend": {"host": "127.0.0.1", "port": port}}},
    }
    agent = MemoryAgent.for_instance("memory_agent", gym_config.parse(data))
    async with serving(model.app(), port), serving(agent.build_app()) as url:
        yield url


def texts(items: list[dict]) -> list[str]:
    return [item["content"] if isinstance(item["content"], str) else item["content"][0]["text"] for item in items]


@pytest.mark.anyio
async def test_the_second_turn_continues_the_first():
    model = Model()
    async with memory_agent(model) as url, httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/v1/responses", json={"input": "My name is Ada."})
        assert first.status_code == 200 and first.json()["output"][0]["content"][0]["text"] == "reply 1"
        await client.post("/v1/responses", json={"input": [{"role": "user", "content": "What is my name?"}]})
    assert texts(model.inputs[0]) == ["My name is Ada."]
    assert texts(model.inputs[1]) == ["My name is Ada.", "reply 1", "What is my name?"]


@pytest.mark.anyio
async def test_sessions_do_not_share_memory():
    model = Model()
    async with memory_agent(model) as url, httpx.AsyncClient(base_url=url) as ada, httpx.AsyncClient(base_url=url) as bob:
        await ada.post("/v1/responses", json={"input": "I am Ada."})
        await bob.post("/v1/responses", json={"input": "I am Bob."})
        await bob.post("/v1/responses", json={"input": "Who am I?"})
    assert texts(model.inputs[2]) == ["I am Bob.", "reply 2", "Who am I?"]


@pytest.mark.anyio
async def test_a_failed_turn_is_not_remembered_and_answers_502():
    model = Model()
    async with memory_agent(model) as url, httpx.AsyncClient(base_url=url) as client:
        await client.post("/v1/responses", json={"input": "one"})
        model.status = 500
        assert (await client.post("/v1/responses", json={"input": "lost"})).status_code == 502
        model.status = 200
        await client.post("/v1/responses", json={"input": "two"})
    assert texts(model.inputs[-1]) == ["one", "reply 1", "two"]


@pytest.mark.anyio
async def test_past_max_conversations_the_least_recently_used_conversation_is_forgotten():
    model = Model()
    async with memory_agent(model, max_conversations=2) as url, contextlib.AsyncExitStack() as stack:
        first, second, third = [await stack.enter_async_context(httpx.AsyncClient(base_url=url)) for _ in range(3)]
        await first.post("/v1/responses", json={"input": "first"})
        await second.post("/v1/responses", json={"input": "second"})
        await first.post("/v1/responses", json={"input": "first again"})
        await third.post("/v1/responses", json={"input": "third"})
        await first.post("/v1/responses", json={"input": "first once more"})
        await second.post("/v1/responses", json={"input": "second again"})
    assert texts(model.inputs[4]) == ["first", "reply 1", "first again", "reply 3", "first once more"]
    assert texts(model.inputs[5]) == ["second again"]


@pytest.mark.anyio
async def test_run_says_there_is_no_environment():
    async with memory_agent(Model()) as url, httpx.AsyncClient(base_url=url) as client:
        reply = await client.post("/run", json={"responses_create_params": {"input": "x"}})
    assert reply.status_code == 501 and "/v1/responses" in reply.json()["detail"]
