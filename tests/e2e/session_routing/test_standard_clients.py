"""Every standard client is routed: counter episodes at 4 and 8 workers, each client keeping cookies its own way.

The counters at 4 and at 8 workers start once for the module; every client runs 200 episodes against
each, with a new connection per request and with kept-alive connections.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from openai import AsyncOpenAI

from nemo_gym import config as gym_config
from nemo_gym.launcher import Launcher
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, run_episodes
from tests.e2e.test_memory_agent_one_worker import AGENT, CONVERSATIONS, memory_stack

COUNTER = "example_session_state_mgmt"
EPISODES = 200
WORKERS = (4, 8)


def counter_name(workers: int) -> str:
    return f"counter_{workers}"


def started(config: dict) -> Iterator[Launcher]:
    launcher = Launcher(gym_config.parse(config), gym_config.free_port())
    launcher.start(timeout=120)
    try:
        yield launcher
    finally:
        launcher.stop()


@pytest.fixture(scope="module")
def counters():
    yield from (launcher.instances for launcher in started({counter_name(n): {"resources_servers": {COUNTER: {"num_workers": n}}} for n in WORKERS}))


@pytest.mark.parametrize("connections", ["fresh", "keep_alive"])
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_every_episode_of_every_standard_client_keeps_its_count(counters, client, workers, connections):
    url = counters[counter_name(workers)].url
    results = asyncio.run(run_episodes(CLIENTS[client], url, list(range(EPISODES)), connections == "fresh", EPISODES))
    errors = [result["error"] for result in results if "error" in result]
    assert sum(result["reward"] == 1.0 for result in results) == EPISODES, errors[:3]


@pytest.fixture(scope="module")
def memory_agent():
    yield from (launcher.instances[AGENT] for launcher in started(memory_stack()))


async def openai_conversation(url: str, number: int) -> bool:
    """Two turns through the official SDK, whose httpx client keeps the cookie the first reply gave."""
    first, second = 1000 + number, 5000 + number
    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as http:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", http_client=http, max_retries=0)
        task = f"The counter starts at 0. Add {first}, then add {second}, then get the count and tell me."
        turn_one = await client.responses.create(model="scripted", input=task)
        [call] = [item for item in turn_one.output if item.type == "function_call"]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"success": true}'}
        turn_two = await client.responses.create(model="scripted", input=[output])
        calls = [(item.name, json.loads(item.arguments)) for item in turn_two.output if item.type == "function_call"]
        return calls == [("increment_counter", {"count": second})]


def test_openai_sdk_conversations_with_memory_agent_at_four_workers_all_remember(memory_agent):
    assert memory_agent.num_workers == 4

    async def run() -> list[bool]:
        return await asyncio.gather(*(openai_conversation(memory_agent.url, number) for number in range(CONVERSATIONS)))

    assert sum(asyncio.run(run())) == CONVERSATIONS
