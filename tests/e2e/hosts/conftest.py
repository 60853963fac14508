"""Fixtures of the tests with real hosts: network-namespace hosts, and one server's replicas on three of them.

``lan``: a ``tests.hosts.Hosts`` of the hosts ``h1``, ``h2``, ``h3`` (replicas), ``balancer`` (HAProxy),
``client`` (the test client) and ``db`` (a PostgreSQL, for the tests that share a store), made once per module and removed at its end; the module is
skipped, with the reason, where network namespaces cannot be made (not root, no ``ip``) or HAProxy is missing.

``replicas``: a ``ReplicaSet``: the counter at 2 workers on each of h1, h2, h3 (``gym env start`` run
inside each host, ``host`` its address, the same ``session_secret`` everywhere), behind HAProxy round
robin on the balancer host, a new connection per request; started once per module.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.failed_runs import keep_if_failed
from tests.hosts import Host, Hosts, HostsUnavailable, start_balancer, start_gym
from tests.programs import lacking

REPLICA_HOSTS = ["h1", "h2", "h3"]
# ``db``: where a test runs a PostgreSQL of its own (tests/postgres.py), as a host of its own.
HOST_NAMES = [*REPLICA_HOSTS, "balancer", "client", "db"]
COUNTER = "counter"
WORKERS = 2
PUBLIC_PORT = 8000
SESSION_SECRET = "replicas-across-hosts-test-secret-0123456789"
# Longer than the 10 s freeze of a host, which must not cost its sessions (tests/e2e/hosts/test_replicas_across_hosts.py).
PEER_DEAD_AFTER_SECONDS = 15
START_TIMEOUT_SECONDS = 180


@pytest.fixture(scope="module")
def lan(request: pytest.FixtureRequest) -> Iterator[Hosts]:
    if reason := lacking("haproxy"):
        pytest.skip(f"no balancer for the hosts here: {reason}")
    try:
        hosts = Hosts(HOST_NAMES).__enter__()
    except HostsUnavailable as error:
        pytest.skip(f"no network-namespace hosts here: {error}")
    failed_before = request.session.testsfailed
    try:
        yield hosts
    finally:
        keep_if_failed(request.session, failed_before, hosts.prefix + "hosts", hosts.keep_logs)
        hosts.close()


@dataclass
class ReplicaSet:
    """One server's replicas on several hosts, and how the tests reach them."""

    lan: Hosts
    replicas: list[Host]  # the hosts the replicas run on
    url: str  # the balancer's, by name (aiohttp's jar keeps no cookie from an IP address): what the client uses
    instance: str  # the instance name, which names its session cookie
    secret: str  # the session_secret of every replica, which reads the cookie's owner
    peer_dead_after_seconds: float

    @property
    def client(self) -> Host:
        return self.lan["client"]


def counter_config(host: Host) -> dict:
    """The counter's config on ``host``: in memory (a killed host's sessions are gone with it)."""
    settings = {
        "host": host.address,
        "port": PUBLIC_PORT,
        "num_workers": WORKERS,
        "session_secret": SESSION_SECRET,
        "peer_dead_after_seconds": PEER_DEAD_AFTER_SECONDS,
        "durable_sessions": False,
    }
    return {COUNTER: {"resources_servers": {"example_session_state_mgmt": settings}}}


@pytest.fixture(scope="module")
def replicas(lan: Hosts) -> ReplicaSet:
    hosts = [lan[name] for name in REPLICA_HOSTS]
    start_gym([(host, counter_config(host)) for host in hosts], START_TIMEOUT_SECONDS)
    start_balancer(lan["balancer"], PUBLIC_PORT, [(host.address, PUBLIC_PORT) for host in hosts])
    return ReplicaSet(lan, hosts, f"http://balancer:{PUBLIC_PORT}", COUNTER, SESSION_SECRET, PEER_DEAD_AFTER_SECONDS)
