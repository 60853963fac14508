"""The legacy /run relay end to end at one worker: relay -> simple_agent -> counter, the scripted backend as policy."""

from __future__ import annotations

import asyncio

import pytest

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import run_episodes
from nemo_gym.config import REPO_ROOT
from nemo_gym.process.launcher import Launcher
from resources_servers.example_session_state_mgmt.episodes import plus_one_plus_two

COUNTER = "example_session_state_mgmt"
RELAY = "legacy_agent"
CONFIGS = [
    REPO_ROOT / "resources_servers" / COUNTER / "configs" / f"{COUNTER}.yaml",
    REPO_ROOT / "responses_api_agents" / "legacy_agent" / "configs" / "legacy_agent.yaml",
]
EPISODES = 200


def counter_behind_relay(**counter_settings) -> dict:
    """The shipped counter config merged with the relay's, think time between model turns."""
    shipped, _ = gym_config.resolve(CONFIGS)
    return gym_config.merge(
        shipped,
        {
            COUNTER: {"resources_servers": {COUNTER: counter_settings}},
            "scripted_backend": {"responses_api_models": {"scripted_backend": {"think_time_ms": 20}}},
        },
    )


def run_through_relay(instances: dict) -> list[dict]:
    async def run() -> list[dict]:
        client = ReadingClient(instances)
        try:
            return await run_episodes(client, RELAY, plus_one_plus_two(EPISODES), EPISODES, progress=False)
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def one_worker(start_module_servers) -> Launcher:
    """The relay's stack with the counter at one worker, started once: every /run is a session of its own."""
    return start_module_servers(counter_behind_relay(num_workers=1))


def test_run_episodes_through_the_relay_all_score_at_one_worker(one_worker):
    results = run_through_relay(one_worker.instances)
    assert sum(result["reward"] == 1.0 for result in results) == EPISODES, [r.get("error") for r in results if "error" in r][:3]


def test_the_relay_hands_back_the_cookies_of_every_server_the_session_touched(one_worker):
    launcher = one_worker

    async def one_episode():
        client = ReadingClient(launcher.instances)
        try:
            return await client.post(RELAY, "/run", json=plus_one_plus_two(EPISODES)[0])
        finally:
            await client.close()

    reply = asyncio.run(one_episode())
    assert reply.ok and reply.body["reward"] == 1.0
    assert {f"{COUNTER}_session", f"{COUNTER}_simple_agent_session"} <= set(reply.cookies)
