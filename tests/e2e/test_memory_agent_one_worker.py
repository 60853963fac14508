"""memory_agent end to end at one worker: 200 concurrent two-turn conversations, the scripted backend as model."""

from __future__ import annotations

import asyncio

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import REPO_ROOT
from responses_api_agents.memory_agent.conversations import run_conversations

AGENT = "memory_agent"
CONFIG = REPO_ROOT / "responses_api_agents" / AGENT / "configs" / f"{AGENT}.yaml"
CONVERSATIONS = 200


def memory_stack(**agent_settings) -> dict:
    """The shipped config (memory_agent, scripted model) with these agent settings and think time in the model."""
    shipped, _ = gym_config.resolve([CONFIG])
    return gym_config.merge(
        shipped,
        {
            AGENT: {"responses_api_agents": {AGENT: agent_settings}},
            "scripted_backend": {"responses_api_models": {"scripted_backend": {"think_time_ms": 20}}},
        },
    )


def converse(instances: dict) -> list[dict]:
    async def run() -> list[dict]:
        client = ReadingClient(instances)
        try:
            return await run_conversations(client, AGENT, CONVERSATIONS, CONVERSATIONS)
        finally:
            await client.close()

    return asyncio.run(run())


def test_200_two_turn_conversations_all_continue_at_one_worker(start_servers):
    launcher = start_servers(memory_stack(num_workers=1))
    assert converse(launcher.instances) == [{"continued": True}] * CONVERSATIONS
