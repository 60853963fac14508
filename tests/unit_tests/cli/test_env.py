"""`gym env validate` (a config checked without starting anything) and `gym env status` (the servers of a running
`gym env start`, each asked whether it answers), as upstream's do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from nemo_gym.cli.main import main
from nemo_gym.config import REPO_ROOT, free_port
from nemo_gym.process.discovery import load
from nemo_gym.process.launcher import Launcher

COUNTER_CONFIG = REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "configs" / "example_session_state_mgmt.yaml"


def test_gym_env_validate_says_a_config_is_valid_without_starting_a_server(capsys):
    assert main(["env", "validate", "--config", str(COUNTER_CONFIG)]) == 0
    out = capsys.readouterr().out
    assert "✓ Config is valid." in out


def test_gym_env_validate_names_the_file_and_key_of_a_config_typo(tmp_path, capsys):
    data = yaml.safe_load(COUNTER_CONFIG.read_text())
    data["example_session_state_mgmt"]["resources_servers"]["example_session_state_mgmt"]["num_worker"] = 2
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(data))
    assert main(["env", "validate", "--config", str(tmp_path / "typo.yaml")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "typo.yaml") in err and "num_worker" in err


def test_gym_env_validate_of_a_manifest_workload_says_manifests_are_not_supported_here(capsys):
    assert main(["env", "validate", "abstention"]) == 2
    assert "manifest-backed workloads are not supported here" in capsys.readouterr().err


@pytest.fixture(scope="module")
def running():
    """The counter (1 worker) and the scripted backend under one head; the backend's process group then killed by its id."""
    data = yaml.safe_load(COUNTER_CONFIG.read_text())
    config = {
        "counter": {"resources_servers": {"example_session_state_mgmt": {"entrypoint": "app.py", "num_workers": 1}}},
        "scripted_backend": data["scripted_backend"],
    }
    with Launcher(load([], initial=("test", config)), free_port()) as launcher:
        backend = launcher.processes["scripted_backend"]
        os.killpg(backend.pid, signal.SIGKILL)
        backend.wait(timeout=30)
        yield launcher


def test_gym_env_status_json_lists_each_server_with_whether_it_answers(running, capsys):
    assert main(["env", "status", "--json", "--head-url", running.head_url]) == 0
    servers = {server["process_name"]: server for server in json.loads(capsys.readouterr().out)}
    assert servers["counter"]["status"] == "success"
    assert servers["counter"]["server_type"] == "resources_servers" and servers["counter"]["name"] == "example_session_state_mgmt"
    assert servers["counter"]["url"] == running.instances["counter"].url
    assert servers["scripted_backend"]["status"] == "connection_error"


def test_gym_env_status_prints_each_server_and_counts_the_healthy_ones(running):
    done = subprocess.run([sys.executable, "-m", "nemo_gym.cli.main", "env", "status", "--head-url", running.head_url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "✓ counter (resources_servers/example_session_state_mgmt)" in done.stdout
    assert "✗ scripted_backend (responses_api_models/scripted_backend)" in done.stdout
    assert "2 servers found (1 healthy, 1 unhealthy)" in done.stdout


def test_gym_env_status_without_a_running_head_says_no_servers_are_running(capsys):
    assert main(["env", "status", "--head-url", f"http://127.0.0.1:{free_port()}"]) == 0
    captured = capsys.readouterr()
    assert "No NeMo Gym servers found running." in captured.out
    assert "is `gym env start` running?" in captured.err
