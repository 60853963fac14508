"""Gym on a real 3-node Ray cluster (tests/e2e/ray/conftest.py): upstream's Ray servers unchanged, and
replicas placed one per node (issue 22).

Three ``gym env start`` runs on h1, each with ``ray_head_node_address`` the cluster's head. The first
serves the upstream-style Ray server at 4 workers and the counter stack, the counter with
``num_replicas: 3, num_workers: 2``; it is stopped with SIGTERM. The second serves only the counter's
replicas, behind HAProxy round robin on the client host; one node is killed under it, then its
launcher is SIGKILLed. A third serves two replicas of the counter; one of their nodes is SIGKILLed, then
its launcher is SIGTERMed. Each way nothing the launcher started is left on any node within the bound
(every process that was new on a node while it ran, by PID), and a SIGTERMed launcher exits 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from nemo_gym.config import REPO_ROOT
from nemo_gym.env import EXTRA_ROOTS_ENV
from nemo_gym.process.launcher import children
from tests.e2e.hosts.conftest import ReplicaSet
from tests.e2e.hosts.test_replicas_across_hosts import assert_lost_and_kept, run_until_dead
from tests.e2e.ray.conftest import RayCluster
from tests.hosts import is_running, tail, run_client, run_json, run_python, start_balancer, start_gym
from tests.programs import lacking

UPSTREAM_STYLE = REPO_ROOT / "tests" / "upstream_style"
COUNTER_ROWS = REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "data" / "example.jsonl"
COUNTER = "counter"
COUNTER_PORT = 8000
RAY_VERIFY_PORT = 8001
SECRET = "ray-cluster-test-replica-secret-0123456789"
# Short: a killed node's sessions get their 410 soon (docs/replicas.md).
PEER_DEAD_AFTER_SECONDS = 5
SESSIONS = 200
START_TIMEOUT_SECONDS = 240
RUN_TIMEOUT_SECONDS = 300
# What stopping `gym env start` may take before nothing of the project runs on any node: the keeper's
# grace for its server (nemo_gym/process/launcher.py STOP_GRACE_SECONDS, 15 s) and uvicorn's graceful
# shutdown (5 s) after Ray ends a dead driver's actors; plus slack for two loaded cores.
STOP_BOUND_SECONDS = 30
STOP_SLACK_SECONDS = 30


def counter_settings() -> dict:
    return {"port": COUNTER_PORT, "num_workers": 2, "num_replicas": 3, "session_secret": SECRET, "peer_dead_after_seconds": PEER_DEAD_AFTER_SECONDS, "durable_sessions": False}


def stack_config(cluster: RayCluster) -> dict:
    """The upstream-style Ray server at 4 workers, and the counter's replicas with its agent and scripted model."""
    return {
        "ray_head_node_address": cluster.address,
        "upstream_ray_verify": {"resources_servers": {"upstream_ray_verify": {"host": cluster.nodes[0].address, "port": RAY_VERIFY_PORT, "num_workers": 4, "domain": "math"}}},
        COUNTER: {"resources_servers": {"example_session_state_mgmt": counter_settings()}},
        "counter_agent": {
            "responses_api_agents": {
                "simple_agent": {"resources_server": {"type": "resources_servers", "name": COUNTER}, "model_server": {"type": "responses_api_models", "name": "policy_model"}}
            }
        },
        "policy_model": {"responses_api_models": {"vllm_model": {"backend_server": {"type": "responses_api_models", "name": "scripted_backend"}, "model": "scripted"}}},
        "scripted_backend": {"responses_api_models": {"scripted_backend": {}}},
    }


@dataclass
class Gym:
    cluster: RayCluster
    process: subprocess.Popen
    # Each node's processes before this launcher started: any other process there since is its doing.
    before: dict[str, set[int]]

    def started(self) -> dict[str, set[int]]:
        """The processes of each node that this launcher's start and run made (by PID), running now: every
        process new there but the raylet's idle pool (``pool_worker``)."""
        started = {}
        for node in self.cluster.nodes:
            new = node.processes() - self.before[node.name]
            started[node.name] = {pid for pid in new if not pool_worker(pid, self.before[node.name])}
        return started

    def log(self) -> str:
        return tail(self.cluster.nodes[0].path("/tmp/gym.log"), 20)

    def stop(self, signum: int) -> dict[str, set[int]]:
        """Stop it with ``signum``: what it had started then, by node."""
        started = self.started()
        if self.process.poll() is None:
            self.process.send_signal(signum)
        self.process.wait(timeout=STOP_BOUND_SECONDS + STOP_SLACK_SECONDS)
        return started


