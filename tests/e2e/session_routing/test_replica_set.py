"""A replica set on one machine: the counter as 3 replicas x 2 workers on loopback, behind plain HAProxy round robin.

Each replica is its own launcher (its own socket directory, its own forwarding port), all with the same
``session_secret``; HAProxy knows nothing of sessions. Sessions in memory (durable sessions off: the
replicas of one machine would otherwise share one store file, as no two hosts do).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from omegaconf import OmegaConf

from nemo_gym.client.owner_pool import OwnerPool
from nemo_gym.config import free_port
from nemo_gym.process.launcher import children
from nemo_gym.routing.replica import REPLICA_KEY, forward_address
from nemo_gym.routing.transport.unix import life_sockets
from nemo_gym.sessions.worker import OWNER_KEY, WORKER_HEADER
from nemo_gym.server_utils import ServerClient
from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, run_episodes
from scripts.bench.haproxy import HAProxy
from tests.session_cookies import session_of
from tests.unit_tests.metrics.scrape import metric

COUNTER = "example_session_state_mgmt"
NAME = "counter"
REPLICAS = 3
WORKERS = 2
EPISODES = 100
# Every standard client, the openai SDK's too: a replica's other sessions' requests are relayed as bytes (routing/relay.py).
CLIENT_NAMES = sorted(CLIENTS)
SECRET = secrets.token_urlsafe(32)
COOKIE = session_cookie_name(NAME)
KEY = instance_key(SECRET, NAME)


@pytest.fixture(scope="module")
def replica_set(start_module_servers, tmp_path_factory):
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.skip("haproxy is not installed")
    # Placed: a replica's new sessions spread over its workers by placement, not by which worker the kernel gave the
    # connection (L19, on a loaded machine: all 20 of one replica's on one worker).
    settings = {"num_workers": WORKERS, "session_secret": SECRET, "durable_sessions": False, "place_sessions": True}
    launchers = [start_module_servers({NAME: {"resources_servers": {COUNTER: settings}}}, timeout=120) for _ in range(REPLICAS)]
    urls = [launcher.instances[NAME].url for launcher in launchers]
    balancer = HAProxy(binary, urls, free_port(), tmp_path_factory.mktemp("haproxy"), name="replicas", sticky=False)
    try:
        yield launchers, balancer.url
    finally:
        balancer.stop()


async def seed(url: str, count: int, start: int = 0) -> list[dict[str, str]]:
    """``count`` sessions seeded through ``url``, each on a new connection: their cookies."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def one(initial: int) -> dict[str, str]:
            async with http.post(f"{url}/seed_session", json={"initial_count": initial}) as reply:
                assert reply.status == 200, await reply.text()
                return {COOKIE: reply.cookies[COOKIE].value}

        return await asyncio.gather(*(one(start + i) for i in range(count)))


async def add_and_read(url: str, cookies: list[dict[str, str]], timeout: float = 60) -> list[tuple[int, object]]:
    """For each session: add 1 and read the count back, through ``url`` on new connections: (status, count or detail)."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=timeout)) as http:

        async def one(cookie: dict[str, str]) -> tuple[int, object]:
            async with http.post(f"{url}/increment_counter", json={"count": 1}, cookies=cookie) as reply:
                if reply.status != 200:
                    return reply.status, (await reply.json()).get("detail")
            async with http.post(f"{url}/get_counter_value", json={}, cookies=cookie) as reply:
                body = await reply.json()
                return reply.status, body.get("count", body.get("detail"))

        return await asyncio.gather(*(one(cookie) for cookie in cookies))


def replica_of_cookie(cookie: dict[str, str]) -> str:
    return session_of(KEY, cookie[COOKIE])[REPLICA_KEY]


def forwarding_of_cookie(cookie: dict[str, str]) -> str:
    return forward_address(session_of(KEY, cookie[COOKIE]))


def replica_of_every_worker(launchers) -> dict[str, str]:
    """Each live worker's replica: the workers serving from each replica's socket directory (a reply names the
    worker that took its connection, which may own no session a test made)."""
    replicas = {
        worker: launcher.instances[NAME].url.removeprefix("http://")
        for launcher in launchers
        for worker in life_sockets(launcher.socket_dirs[NAME])
    }
    assert len(replicas) == REPLICAS * WORKERS
    return replicas


def processes(launcher) -> list[int]:
    """The replica's server process and its workers."""
    main = launcher.processes[NAME].pid
    return [main, *children(main)]


