"""nemo_gym.ray_cluster.keeper: one replica on its node, kept by a launcher of that one instance: ``ready`` once its
server serves, then kept until SIGTERM, which stops the server and exits 0; a server that cannot start is an exit 1.

Run here as its ``ReplicaNode`` actor runs it, as a process of its own, without Ray (the keeper uses none)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

from nemo_gym import config as gym_config
from nemo_gym.ray_cluster.replicas import READY

COUNTER = "example_session_state_mgmt"


def keeper(tmp_path, port: int, **settings) -> subprocess.Popen:
    config = {"counter": {"resources_servers": {COUNTER: {"entrypoint": "app.py", "host": "127.0.0.1", "port": port, **settings}}}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(gym_config.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.ray_cluster.keeper", str(path), "counter", "90"],
        cwd=gym_config.REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5):
            return True
    except OSError:
        return False


def test_a_kept_replica_is_ready_once_it_serves_and_sigterm_stops_it_and_exits_0(tmp_path):
    port = gym_config.free_port()
    process = keeper(tmp_path, port)
    try:
        assert process.stdout.readline().strip() == READY
        assert answers(port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert not answers(port)
    finally:
        process.kill()
        process.wait()


def test_a_replica_whose_server_cannot_start_exits_1_saying_why(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        process = keeper(tmp_path, taken.getsockname()[1])
        try:
            out, err = process.communicate(timeout=120)
        finally:
            process.kill()
    assert process.returncode == 1 and READY not in out.split()
    assert err.strip()