def pool_worker(pid: int, before: set[int]) -> bool:
    """A worker the raylet (a process from ``before``) keeps in its pool for no job (``RAY_JOB_ID`` nil:
    not for this launcher's or any other driver), running nothing of its own: it outlives every job."""
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        no_job = b"RAY_JOB_ID=ffffffff" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return parent in before and no_job and not children(pid)


def start(cluster: RayCluster, config: dict) -> Iterator[Gym]:
    env = {**cluster.env, EXTRA_ROOTS_ENV: str(UPSTREAM_STYLE)}
    before = {node.name: node.processes() for node in cluster.nodes}
    (process,) = start_gym([(cluster.nodes[0], config)], START_TIMEOUT_SECONDS, env)
    gym = Gym(cluster, process, before)
    try:
        yield gym
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def stack(cluster: RayCluster) -> Iterator[Gym]:
    yield from start(cluster, stack_config(cluster))


@pytest.fixture(scope="module")
def replicas(cluster: RayCluster) -> Iterator[ReplicaSet]:
    """The counter's replicas alone, behind HAProxy round robin on the client host."""
    if reason := lacking("haproxy"):
        pytest.skip(f"no balancer for the replicas here: {reason}")
    config = {"ray_head_node_address": cluster.address, COUNTER: {"resources_servers": {"example_session_state_mgmt": counter_settings()}}}
    for gym in start(cluster, config):
        client = cluster.lan["client"]
        start_balancer(client, COUNTER_PORT, [(node.address, COUNTER_PORT) for node in cluster.nodes])
        replica_set = ReplicaSet(cluster.lan, cluster.nodes, f"http://client:{COUNTER_PORT}", COUNTER, SECRET, PEER_DEAD_AFTER_SECONDS)
        replica_set.gym = gym
        yield replica_set


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def left_after_stop(started: dict[str, set[int]]) -> dict[str, dict[int, str]]:
    """Which of ``started`` (PIDs by node) still run once the bound (and its slack) is over, with their
    command lines; {} as soon as none does."""
    deadline = time.monotonic() + STOP_BOUND_SECONDS + STOP_SLACK_SECONDS
    while True:
        left = {name: {pid: command_line(pid) for pid in pids if is_running(pid)} for name, pids in started.items()}
        left = {name: running for name, running in left.items() if running}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def replica_hosts(gym: Gym) -> list[str]:
    """The addresses of the nodes the head endpoint lists the counter's replicas on."""
    code = "import json; from nemo_gym.process.head import fetch_instances; print(json.dumps(fetch_instances('http://127.0.0.1:11000')['counter'].settings['replicas']))"
    return [urlsplit(url).hostname for url in run_json(gym.cluster.nodes[0], ["-c", code], 60)]


def test_an_upstream_style_server_checking_answers_in_ray_tasks_scores_every_session_at_four_workers_on_three_nodes(stack):
    results = run_json(stack.cluster.lan["client"], ["-m", "tests.e2e.ray.products", f"http://h1:{RAY_VERIFY_PORT}", str(SESSIONS)], RUN_TIMEOUT_SECONDS)
    wrong = [result for result in results if result["status"] != 200 or result["body"]["reward"] != result["expected_reward"]]
    assert (len(results), wrong[:3]) == (SESSIONS, [])
    nodes = {result["body"]["checked_on_node"] for result in results}
    assert len(nodes) > 1


def test_the_head_lists_the_counters_three_replicas_one_on_each_node(stack):
    code = (
        "import json; from nemo_gym.process.head import fetch_instances; i = fetch_instances('http://127.0.0.1:11000')['counter'];"
        " print(json.dumps([i.url, i.settings['replicas']]))"
    )
    url, urls = run_json(stack.cluster.nodes[0], ["-c", code], 60)
    expected = [f"http://{node.address}:{COUNTER_PORT}" for node in stack.cluster.nodes]
    assert (sorted(urls), url in urls) == (sorted(expected), True)


def test_gym_eval_run_scores_every_counter_episode_over_the_replicas(stack):
    h1 = stack.cluster.nodes[0]
    args = ["-m", "nemo_gym.cli.main", "eval", "run", "--no-serve", "--input", str(COUNTER_ROWS), "--num-repeats", "40", "--concurrency", str(SESSIONS), "--output", "/tmp/rollouts.jsonl"]
    run_python(h1, args, RUN_TIMEOUT_SECONDS)
    rows = [json.loads(line) for line in h1.path("/tmp/rollouts.jsonl").read_text().splitlines()]
    assert (len(rows), [row.get("error") for row in rows if row.get("reward") != 1.0][:3]) == (SESSIONS, [])


