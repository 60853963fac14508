"""Gym's own client needs no hop: the counter at 4 workers, real processes, ``ReadingClient`` as rollouts use it.

Each reply names the worker that accepted its connection (``X-NeMo-Gym-Worker``); the client keeps
connections labelled by it and sends a session's requests on a connection to the session's owner.
Direct hits are counted on the wire: the reply's worker header against the owner in the signed cookie.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import aiohttp
import pytest
from starlette.requests import cookie_parser

from nemo_gym import config as gym_config
from nemo_gym.client.owner_pool import OwnerPool
from nemo_gym.client.reading import DEFAULT_TIMEOUT, ReadingClient
from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from nemo_gym.sessions.worker import WORKER_HEADER
from tests.e2e.session_routing.test_durable_sessions import dead
from tests.e2e.session_routing.test_counter_routing import worker_pid_of_owner
from tests.session_cookies import cookie_owner

COUNTER = "example_session_state_mgmt"
COOKIE = f"{COUNTER}_session"
CONFIG = {COUNTER: {"resources_servers": {COUNTER: {"num_workers": 4}}}}
CONCURRENCY = 200
WARM_UP_EPISODES = 200
MAX_WARM_UP_ROUNDS = 10
MEASURED_EPISODES = 1000
WHOLE_RESPONSE = new_response().model_dump(mode="json")


@pytest.fixture(scope="module")
def counter() -> Iterator[Launcher]:
    launcher = Launcher(gym_config.parse(CONFIG), gym_config.free_port())
    launcher.start(timeout=120)
    try:
        yield launcher
    finally:
        launcher.stop()


async def step(client: ReadingClient, path: str, body: dict, cookies: dict[str, str]) -> tuple[int, dict, dict[str, str]]:
    reply = await client.post(COUNTER, path, json=body, cookies=cookies)
    return reply.status, reply.body, {**cookies, **reply.cookies}


async def episode(client: ReadingClient, start: int) -> tuple[int, dict]:
    """seed start, +1, +2, verify start + 3: the first failing status and body, or the verify's."""
    status, body, cookies = await step(client, "/seed_session", {"initial_count": start}, {})
    for path, body in (("/increment_counter", {"count": 1}), ("/increment_counter", {"count": 2})):
        status, reply, cookies = await step(client, path, body, cookies)
        if status != 200:
            return status, reply
    verify = {"responses_create_params": {"input": "x"}, "response": WHOLE_RESPONSE, "expected_count": start + 3}
    status, reply, _ = await step(client, "/verify", verify, cookies)
    return status, reply


async def episodes(client: ReadingClient, starts: range) -> list[tuple[int, dict]]:
    """Many tasks on one pooled client behind a semaphore, as rollout drivers run them."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(start: int) -> tuple[int, dict]:
        async with gate:
            return await episode(client, start)

    return await asyncio.gather(*(one(start) for start in starts))


async def warm_up(client: ReadingClient) -> None:
    """Rounds of episodes until one opens no new connection: the pool has grown to what the load needs."""
    for _ in range(MAX_WARM_UP_ROUNDS):
        before = len(client.owner_pool.servers[COUNTER].connections) if COUNTER in client.owner_pool.servers else 0
        await episodes(client, range(WARM_UP_EPISODES))
        if len(client.owner_pool.servers[COUNTER].connections) == before:
            return


class HopCounter:
    """On the wire, for every request that carries a session cookie: did its owner's worker answer it?"""

    def __init__(self) -> None:
        self.counting = False
        self.direct = self.hops = 0
        self.trace = aiohttp.TraceConfig()
        self.trace.on_request_end.append(self.on_request_end)

    async def on_request_end(self, session, context, params: aiohttp.TraceRequestEndParams) -> None:
        cookie = cookie_parser(params.headers.get("Cookie", "")).get(COOKIE)
        if not self.counting or cookie is None:
            return
        if params.response.headers[WORKER_HEADER] == cookie_owner({COOKIE: cookie}, COUNTER):
            self.direct += 1
        else:
            self.hops += 1


def test_replies_on_one_kept_alive_connection_each_name_the_worker_that_holds_it_now_its_sessions_owner(counter):
    """With hand-off (the default), the connection goes to each request's owner, and the reply names it."""
    url = counter.instances[COUNTER].url

    async def scenario() -> tuple[list[str], list[str], list[int]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()) as fresh:
            cookies = []
            for start in range(40):
                async with fresh.post(f"{url}/seed_session", json={"initial_count": start}) as reply:
                    cookies.append(reply.cookies[COOKIE].value)
        labels, counts = [], []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), cookie_jar=aiohttp.DummyCookieJar()) as one:
            for cookie in cookies:
                headers = {"Cookie": f"{COOKIE}={cookie}"}
                async with one.post(f"{url}/increment_counter", json={"count": 1}, headers=headers) as reply:
                    await reply.read()  # a reply left unread closes its connection
                    labels.append(reply.headers[WORKER_HEADER])
                async with one.post(f"{url}/get_counter_value", json={}, headers=headers) as reply:
                    counts.append((await reply.json())["count"])
        return cookies, labels, counts

    cookies, labels, counts = asyncio.run(scenario())
    owners = [cookie_owner({COOKIE: cookie}, COUNTER) for cookie in cookies]
    assert labels == owners and len(set(owners)) > 1
    assert counts == [start + 1 for start in range(40)]