def dead(pid: int) -> bool:
    """Gone, or a zombie (every socket of it closed)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("client", CLIENT_NAMES)
def test_every_episode_of_every_standard_client_keeps_its_count_through_round_robin_over_replicas(replica_set, client):
    _, url = replica_set
    results = asyncio.run(run_episodes(CLIENTS[client], url, list(range(EPISODES)), True, EPISODES))
    errors = [result["error"] for result in results if "error" in result]
    assert sum(result["reward"] == 1.0 for result in results) == EPISODES, errors[:3]


def test_sessions_live_on_every_replica_and_every_worker(replica_set):
    """Round robin spreads new sessions over the replicas, placement over each replica's workers: the episodes above
    crossed hosts, not one replica's workers."""
    launchers, url = replica_set
    owners = [session_of(KEY, cookie[COOKIE]) for cookie in asyncio.run(seed(url, 60))]
    assert len({owner[REPLICA_KEY] for owner in owners}) == REPLICAS
    assert len({(owner[REPLICA_KEY], owner[OWNER_KEY]) for owner in owners}) == REPLICAS * WORKERS


def test_a_request_forwarded_from_another_replica_reaches_its_owner_worker_with_no_second_hop_on_the_owners_host(replica_set):
    """The kernel gives a forwarding port's connection to either worker of the owner's replica; one that reaches the
    other worker is handed to the owner (its connection, as on the public port), and the sending replica keeps it for
    that worker's sessions: the owner's host forwards none of them to a sibling, and every count is kept."""
    launchers, _ = replica_set
    owner_url, via_url = (launchers[index].instances[NAME].url for index in (0, 1))
    cookies = asyncio.run(seed(owner_url, 20, start=100))
    assert len({session_of(KEY, cookie[COOKIE])[OWNER_KEY] for cookie in cookies}) == WORKERS
    forwarded = metric(owner_url, "nemo_gym_requests_forwarded_total", hop="worker")
    results = asyncio.run(add_and_read(via_url, cookies))
    assert results == [(200, 100 + index + 1) for index in range(len(cookies))]
    assert metric(owner_url, "nemo_gym_requests_forwarded_total", hop="worker") == forwarded


async def kept_alive(url: str, cookies: list[dict[str, str]], rounds: int) -> list[tuple[int, object]]:
    """For each session, ``rounds`` times: add 1, then read the count, over a few kept-alive connections to ``url``."""
    connector = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=60)) as http:
        results: list[tuple[int, object]] = []
        for _ in range(rounds):
            for cookie in cookies:
                async with http.post(f"{url}/increment_counter", json={"count": 1}, cookies=cookie) as reply:
                    # Read whole: a reply left unread closes its connection, and a forward whose caller left is not counted.
                    assert reply.status == 200 and await reply.read(), await reply.text()
            for cookie in cookies:
                async with http.post(f"{url}/get_counter_value", json={}, cookies=cookie) as reply:
                    body = await reply.json()
                    results.append((reply.status, body.get("count", body.get("detail"))))
        return results


def test_a_request_for_another_replicas_session_is_relayed_as_bytes_once_a_connection_to_its_owner_is_kept(replica_set):
    """The receiving worker's protocol relays it (no ASGI request there) whenever a connection to the owner worker is
    kept; only the first to each owner worker from each receiving worker opens one, through the ASGI forward."""
    launchers, _ = replica_set
    owner_url, via_url = (launchers[index].instances[NAME].url for index in (0, 1))
    cookies = asyncio.run(seed(owner_url, 10, start=200))
    relayed = metric(via_url, "nemo_gym_forwards_relayed_total")
    forwarded = metric(via_url, "nemo_gym_requests_forwarded_total", hop="replica")
    results = asyncio.run(kept_alive(via_url, cookies, rounds=3))
    assert results == [(200, 200 + index + 1 + round_) for round_ in range(3) for index in range(len(cookies))]
    requests = 3 * 2 * len(cookies)
    assert metric(via_url, "nemo_gym_requests_forwarded_total", hop="replica") == forwarded + requests
    assert metric(via_url, "nemo_gym_forwards_relayed_total") >= relayed + requests - WORKERS * WORKERS


def test_gyms_client_sends_each_session_to_its_owner_replica_and_crosses_no_host(replica_set):
    """Given the balancer's URL, the owner pool sends a session's later requests to its owner replica's own
    address: each is answered by a worker of that replica (the reply names the worker that took it)."""
    launchers, url = replica_set

    async def run() -> list[tuple[str, str, str]]:
        answered: list[tuple[str, str, str]] = []
        pool = OwnerPool()
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as shared:
            for start in range(60):
                reply = await pool.request(shared, NAME, None, "POST", f"{url}/seed_session", json={"initial_count": start})
                cookie = reply.cookies[COOKIE].value
                owner = session_of(KEY, cookie)
                for _ in range(3):
                    reply = await pool.request(
                        shared, NAME, cookie, "POST", f"{url}/increment_counter", json={"count": 1}, headers={"Cookie": f"{COOKIE}={cookie}"}
                    )
                    assert reply.status == 200, await reply.text()
                    answered.append((reply.headers[WORKER_HEADER], owner[REPLICA_KEY], owner[OWNER_KEY]))
        await pool.close()
        return answered

    answered = asyncio.run(run())
    replica_of_worker = replica_of_every_worker(launchers)
    assert all(replica_of_worker[worker] == replica for worker, replica, _ in answered)
    direct = sum(worker == owner for worker, _, owner in answered)
    print(f"Gym client across replicas: {direct}/{len(answered)} non-first requests answered by their owner worker (no hop)")


