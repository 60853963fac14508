"""nemo_gym.ray_cluster.replicas: the ``ReplicaNode`` a replica's node runs, here as a plain object of this process
(Ray only makes it an actor): it starts its replica's keeper and returns once the server serves, and its stop ends
the keeper, the server with it, and leaves no run directory. Placing a replica set on a cluster's nodes is tested end
to end (tests/e2e/ray/test_ray_cluster.py)."""

from __future__ import annotations

import os
import urllib.request

from nemo_gym import config as gym_config
from nemo_gym.ray_cluster.replicas import ReplicaNode

COUNTER = "example_session_state_mgmt"


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5):
            return True
    except OSError:
        return False


def test_a_replica_node_starts_its_replica_once_it_serves_and_stop_ends_it_and_its_run_directory():
    port = gym_config.free_port()
    config = {"counter": {"resources_servers": {COUNTER: {"entrypoint": "app.py", "host": "127.0.0.1", "port": port}}}}
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(gym_config.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    node = ReplicaNode()
    try:
        node.start(config, "counter", env, 90)
        assert answers(port) and node.keeper.poll() is None
    finally:
        node.stop()
    assert node.keeper.returncode == 0
    assert not answers(port) and not node.run_dir.exists()


def test_stopping_a_node_that_started_nothing_removes_its_run_directory():
    node = ReplicaNode()
    node.stop()
    assert not node.run_dir.exists()