@pytest.mark.parametrize("client", ["aiohttp_jar", "httpx_jar"])
def test_every_counter_episode_through_one_replicas_url_keeps_its_count(stack, client):
    args = {"client": client, "url": f"http://h2:{COUNTER_PORT}", "episodes": SESSIONS}
    results = run_client(stack.cluster.lan["client"], "episodes", args, RUN_TIMEOUT_SECONDS)
    errors = [result["error"] for result in results if "error" in result]
    assert (sum(result["reward"] == 1.0 for result in results), errors[:3]) == (SESSIONS, [])


def test_more_replicas_than_the_cluster_has_nodes_fail_the_start_naming_how_many_it_has(cluster):
    settings = {**counter_settings(), "num_replicas": len(cluster.nodes) + 1, "port": COUNTER_PORT + 10}
    config = {"ray_head_node_address": cluster.address, COUNTER: {"resources_servers": {"example_session_state_mgmt": settings}}}
    h1 = cluster.nodes[0]
    h1.path("/tmp/too-many.yaml").write_text(yaml.safe_dump(config))
    command = ["-m", "nemo_gym.cli.main", "env", "start", "--config", "/tmp/too-many.yaml", "--head-port", str(COUNTER_PORT + 11)]
    process = h1.python(*command, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = process.communicate(timeout=RUN_TIMEOUT_SECONDS)
    assert process.returncode != 0
    assert "counter: num_replicas 4 needs 4 nodes of the Ray cluster, one per replica; it has 3 alive" in err


def test_gym_env_start_stopped_with_sigterm_exits_0_leaving_no_process_it_started_on_any_node(stack):
    assert all(stack.started().values()), "every node runs a replica"
    left = left_after_stop(stack.stop(signal.SIGTERM))
    assert (stack.process.returncode, left) == (0, {}), (left, stack.log())


# A launcher joined to the cluster (as `gym env start` with replicas), SIGTERMed, alive well past the 3 s after
# which Ray's own SIGTERM handler (absl's failure handler, installed by ray.init) has the process aborted.
JOINED_LAUNCHER_SIGTERMED = """
import os, signal, sys, threading, time
from nemo_gym import config as gym_config
from nemo_gym.process.launcher import Launcher
stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopping.set())
instances = gym_config.parse({"counter": {"resources_servers": {"example_session_state_mgmt": {"num_replicas": 2}}}}, check_ports=False)
launcher = Launcher(instances, None, settings={"ray_head_node_address": sys.argv[1]})
launcher._connect_ray()
os.kill(os.getpid(), signal.SIGTERM)
stopping.wait(60)
time.sleep(6)
launcher.stop()
print("stopped", flush=True)
"""


def test_a_launcher_joined_to_the_cluster_stops_on_sigterm_by_its_own_handler_and_exits_0(cluster):
    process = cluster.nodes[0].python("-c", JOINED_LAUNCHER_SIGTERMED, cluster.address, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=RUN_TIMEOUT_SECONDS)
    assert (process.returncode, out) == (0, "stopped\n"), err[-3000:]


def test_a_killed_nodes_sessions_get_410_naming_it_and_every_other_session_keeps_its_count(replicas):
    killed = replicas.lan["h3"]
    records = run_until_dead(replicas, killed.kill)
    assert killed.processes() == set()
    assert_lost_and_kept(replicas, records, killed, r"(503 )*410 ")


def test_gym_env_start_sigkilled_leaves_no_process_it_started_on_the_nodes_left(replicas):
    started = replicas.gym.started()
    assert all(started[node.name] for node in replicas.replicas[:2]), "the nodes left run their replicas"
    left = left_after_stop(replicas.gym.stop(signal.SIGKILL))
    assert left == {}, left


def test_gym_env_start_sigtermed_after_one_of_its_replicas_nodes_was_sigkilled_exits_0_leaving_no_process_it_started(cluster):
    settings = {**counter_settings(), "num_replicas": 2, "num_workers": 1}
    for gym in start(cluster, {"ray_head_node_address": cluster.address, COUNTER: {"resources_servers": {"example_session_state_mgmt": settings}}}):
        lost = next(node for node in cluster.nodes[1:] if node.address in replica_hosts(gym))
        started = gym.started()
        lost.kill()
        assert lost.processes() == set()
        gym.stop(signal.SIGTERM)
        left = left_after_stop(started)
        assert (gym.process.returncode, left) == (0, {}), (left, gym.log())
