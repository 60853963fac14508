"""MCP, memory_agent and swe_rebench with replicas on three hosts behind HAProxy round robin, a new connection per request (issue 20).

Each of h1, h2 and h3 (network-namespace hosts, tests/hosts.py) runs one ``gym env start`` of one
config holding three stacks, started once for the module: the counter with its tools over MCP, the
memory_agent stack (agent, policy model, scripted backend) and the swe_rebench stack (swe_rebench,
its simple_agent, the legacy relay, sharing that policy model), every server that keeps sessions at
2 workers, with ``host`` the host's address and one ``session_secret`` for all hosts. One HAProxy
round robin per public port runs on the balancer host; the test client runs in a host of its own and
sends every request to a balancer on a new connection, with no cookie jar.

swe_rebench's sandboxes are in a directory of each host's own /tmp named for the host (its cgroups
are named for that path, so the name keeps them apart too: the hosts share one cgroup tree).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from nemo_gym import config as gym_config
from nemo_gym.client.rollouts import read_rows
from nemo_gym.config import REPO_ROOT
from tests.e2e.hosts.conftest import REPLICA_HOSTS, SESSION_SECRET, START_TIMEOUT_SECONDS, WORKERS
from tests.hosts import Host, Hosts, run_client, start_balancer, start_gym
from tests.programs import needs

# Every test here starts swe_rebench, whose commands run in a bubblewrap jail.
pytestmark = needs("bwrap")

COUNTER_PORT, MEMORY_PORT, SWE_PORT = 8000, 8001, 8002
SEQUENCES = 200
CONVERSATIONS = 200
SWE_EPISODES = 200
# A relay's /run is one request for a whole episode; at 200 at once on 2 cores some ran over HAProxy's
# server timeout (then 30 s: 504). 50 at a time keeps each episode well inside it.
SWE_CONCURRENCY = 50
SWE_EPISODE_TIMEOUT_SECONDS = 600
RUN_TIMEOUT_SECONDS = 900
MEMORY_CONFIG = REPO_ROOT / "responses_api_agents" / "memory_agent" / "configs" / "memory_agent.yaml"
SWE_CONFIG = REPO_ROOT / "resources_servers" / "swe_rebench" / "configs" / "swe_rebench.yaml"
SWE_DATA = REPO_ROOT / "resources_servers" / "swe_rebench" / "data" / "example.jsonl"
# The episodes' task rows, on the client's host (too long for a command line).
ROWS_FILE = "/tmp/swe_rows.jsonl"


def sandbox_dir(host: Host) -> str:
    return f"/tmp/swe-sandboxes-{host.name}"


def stacks_config(host: Host) -> dict:
    """The three stacks on ``host``: the shipped memory_agent and swe_rebench configs and the MCP counter."""
    replica = {"host": host.address, "num_workers": WORKERS, "session_secret": SESSION_SECRET}
    shipped = gym_config.merge(yaml.safe_load(MEMORY_CONFIG.read_text()), yaml.safe_load(SWE_CONFIG.read_text()))
    return gym_config.merge(
        shipped,
        {
            "counter": {
                "resources_servers": {
                    "example_session_state_mgmt": {**replica, "port": COUNTER_PORT, "expose_tools_over_mcp": True, "durable_sessions": False}
                }
            },
            "memory_agent": {"responses_api_agents": {"memory_agent": {**replica, "port": MEMORY_PORT}}},
            "swe_rebench": {"resources_servers": {"swe_rebench": {"num_workers": WORKERS, "sandbox_dir": sandbox_dir(host)}}},
            "swe_rebench_legacy_agent": {"responses_api_agents": {"legacy_agent": {"host": host.address, "port": SWE_PORT}}},
            "scripted_backend": {"responses_api_models": {"scripted_backend": {"think_time_ms": 20}}},
        },
    )


@pytest.fixture(scope="module")
def stacks(lan: Hosts) -> list[Host]:
    hosts = [lan[name] for name in REPLICA_HOSTS]
    start_gym([(host, stacks_config(host)) for host in hosts], START_TIMEOUT_SECONDS)
    for port in (COUNTER_PORT, MEMORY_PORT, SWE_PORT):
        start_balancer(lan["balancer"], port, [(host.address, port) for host in hosts], name=f"haproxy-{port}")
    return hosts


def test_every_mcp_sequence_with_only_its_token_ends_right_across_three_hosts(lan, stacks):
    ended_right = run_client(lan["client"], "mcp", {"url": f"http://balancer:{COUNTER_PORT}", "sequences": SEQUENCES}, RUN_TIMEOUT_SECONDS)
    assert sum(ended_right) == SEQUENCES


def test_every_memory_agent_conversation_continues_across_three_hosts(lan, stacks):
    args = {"url": f"http://balancer:{MEMORY_PORT}", "conversations": CONVERSATIONS}
    results = run_client(lan["client"], "conversations", args, RUN_TIMEOUT_SECONDS)
    assert [result.get("error") for result in results if "error" in result][:3] == []
    assert results == [{"continued": True}] * CONVERSATIONS


def sandboxes(host: Host) -> list[Path]:
    return list(host.path(sandbox_dir(host)).glob("worker-*/sandbox-*"))


def test_every_swe_rebench_session_is_graded_on_the_host_of_its_sandbox_and_scores(lan, stacks):
    rows = read_rows(SWE_DATA)
    client = lan["client"]
    client.path(ROWS_FILE).write_text("".join(json.dumps(rows[number % len(rows)]) + "\n" for number in range(SWE_EPISODES)))
    args = {"url": f"http://balancer:{SWE_PORT}", "rows": ROWS_FILE, "concurrency": SWE_CONCURRENCY, "timeout": SWE_EPISODE_TIMEOUT_SECONDS}
    results = run_client(client, "swe", args, RUN_TIMEOUT_SECONDS)
    assert [result.get("error") for result in results if "error" in result][:3] == []
    assert sum(result["reward"] == 1.0 for result in results) == SWE_EPISODES, Counter(result.get("reason") for result in results)
    # The worker that graded a session is the one that held its sandbox since the seed: a process of one host.
    host_of = {pid: host.name for host in stacks for pid in host.processes()}
    assert Counter(host_of.get(result["worker_pid"]) for result in results).keys() == set(REPLICA_HOSTS)
    assert {host.name: sandboxes(host) for host in stacks} == {name: [] for name in REPLICA_HOSTS}