def test_gym_client_sends_at_least_95_percent_of_non_first_requests_straight_to_the_owner(counter):
    hops = HopCounter()

    async def scenario() -> list[tuple[int, dict]]:
        client = ReadingClient(counter.instances)
        client.owner_pool = OwnerPool(timeout=DEFAULT_TIMEOUT, trace_configs=[hops.trace])
        try:
            await warm_up(client)
            hops.counting = True
            return await episodes(client, range(MEASURED_EPISODES))
        finally:
            await client.close()

    results = asyncio.run(scenario())
    assert [(status, body["reward"]) for status, body in results] == [(200, 1.0)] * MEASURED_EPISODES
    assert hops.direct + hops.hops == 3 * MEASURED_EPISODES  # every non-first request went through the pool
    assert hops.direct >= 0.95 * (hops.direct + hops.hops), (hops.direct, hops.hops)


def test_pool_stays_bounded_over_2000_sessions(counter):
    cap = 16
    in_flight = 0
    excess: list[int] = []

    async def scenario() -> list[tuple[int, dict]]:
        client = ReadingClient(counter.instances)
        client.owner_pool = OwnerPool(max_kept=cap, timeout=DEFAULT_TIMEOUT)
        post = client.post

        async def counted_post(*args, **kwargs):
            nonlocal in_flight
            in_flight += 1
            try:
                return await post(*args, **kwargs)
            finally:
                in_flight -= 1
                servers = client.owner_pool.servers
                if COUNTER in servers:
                    excess.append(len(servers[COUNTER].connections) - cap - in_flight)

        object.__setattr__(client, "post", counted_post)  # the client is a pydantic model: shadow the method
        try:
            results = await episodes(client, range(2000))
            excess.append(len(client.owner_pool.servers[COUNTER].connections) - cap)
            return results
        finally:
            await client.close()

    results = asyncio.run(scenario())
    assert [(status, body["reward"]) for status, body in results] == [(200, 1.0)] * 2000
    assert max(excess) <= 0


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in_memory"])
def test_gym_client_episodes_all_end_right_with_a_worker_sigkilled_mid_run(start_servers, durable):
    """Durable: the victim's sessions are adopted and score. In memory: they get 410, the client drops
    its connections to the victim, and every other session scores."""
    config = {COUNTER: {"resources_servers": {COUNTER: {"num_workers": 4, "durable_sessions": durable}}}}
    launcher = start_servers(config, timeout=120)
    count = 200

    async def scenario() -> tuple[str, list[tuple[int, dict]], list[str], list[str | None]]:
        client = ReadingClient(launcher.instances)
        try:
            seeded = await asyncio.gather(*(step(client, "/seed_session", {"initial_count": start}, {}) for start in range(count)))
            jars = [cookies for _, _, cookies in seeded]
            halfway = await asyncio.gather(*(step(client, "/increment_counter", {"count": 1}, jar) for jar in jars))
            assert [status for status, _, _ in halfway] == [200] * count
            victim = cookie_owner(jars[0], COUNTER)
            pid = worker_pid_of_owner(launcher.processes[COUNTER].pid, victim)
            os.kill(pid, signal.SIGKILL)
            async with asyncio.timeout(10):
                while not dead(pid):  # gone, or a zombie its supervisor has not reaped yet
                    await asyncio.sleep(0.05)

            async def finish(start: int, jar: dict[str, str]) -> tuple[int, dict]:
                status, body, jar = await step(client, "/increment_counter", {"count": 2}, jar)
                if status != 200:
                    return status, body
                verify = {"responses_create_params": {"input": "x"}, "response": WHOLE_RESPONSE, "expected_count": start + 3}
                status, body, _ = await step(client, "/verify", verify, jar)
                return status, body

            first = await finish(0, jars[0])  # the first request after the kill, on which the client learns of it
            labels = [connection.worker for connection in client.owner_pool.servers[COUNTER].connections]
            rest = await asyncio.gather(*(finish(start, jar) for start, jar in enumerate(jars) if start > 0))
            return victim, [first, *rest], [cookie_owner(jar, COUNTER) for jar in jars], labels
        finally:
            await client.close()

    victim, verdicts, owners, labels = asyncio.run(scenario())
    assert 0 < owners.count(victim) < count
    for owner, (status, body) in zip(owners, verdicts):
        if owner == victim and not durable:
            assert status == 410 and victim in body["detail"], body
        else:
            assert status == 200 and body["reward"] == 1.0, body
    if not durable:
        assert victim not in labels
