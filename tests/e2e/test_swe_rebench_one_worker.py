"""swe_rebench end to end at one worker: legacy relay -> simple_agent -> swe_rebench, the scripted backend as policy."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import yaml

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import read_rows, run_episodes
from nemo_gym.config import REPO_ROOT
from tests.programs import needs

# Every test here starts swe_rebench, whose commands run in a bubblewrap jail.
pytestmark = needs("bwrap")

SWE = "swe_rebench"
RELAY = "swe_rebench_legacy_agent"
CONFIG = REPO_ROOT / "resources_servers" / SWE / "configs" / "swe_rebench.yaml"
DATA = REPO_ROOT / "resources_servers" / SWE / "data" / "example.jsonl"
EPISODES = 200


def overrides(sandbox_dir: Path, **settings) -> dict:
    """Sandboxes in ``sandbox_dir``, the given swe_rebench settings, and think time between model turns."""
    return {
        SWE: {"resources_servers": {SWE: {"sandbox_dir": str(sandbox_dir), **settings}}},
        "scripted_backend": {"responses_api_models": {"scripted_backend": {"think_time_ms": 20}}},
    }


def swe_stack(sandbox_dir: Path, **settings) -> dict:
    """The shipped config (swe_rebench, simple_agent, relay, scripted policy) with ``overrides``."""
    shipped, _ = gym_config.resolve([CONFIG])
    return gym_config.merge(shipped, overrides(sandbox_dir, **settings))


def sandboxes_in(sandbox_dir: Path) -> list[Path]:
    """The sandboxes in an instance's sandbox root, whichever worker's directory holds them."""
    return list(sandbox_dir.glob("worker-*/sandbox-*"))


def episodes(count: int = EPISODES) -> list[dict]:
    rows = read_rows(DATA)
    return [rows[number % len(rows)] for number in range(count)]


def run_through_relay(instances: dict, rows: list[dict]) -> list[dict]:
    async def run() -> list[dict]:
        client = ReadingClient(instances)
        try:
            return await run_episodes(client, RELAY, rows, len(rows), progress=False)
        finally:
            await client.close()

    return asyncio.run(run())


# The README's demo command with fewer repeats: one worker holds every session, so 50 episodes show what 200 do.
DEMO_REPEATS = 10


def test_the_demo_through_the_relay_scores_every_episode_and_leaves_no_sandbox(tmp_path):
    sandbox_dir = tmp_path / "sandboxes"
    override = tmp_path / "one_worker.yaml"
    override.write_text(yaml.safe_dump(overrides(sandbox_dir, num_workers=1)))
    output = tmp_path / "rollouts.jsonl"
    command = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--config", str(CONFIG), "--config", str(override),
        "--agent", RELAY, "--input", str(DATA), "--num-repeats", str(DEMO_REPEATS), "--concurrency", "200", "--output", str(output),
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert finished.returncode == 0, finished.stderr
    results = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(results) == DEMO_REPEATS * len(DATA.read_text().splitlines())
    assert f'"1.0": {len(results)}' in finished.stdout, finished.stdout
    assert all(result["patch"].startswith("diff --git") and result["tests_passed"] for result in results)
    assert not sandbox_dir.exists()


def test_sandboxes_of_sessions_never_verified_are_removed_when_the_server_stops(start_servers, tmp_path):
    sandbox_dir = tmp_path / "sandboxes"
    launcher = start_servers(swe_stack(sandbox_dir, num_workers=1))

    async def seed_three() -> None:
        client = ReadingClient(launcher.instances)
        try:
            for row in episodes(3):
                reply = await client.post(SWE, "/seed_session", json=row)
                assert reply.ok, reply.text
        finally:
            await client.close()

    asyncio.run(seed_three())
    assert len(sandboxes_in(sandbox_dir)) == 3
    launcher.stop()
    assert not sandbox_dir.exists()
