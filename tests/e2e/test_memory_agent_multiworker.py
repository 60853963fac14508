"""memory_agent at 4 workers: every conversation continues, whichever worker each turn reaches."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import aiohttp
import pytest

from nemo_gym.client.reading import ReadingClient, ServerReply
from nemo_gym.process.launcher import Launcher
from nemo_gym.sessions.secret import session_secret
from responses_api_agents.memory_agent.conversations import first_turn, run_conversations, second_turn
from tests.e2e.session_routing.test_counter_routing import worker_pid_of_owner
from tests.e2e.test_memory_agent_one_worker import AGENT, CONVERSATIONS, converse, memory_stack
from tests.session_cookies import cookie_owner


@pytest.fixture(scope="module")
def four_workers(start_module_servers) -> Launcher:
    """The stack at 4 workers, started once: each conversation is a session of its own, so the tests' conversations
    do not meet; the last test SIGKILLs one of its workers."""
    return start_module_servers(memory_stack())


def test_200_two_turn_conversations_all_continue_at_four_workers(four_workers):
    assert four_workers.instances[AGENT].num_workers == 4
    assert converse(four_workers.instances) == [{"continued": True}] * CONVERSATIONS


def test_conversations_break_with_routing_switched_off(start_servers):
    launcher = start_servers(memory_stack(route_sessions=False))

    async def run() -> list[dict]:
        client = ReadingClient(launcher.instances)
        # Each turn on a connection of its own, 20 conversations at a time: a burst of connections to a kept-alive
        # pool can be accepted whole by one worker, and then every conversation would continue by luck.
        client._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar())
        try:
            return await run_conversations(client, AGENT, CONVERSATIONS, 20)
        finally:
            await client.close()

    results = asyncio.run(run())
    assert [result.get("error") for result in results if "error" in result] == []
    assert sum(result["continued"] for result in results) < CONVERSATIONS


def test_conversations_of_a_sigkilled_worker_continue_on_the_workers_that_adopt_them(four_workers):
    """SIGKILLs a worker of the shared stack: the last test of the module to use it."""
    launcher = four_workers
    secret = session_secret(AGENT)

    async def run() -> tuple[str, list[str], list[dict]]:
        client = ReadingClient(launcher.instances)
        try:
            firsts = await asyncio.gather(*(first_turn(client, AGENT, number) for number in range(CONVERSATIONS)))
            assert all(isinstance(first, ServerReply) for first in firsts), [f for f in firsts if isinstance(f, dict)][:3]
            owners = [cookie_owner(first.cookies, AGENT, secret) for first in firsts]
            victim = Counter(owners).most_common(1)[0][0]
            pid = worker_pid_of_owner(launcher.processes[AGENT].pid, victim)
            os.kill(pid, signal.SIGKILL)
            async with asyncio.timeout(10):
                while os.path.exists(f"/proc/{pid}/cmdline"):
                    await asyncio.sleep(0.05)
            seconds = await asyncio.gather(*(second_turn(client, AGENT, number, first) for number, first in enumerate(firsts)))
            return victim, owners, seconds
        finally:
            await client.close()

    victim, owners, seconds = asyncio.run(run())
    assert owners.count(victim) > 0
    assert seconds == [{"continued": True}] * CONVERSATIONS
