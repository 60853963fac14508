"""Servers written in upstream NeMo Gym's style (tests/upstream_style), unedited, routed at 4 workers each."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import read_rows, run_episodes
from nemo_gym.config.paths import INSTALL_ROOT, search_roots
from nemo_gym.env import CONFIG_PATH_ENV, EXTRA_ROOTS_ENV, INSTANCE_ENV
from nemo_gym.process import discovery
from nemo_gym.process.launcher import STOP_GRACE_SECONDS, Launcher

ROOT = Path(__file__).resolve().parents[1] / "upstream_style"
CONFIG = ROOT / "configs" / "upstream_style.yaml"
DATA = ROOT / "resources_servers" / "upstream_counter" / "data" / "example.jsonl"
EPISODES = 200


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    instances = discovery.load([CONFIG], roots=search_roots([ROOT]))
    launcher = Launcher(instances, gym_config.free_port()).start(timeout=180)
    try:
        yield launcher
    finally:
        launcher.stop()


async def play(instances: dict, rows: list[dict]) -> list[dict]:
    client = ReadingClient(instances)
    try:
        return await run_episodes(client, "upstream_agent", rows, concurrency=EPISODES, progress=False)
    finally:
        await client.close()


def test_upstream_style_agent_model_and_resources_server_score_every_episode_at_four_workers(launcher):
    rows = read_rows(DATA, num_repeats=EPISODES // len(read_rows(DATA)))
    results = asyncio.run(play(launcher.instances, rows))
    assert len(results) == EPISODES
    assert [result.get("error") for result in results if result.get("reward") != 1.0] == []
    assert all(result["found_count"] == result["expected_count"] for result in results)


def test_the_agent_proxies_aggregate_metrics_to_the_resources_servers_hooks(launcher):
    rows = [{"reward": 1.0, "_ng_task_index": 0}, {"reward": 0.0, "_ng_task_index": 0}, {"reward": 1.0, "_ng_task_index": 1}]

    async def aggregate() -> dict:
        client = ReadingClient(launcher.instances)
        try:
            return (await client.post("upstream_agent", "/aggregate_metrics", json={"verify_responses": rows})).body
        finally:
            await client.close()

    metrics = asyncio.run(aggregate())
    assert metrics["key_metrics"] == {"mean/reward": pytest.approx(2 / 3), "pass@2/accuracy": 100.0}
    assert metrics["agent_metrics"]["pass@1/accuracy"] == pytest.approx(75.0)


def test_every_worker_answers_the_reverify_mode_its_config_class_declares(launcher):
    url = f"{launcher.instances['upstream_counter'].url}/reverify_mode"
    for _ in range(8):
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert json.load(reply) == "unsupported"


def test_python_app_py_serves_the_instance_with_its_workers(tmp_path):
    """Upstream's start, `python app.py` ending in `Cls.run_webserver()`, with the launcher's environment."""
    port = gym_config.free_port()
    config = {"counter": {"resources_servers": {"upstream_counter": {"port": port, "num_workers": 2}}}}
    (tmp_path / "config.json").write_text(json.dumps(gym_config.parse(config)["counter"].to_dict()))
    env = {
        **os.environ,
        CONFIG_PATH_ENV: str(tmp_path / "config.json"),
        INSTANCE_ENV: "counter",
        EXTRA_ROOTS_ENV: str(ROOT),
        "PYTHONPATH": str(INSTALL_ROOT),
    }
    app_py = ROOT / "resources_servers" / "upstream_counter" / "app.py"
    process = subprocess.Popen([sys.executable, str(app_py)], env=env, cwd=tmp_path, start_new_session=True)
    try:
        assert asyncio.run(count_to_five(f"http://127.0.0.1:{port}")) == 5
    finally:
        # As the launcher stops a server: SIGTERM to its process, time to shut down, then the group killed.
        process.terminate()
        try:
            process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


async def count_to_five(url: str) -> int:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        for _ in range(300):
            try:
                async with http.get(f"{url}/") as reply:
                    if reply.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.2)
        async with http.post(f"{url}/seed_session", json={"initial_count": 2}) as reply:
            cookies = reply.cookies
        for _ in range(3):
            async with http.post(f"{url}/increment_counter", json={"count": 1}, cookies=cookies) as reply:
                cookies = reply.cookies
        async with http.post(f"{url}/get_counter_value", json={}, cookies=cookies) as reply:
            return (await reply.json())["count"]
