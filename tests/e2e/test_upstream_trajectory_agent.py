"""An agent in the shape of upstream's current simple_agent (tests/upstream_style/.../trajectory_agent), with
model-call capture on, in front of this project's counter, both at 4 workers: every episode scores, and
each carries upstream's trajectory record for its own rollout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import read_rows, run_episodes
from nemo_gym.config.paths import INSTALL_ROOT, search_roots
from nemo_gym.global_config import OBSERVABILITY_ENABLED_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.process.launcher import Launcher
from nemo_gym.process import discovery
from nemo_gym.rollout_collection import NG_TRAJECTORY_KEY, _attach_trajectory_record
from nemo_gym.rollout_observability import TrajectoryRecord

ROOT = Path(__file__).resolve().parents[1] / "upstream_style"
CONFIG = ROOT / "configs" / "trajectory_agent_counter.yaml"
DATA = INSTALL_ROOT / "resources_servers" / "example_session_state_mgmt" / "data" / "example.jsonl"
EPISODES = 200


@pytest.fixture(scope="module")
def results() -> Iterator[list[tuple[dict, dict]]]:
    tasks = read_rows(DATA)
    repeats = -(-EPISODES // len(tasks))
    rows = [
        {**task, TASK_INDEX_KEY_NAME: task_index, ROLLOUT_INDEX_KEY_NAME: rollout_index}
        for rollout_index in range(repeats)
        for task_index, task in enumerate(tasks)
    ][:EPISODES]
    instances = discovery.load([CONFIG], roots=search_roots([ROOT]))
    launcher = Launcher(instances, gym_config.free_port(), settings={OBSERVABILITY_ENABLED_KEY_NAME: True}).start(timeout=240)

    async def play() -> list[dict]:
        client = ReadingClient(launcher.instances)
        try:
            return await run_episodes(client, "trajectory_agent", rows, concurrency=EPISODES, progress=False)
        finally:
            await client.close()

    try:
        yield list(zip(rows, asyncio.run(play())))
    finally:
        launcher.stop()


def test_every_episode_through_the_upstream_shaped_agent_scores_at_four_workers(results):
    assert len(results) == EPISODES
    assert [result.get("error") for _, result in results if result.get("reward") != 1.0] == []


def test_each_episode_carries_the_trajectory_of_its_own_rollout_with_its_tool_calls(results):
    for row, result in results:
        _attach_trajectory_record(row, result)
        record = TrajectoryRecord.model_validate(result[NG_TRAJECTORY_KEY])
        expected = f"{row[TASK_INDEX_KEY_NAME]}-{row[ROLLOUT_INDEX_KEY_NAME]}"
        assert (record.task_id, record.rollout_id) == (str(row[TASK_INDEX_KEY_NAME]), expected)
        assert {(turn.task_id, turn.rollout_id) for turn in record.turns} == {(record.task_id, expected)}
        assert len(record.turns) >= 2 and record.tool_calls
        assert {tool.status for tool in record.tool_calls} == {"completed"}
        assert [turn.turn_no for turn in record.turns] == list(range(1, len(record.turns) + 1))
        assert record.invocations[0].conversation[-1].type == "message"