def test_gyms_client_given_the_replicas_spreads_new_sessions_evenly_and_sends_each_later_request_to_its_owner_replica(replica_set):
    """No balancer: ServerClient's config names the first replica and lists the other two as its ``replicas``."""
    launchers, _ = replica_set
    first, *others = [launcher.instances[NAME] for launcher in launchers]
    settings = {**first.settings, "replicas": [other.url for other in others]}
    config = OmegaConf.create({NAME: {first.server_type: {first.implementation: settings}}})

    async def run() -> tuple[list[str], list[tuple[str, str, str]]]:
        client = ServerClient(global_config_dict=config)
        started: list[str] = []
        answered: list[tuple[str, str, str]] = []
        try:
            for start in range(60):
                reply = await client.post(NAME, "/seed_session", json={"initial_count": start})
                cookie = reply.cookies[COOKIE].value
                owner = session_of(KEY, cookie)
                started.append(owner[REPLICA_KEY])
                for path in ("/increment_counter", "/increment_counter", "/get_counter_value"):
                    reply = await client.post(NAME, path, json={"count": 1} if path == "/increment_counter" else {}, cookies={COOKIE: cookie})
                    assert reply.status == 200, await reply.text()
                    answered.append((reply.headers[WORKER_HEADER], owner[REPLICA_KEY], owner[OWNER_KEY]))
                assert (await reply.json())["count"] == start + 2
        finally:
            await client.close()
        return started, answered

    started, answered = asyncio.run(run())
    assert {replica: started.count(replica) for replica in started} == {instance.url.removeprefix("http://"): 20 for instance in (first, *others)}
    replica_of_worker = replica_of_every_worker(launchers)
    assert all(replica_of_worker[worker] == replica for worker, replica, _ in answered)
    direct = sum(worker == owner for worker, _, owner in answered)
    print(f"Gym client spreading over listed replicas: {direct}/{len(answered)} non-first requests answered by their owner worker (no hop)")


def test_hostile_requests_to_a_forwarding_port_get_401_and_are_never_handled(replica_set):
    launchers, url = replica_set
    [cookie] = asyncio.run(seed(launchers[0].instances[NAME].url, 1, start=10))
    forward = f"http://{forwarding_of_cookie(cookie)}"
    now = int(time.time())
    worker = session_of(KEY, cookie[COOKIE])[OWNER_KEY]
    hostile = {
        "none": {},
        "forged": {"X-NeMo-Gym-Replica-Auth": f"{now} {worker} {'0' * 64}"},
        "replayed late": {"X-NeMo-Gym-Replica-Auth": f"{now - 3600} {worker} {'0' * 64}"},
    }

    async def attack() -> list[int]:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            statuses = []
            for headers in hostile.values():
                async with http.post(f"{forward}/increment_counter", json={"count": 100}, cookies=cookie, headers=headers) as reply:
                    statuses.append(reply.status)
            return statuses

    assert asyncio.run(attack()) == [401] * len(hostile)
    assert asyncio.run(add_and_read(url, [cookie])) == [(200, 11)]


def test_a_replica_frozen_for_seconds_then_resumed_loses_no_session(replica_set):
    launchers, url = replica_set
    frozen = launchers[2]
    cookies = asyncio.run(seed(frozen.instances[NAME].url, 20, start=100))
    entry = launchers[0].instances[NAME].url
    pids = processes(frozen)

    async def freeze_while_asking() -> list[tuple[int, object]]:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            asking = asyncio.ensure_future(add_and_read(entry, cookies))
            await asyncio.sleep(5)
            assert not asking.done()  # the frozen replica's sessions wait for it
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        return await asking

    results = asyncio.run(freeze_while_asking())
    assert results == [(200, 100 + i + 1) for i in range(20)]


def test_a_replica_killed_whole_gives_its_sessions_410_and_no_other_session_any(replica_set):
    launchers, url = replica_set
    killed = launchers[1]
    killed_cookies = asyncio.run(seed(killed.instances[NAME].url, 10, start=200))
    other_cookies = asyncio.run(seed(launchers[0].instances[NAME].url, 10, start=300))
    address = replica_of_cookie(killed_cookies[0])
    pids = processes(killed)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not all(dead(pid) for pid in pids) and time.monotonic() < deadline:  # a kill is done only once the kernel has closed its sockets
        time.sleep(0.05)
    entry = launchers[2].instances[NAME].url
    lost = asyncio.run(add_and_read(entry, killed_cookies))
    assert [status for status, _ in lost] == [410] * 10
    assert all(address in detail for _, detail in lost)
    assert asyncio.run(add_and_read(entry, other_cookies)) == [(200, 300 + i + 1) for i in range(10)]


