"""Gym's ServerClient spreads new sessions over an instance's replicas (its ``replicas`` setting, or the head's view of it).

Three in-process replicas of two workers each on loopback (``replica_set``): each replica's public
address reaches its first worker, so a session started there is that worker's. The client is
upstream's ``ServerClient`` with ``cookies=``, or the reading client built from the head's view.
"""

from __future__ import annotations

import asyncio
import collections
import json

import pytest
from omegaconf import OmegaConf

from nemo_gym.client.reading import ReadingClient
from nemo_gym.process.head import build_app, fetch_instances
from nemo_gym.routing.replica import REPLICA_KEY
from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.server_utils import ServerClient
from tests.unit_tests.in_process_server import serving
from tests.unit_tests.routing.test_replicas import Replica, replica_set, session

pytestmark = pytest.mark.anyio


def config(given: Replica, listed: list[Replica]) -> dict:
    """A config whose instance is at ``given``'s public address and lists ``listed`` as its replicas."""
    worker = given.workers[0]
    host, port = given.address.rsplit(":", 1)
    settings = {"host": host, "port": int(port), "replicas": [f"http://{replica.address}" for replica in listed]}
    return {worker.server.name: {"resources_servers": {"example_session_state_mgmt": settings}}}


def client_for(given: Replica, listed: list[Replica]) -> ServerClient:
    return ServerClient(global_config_dict=OmegaConf.create(config(given, listed)))


async def start_sessions(client: ServerClient, name: str, cookie_name: str, count: int) -> list[str]:
    """``count`` new sessions (requests with no cookie for the instance): their session cookies."""
    cookies = []
    for _ in range(count):
        response = await client.post(name, "/increment")
        assert response.status == 200, await response.text()
        cookies.append(response.cookies[cookie_name].value)
    return cookies


def owner_replicas(replica: Replica, cookies: list[str]) -> collections.Counter:
    worker = replica.workers[0]
    return collections.Counter(session(worker, {worker.server.session_cookie: cookie})[REPLICA_KEY] for cookie in cookies)


async def test_new_sessions_spread_evenly_over_the_instance_and_its_listed_replicas():
    async with replica_set(count=3) as (replicas, _):
        r1, r2, r3 = replicas
        server = r1.workers[0].server
        client = client_for(r1, [r2, r3])
        try:
            cookies = await start_sessions(client, server.name, server.session_cookie, 12)
        finally:
            await client.close()
        assert owner_replicas(r1, cookies) == {r1.address: 4, r2.address: 4, r3.address: 4}


async def test_later_requests_of_each_session_reach_its_owner_replica_directly():
    async with replica_set(count=3) as (replicas, _):
        r1, r2, r3 = replicas
        server = r1.workers[0].server
        client = client_for(r1, [r2, r3])
        try:
            cookies = await start_sessions(client, server.name, server.session_cookie, 9)
            assert len(owner_replicas(r1, cookies)) == 3  # spread: directness is across replicas
            for cookie in cookies:
                owner = session(r1.workers[0], {server.session_cookie: cookie})[OWNER_KEY]
                for count in (2, 3, 4):
                    response = await client.post(server.name, "/increment", cookies={server.session_cookie: cookie})
                    assert await response.json() == {"worker": owner, "count": count}
        finally:
            await client.close()
        assert all(worker.server.replicas.pools == {} for replica in replicas for worker in replica.workers)  # nothing forwarded


async def test_a_listed_replica_that_takes_no_connection_is_skipped_for_new_sessions_and_its_sessions_go_to_the_given_url():
    async with replica_set(count=3) as (replicas, caller):
        r1, r2, r3 = replicas
        a3, b3 = r3.workers
        server = r1.workers[0].server
        response = await caller.post(b3, "/increment")
        old = response.cookies[server.session_cookie].value
        await a3.stop()  # r3's public address takes no connection now; its forwarding port still does (b3)
        client = client_for(r1, [r2, r3])
        try:
            cookies = await start_sessions(client, server.name, server.session_cookie, 8)
            response = await client.post(server.name, "/increment", cookies={server.session_cookie: old})
            assert await response.json() == {"worker": b3.server.worker_id, "count": 2}
        finally:
            await client.close()
        assert owner_replicas(r1, cookies) == {r1.address: 4, r2.address: 4}
        assert r1.workers[0].server.replicas.pools != {}  # the old session crossed from the given URL's replica


async def test_the_head_lists_an_instances_replicas_and_a_client_of_its_view_spreads_over_them(tmp_path):
    async with replica_set(count=3) as (replicas, _):
        r1, r2, r3 = replicas
        server = r1.workers[0].server
        path = tmp_path / "resolved.json"
        path.write_text(json.dumps(config(r1, [r2, r3])))
        async with serving(build_app(str(path))) as head_url:
            instances = await asyncio.to_thread(fetch_instances, head_url)
        assert instances[server.name].settings["replicas"] == [f"http://{r2.address}", f"http://{r3.address}"]
        client = ReadingClient(instances)
        try:
            replies = [await client.post(server.name, "/increment") for _ in range(6)]
        finally:
            await client.close()
        cookies = [reply.cookies[server.session_cookie] for reply in replies]
        assert owner_replicas(r1, cookies) == {r1.address: 2, r2.address: 2, r3.address: 2}
