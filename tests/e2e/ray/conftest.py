"""A real Ray cluster for the tests: one ``ray start --block`` node per network-namespace host.

``cluster``: hosts ``h1``, ``h2``, ``h3`` (Ray nodes, the head on h1) and ``client`` (the test clients),
made once per module (tests/hosts.py). Each node is started with its host's address as
``--node-ip-address``, every port it opens fixed or in a worker range (30000-30999) clear of the
test servers' ports, usage reports off, and Ray's token authentication on (one token made for the
run, handed to the nodes and to every ``gym env start``: ``RayCluster.env``). The nodes are stopped by
their PIDs when the hosts go (never ``ray stop``). Skipped without ray, or where network namespaces
cannot be made (not root).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.failed_runs import keep_if_failed
from tests.hosts import Host, Hosts, HostsUnavailable, tail

RAY_NODES = ["h1", "h2", "h3"]
HOST_NAMES = [*RAY_NODES, "client"]
GCS_PORT = 6379
NODE_MANAGER_PORT = 31001
NODE_PORTS = [
    f"--node-manager-port={NODE_MANAGER_PORT}",
    "--object-manager-port=31002",
    "--runtime-env-agent-port=31003",
    "--metrics-export-port=31004",
    "--dashboard-agent-grpc-port=31005",
    "--dashboard-agent-listen-port=31006",
    "--min-worker-port=30000",
    "--max-worker-port=30999",
]
# Each node's CPUs for Ray's tasks: the machine has two, shared by every node.
NODE_CPUS = 2
NODE_READY_SECONDS = 60


@dataclass
class RayCluster:
    lan: Hosts
    nodes: list[Host]
    env: dict[str, str]  # what every process of the cluster and every driver needs (token, usage reports off)

    @property
    def address(self) -> str:
        return f"{self.nodes[0].address}:{GCS_PORT}"


def start_node(host: Host, head: Host, env: dict[str, str]) -> subprocess.Popen:
    """``ray start --block`` on ``host`` (the head when it is ``head``); its log is the host's /tmp/ray-node.log."""
    role = ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"] if host is head else [f"--address={head.address}:{GCS_PORT}"]
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", f"--node-ip-address={host.address}", f"--num-cpus={NODE_CPUS}", "--disable-usage-stats", *NODE_PORTS, *role]
    with open(host.path("/tmp/ray-node.log"), "wb") as log:
        return host.run(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_listening(host: Host, port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + NODE_READY_SECONDS
    while not {(host.address, port), ("0.0.0.0", port), ("::", port)} & host.listening():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Ray node on {host.name} did not come up:\n{tail(host.path('/tmp/ray-node.log'), 40)}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[RayCluster]:
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    try:
        lan = Hosts(HOST_NAMES).__enter__()
    except HostsUnavailable as error:
        pytest.skip(f"no network-namespace hosts here: {error}")
    try:
        env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        nodes = [lan[name] for name in RAY_NODES]
        head = start_node(nodes[0], nodes[0], env)
        wait_listening(nodes[0], GCS_PORT, head)
        started = {node.name: start_node(node, nodes[0], env) for node in nodes[1:]}
        started[nodes[0].name] = head
        for node in nodes:
            wait_listening(node, NODE_MANAGER_PORT, started[node.name])
        failed_before = request.session.testsfailed
        yield RayCluster(lan, nodes, env)
        keep_if_failed(request.session, failed_before, lan.prefix + "ray", lan.keep_logs)
    finally:
        lan.close()
