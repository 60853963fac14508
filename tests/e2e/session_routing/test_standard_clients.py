"""Every standard client is routed: counter episodes at 4 and 8 workers, each client keeping cookies its own way.

The counters at 4 and at 8 workers start once for the module; every client runs 200 episodes against
each, with a new connection per request and with kept-alive connections.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import aiohttp

import httpx
import pytest
from openai import AsyncOpenAI

from nemo_gym.sessions.secret import session_secret
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, run_episodes
from tests.e2e.test_memory_agent_one_worker import AGENT, CONVERSATIONS, memory_stack
from tests.session_cookies import cookie_owner

COUNTER = "example_session_state_mgmt"
EPISODES = 200
SPREAD_SESSIONS = 800
WORKERS = (4, 8)
# The SDK keeps its cookies in an httpx jar, which httpx_jar's episodes run here; the SDK itself is run
# routed by the memory agent's conversations below and against the durable counter in test_durable_standard_clients.
EPISODE_CLIENTS = sorted(set(CLIENTS) - {"openai_sdk"})


def counter_name(workers: int) -> str:
    return f"counter_{workers}"


@pytest.fixture(scope="module")
def counters(start_module_servers):
    config = {counter_name(n): {"resources_servers": {COUNTER: {"num_workers": n, "place_sessions": True}}} for n in WORKERS}
    return start_module_servers(config, timeout=120).instances


@pytest.mark.parametrize("connections", ["fresh", "keep_alive"])
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("client", EPISODE_CLIENTS)
def test_every_episode_of_every_standard_client_keeps_its_count(counters, client, workers, connections):
    url = counters[counter_name(workers)].url
    results = asyncio.run(run_episodes(CLIENTS[client], url, list(range(EPISODES)), connections == "fresh", EPISODES))
    errors = [result["error"] for result in results if "error" in result]
    assert sum(result["reward"] == 1.0 for result in results) == EPISODES, errors[:3]


@pytest.mark.parametrize("workers", WORKERS)
def test_new_sessions_spread_over_the_workers_within_ten_percent_of_the_mean(counters, workers):
    """Sessions live where placement puts them, not where the kernel's uneven accept happens to land."""
    name = counter_name(workers)

    async def seed_all() -> list[dict[str, str]]:
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as http:

            async def seed(start: int) -> dict[str, str]:
                async with http.post(counters[name].url + "/seed_session", json={"initial_count": start}) as reply:
                    assert reply.status == 200
                    return {key: morsel.value for key, morsel in reply.cookies.items()}

            return await asyncio.gather(*(seed(start) for start in range(SPREAD_SESSIONS)))

    secret = session_secret(name)
    owners = Counter(cookie_owner(cookies, name, secret) for cookies in asyncio.run(seed_all()))
    mean = SPREAD_SESSIONS / workers
    assert len(owners) == workers and all(abs(count - mean) <= 0.1 * mean for count in owners.values()), owners


@pytest.fixture(scope="module")
def memory_agent(start_module_servers):
    return start_module_servers(memory_stack(), timeout=120).instances[AGENT]


async def openai_conversation(url: str, number: int) -> bool:
    """Two turns through the official SDK, whose httpx client keeps the cookie the first reply gave."""
    first, second = 1000 + number, 5000 + number
    # httpx's default 5 s is too short a connect for 200 at once on a loaded machine; 60 s as the standard clients.
    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=60) as http:
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
