"""Without ``ray_head_node_address``: one local Ray cluster, started only by the process that needs it and
joined by every other (upstream's ``initialize_ray``; ``gym env start`` with a server that imports ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nemo_gym import config as gym_config
from nemo_gym.env import EXTRA_ROOTS_ENV
from tests.hosts import descendants

pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")

UPSTREAM_STYLE = gym_config.REPO_ROOT / "tests" / "upstream_style"
SESSIONS = 40
TIMEOUT_SECONDS = 180
STOP_SECONDS = 60

INITIALIZE_TWICE_THEN_A_CHILD_JOINS = """
import json, os, subprocess, sys
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.server_utils import initialize_ray
import ray
initialize_ray()
initialize_ray()
address = get_global_config_dict()["ray_head_node_address"]
with open(sys.argv[1], "w") as file:
    json.dump({"ray_head_node_address": address}, file)
child = "import json, ray; from nemo_gym.server_utils import initialize_ray; initialize_ray(); print(json.dumps([ray.get_runtime_context().gcs_address, len(ray.nodes())]))"
out = subprocess.run([sys.executable, "-c", child], env={**os.environ, "NEMO_GYM_CONFIG_PATH": sys.argv[1]}, capture_output=True, text=True, timeout=120)
print(json.dumps({"address": address, "own": ray.get_runtime_context().gcs_address, "child": json.loads(out.stdout.splitlines()[-1]), "child_said": out.stdout}))
"""


def env() -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(gym_config.REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def test_initialize_ray_starts_a_cluster_writes_its_address_into_the_config_and_a_child_given_it_joins_that_one(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    child_config = tmp_path / "child.json"
    result = subprocess.run(
        [sys.executable, "-c", INITIALIZE_TWICE_THEN_A_CHILD_JOINS, str(child_config)],
        env={**env(), "NEMO_GYM_CONFIG_PATH": str(tmp_path / "config.json")}, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(next(line for line in reversed(result.stdout.splitlines()) if line.startswith("{")))
    assert "Ray already initialized" in result.stdout
    assert said["address"] == said["own"] == said["child"][0] and said["child"][1] == 1
    assert f"Connecting to Ray cluster at specified address: {said['address']}" in said["child_said"]


def gcs_servers(pids: set[int]) -> set[int]:
    return {pid for pid in pids if "gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")}


def test_gym_env_start_starts_one_local_cluster_for_a_ray_server_whose_workers_all_join_it_and_stops_it(tmp_path):
    port = gym_config.free_port()
    config = {"upstream_ray_verify": {"resources_servers": {"upstream_ray_verify": {"port": port, "num_workers": 2, "domain": "math"}}}}
    (tmp_path / "gym.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "nemo_gym.cli.main", "env", "start", "--config", str(tmp_path / "gym.yaml"), "--head-port", str(gym_config.free_port())]
    with open(tmp_path / "gym.log", "wb") as log:
        gym = subprocess.Popen(command, env={**env(), EXTRA_ROOTS_ENV: str(UPSTREAM_STYLE)}, stdout=log, stderr=subprocess.STDOUT, cwd=gym_config.REPO_ROOT)
    try:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while "All servers are up." not in (tmp_path / "gym.log").read_text(errors="replace"):
            assert gym.poll() is None and time.monotonic() < deadline, (tmp_path / "gym.log").read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        started = descendants(gym.pid)
        assert len(gcs_servers(started)) == 1
        client = subprocess.run([sys.executable, "-m", "tests.e2e.ray.products", f"http://127.0.0.1:{port}", str(SESSIONS)], env=env(), capture_output=True, text=True, timeout=TIMEOUT_SECONDS, cwd=gym_config.REPO_ROOT)
        results = json.loads(client.stdout.splitlines()[-1])
        assert [r for r in results if r["status"] != 200 or r["body"]["reward"] != r["expected_reward"]] == []
        # No worker started a cluster of its own for its Ray tasks (Ray's own auto-init would).
        started = descendants(gym.pid)
        assert len(gcs_servers(started)) == 1
        gym.send_signal(signal.SIGTERM)
        assert gym.wait(timeout=STOP_SECONDS) == 0, (tmp_path / "gym.log").read_text(errors="replace")[-3000:]
        deadline = time.monotonic() + STOP_SECONDS
        while (left := {pid for pid in started if Path(f"/proc/{pid}").exists()}) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == set()
    finally:
        if gym.poll() is None:
            gym.kill()
            gym.wait()

