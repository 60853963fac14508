"""A replica's forwarding port: it serves only requests with a valid credential, read off the wire, replayed and
hostile ones refused with 401 before they are handled, and caps its connections not yet authenticated.

Between two in-process replicas of two workers each, on loopback (``replica_sets``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.routing.transport.credentials import AUTH_HEADER, WINDOW_SECONDS
from nemo_gym.sessions.worker import OWNER_KEY
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.e2e.test_input_limits import read_reply
from tests.unit_tests.routing.replica_sets import Replica, count_of, credential, replica_set, session, session_cookie, two_replicas  # noqa: F401 (fixture)
from tests.unit_tests.routing_workers import Worker, new_session

pytestmark = pytest.mark.anyio


def hostile_credentials(replicas: list[Replica], owner: Worker, path: str, cookie: tuple[str, str]) -> dict[str, list[tuple[str, str]]]:
    """Requests to ``owner``'s forwarding port (a POST of ``path`` with ``cookie``, no body) whose credential no replica made for them."""
    secret = owner.server.secret
    target, other = replicas[0].address, replicas[1].address
    worker = owner.server.worker_id
    now = int(time.time())
    _, forged = credential(secrets.token_urlsafe(32), path, target, worker, cookie)
    return {
        "none": [],
        "garbage": [(AUTH_HEADER, "let me in")],
        "forged with another secret": [(AUTH_HEADER, forged)],
        "replayed to another path": [credential(secret, "/touch", target, worker, cookie)],
        "replayed to another replica": [credential(secret, path, other, worker, cookie)],
        "replayed later": [credential(secret, path, target, worker, cookie, stamp=now - 60)],
        "made for a body": [credential(secret, path, target, worker, cookie, b"{}")],
        "sent twice": [credential(secret, path, target, worker, cookie)] * 2,
    }


async def test_requests_to_the_forwarding_port_without_a_valid_credential_get_401_and_are_never_handled(two_replicas):
    replicas, caller = two_replicas
    owner = replicas[0].workers[0]
    cookies = await new_session(caller, owner)
    cookie = session_cookie(owner, cookies)
    for what, headers in hostile_credentials(replicas, owner, "/increment", cookie).items():
        response = await caller.http.post(replicas[0].forward_url + "/increment", headers=[*headers, cookie])
        assert response.status == 401, what
        assert response.headers["connection"] == "close", what
    assert await count_of(caller, replicas[1].workers[0], cookies) == 2  # none of them counted


async def test_a_valid_credential_on_the_forwarding_port_is_served(two_replicas):
    """The control of the test above: the same request, with the credential a replica makes, is handled."""
    (r1, _), caller = two_replicas
    owner = r1.workers[0]
    cookies = await new_session(caller, owner)
    cookie = session_cookie(owner, cookies)
    response = await caller.http.post(
        r1.forward_url + "/increment", headers=[credential(owner.server.secret, "/increment", r1.address, owner.server.worker_id, cookie), cookie]
    )
    assert await response.json() == {"worker": owner.server.worker_id, "count": 2}


@contextlib.contextmanager
def wire_of(worker: Worker) -> Iterator[bytearray]:
    """Every byte ``worker`` sends to other replicas' forwarding ports while the block runs (on connections it opens then)."""
    wire = bytearray()
    transport = worker.server.replicas
    opened = transport.open_connection

    async def recorded(address: str):
        connection = await opened(address)
        write = connection.write

        async def record(data: bytes) -> None:
            wire.extend(data)
            await write(data)

        connection.write = record
        return connection

    transport.open_connection = recorded
    try:
        yield wire
    finally:
        del transport.open_connection


async def sent_to(url: str, request: bytes) -> int:
    """The status a raw request to ``url`` gets."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        async with asyncio.timeout(30):
            writer.write(request)
            return (await read_reply(reader))[0]
    finally:
        writer.close()


async def test_a_credential_read_off_the_wire_is_refused_with_another_body_or_another_sessions_cookie_of_the_same_worker():
    async with replica_set(server_class=CounterServer) as ((r1, r2), caller):
        owner, entry = r1.workers[0], r2.workers[0]
        sessions = []
        for _ in range(2):
            response = await caller.post(owner, "/seed_session", json={"initial_count": 0})
            sessions.append({key: morsel.value for key, morsel in response.cookies.items()})
        assert {session(owner, cookies)[OWNER_KEY] for cookies in sessions} == {owner.server.worker_id}
        mine, other = (session_cookie(owner, cookies)[1] for cookies in sessions)
        with wire_of(entry) as wire:
            response = await caller.post(entry, "/increment_counter", sessions[0], data=b'{"count": 1}', headers={"Content-Type": "application/json"})
            assert response.status == 200, await response.text()
        head, body = bytes(wire).split(b"\r\n\r\n", 1)
        assert AUTH_HEADER.lower().encode() in head.lower() and body == b'{"count": 1}'
        head += b"\r\n\r\n"
        replays = {
            "another body of the same length": head + b'{"count": 9}',
            "another body": head.replace(b"content-length: 12", b"content-length: 15") + b'{"count": 1000}',
            "another session's cookie": head.replace(mine.encode(), other.encode()) + body,
        }
        for what, replay in replays.items():
            assert await sent_to(r1.forward_url, replay) == 401, what
        # The genuine forward still works, and none of the replays counted.
        response = await caller.post(entry, "/increment_counter", sessions[0], json={"count": 1})
        assert response.status == 200, await response.text()
        counts = [await (await caller.post(owner, "/get_counter_value", cookies, json={})).json() for cookies in sessions]
        assert counts == [{"count": 2}, {"count": 0}]


async def test_beyond_its_cap_of_connections_not_yet_authenticated_the_forwarding_port_closes_new_ones_and_replicas_still_forward(two_replicas):
    (r1, r2), caller = two_replicas
    cap = 3
    for worker in r1.workers:
        worker.server.replicas.doorkeeper.max_unauthenticated = cap
    owner, entry = r1.workers[0], r2.workers[0]
    cookies = await new_session(caller, owner)
    assert await count_of(caller, entry, cookies) == 2  # a kept connection from the entry, authenticated by its first request
    host, port = r1.forward_url.removeprefix("http://").rsplit(":", 1)
    idle = [await asyncio.open_connection(host, int(port)) for _ in range(20)]
    try:

        async def held(reader: asyncio.StreamReader) -> bool:
            """Open after a second (the header time limit is 10 s); else it was closed at once."""
            try:
                async with asyncio.timeout(1):
                    await reader.read()
            except TimeoutError:
                return True
            except ConnectionError:
                pass
            return False

        held_open = await asyncio.gather(*(held(reader) for reader, _ in idle))
        assert sum(held_open) <= cap * len(r1.workers)
        assert await count_of(caller, entry, cookies) == 3
    finally:
        for _, writer in idle:
            writer.close()


async def test_a_request_a_frozen_replica_reads_late_is_served_while_its_peers_still_count_it_alive():
    """A replica frozen (SIGSTOP) reads what its peers sent it when it resumes: a credential older than the
    clocks' window but within ``peer_dead_after_seconds`` is good; one older than both is not."""
    async with replica_set(peer_dead_after_seconds=40) as ((r1, _), caller):
        owner = r1.workers[0]
        cookies = await new_session(caller, owner)
        cookie = session_cookie(owner, cookies)
        worker = owner.server.worker_id

        def sent_ago(seconds: int) -> tuple[str, str]:
            return credential(owner.server.secret, "/increment", r1.address, worker, cookie, stamp=int(time.time()) - seconds)

        response = await caller.http.post(r1.forward_url + "/increment", headers=[sent_ago(WINDOW_SECONDS + 20), cookie])
        assert await response.json() == {"worker": worker, "count": 2}
        response = await caller.http.post(r1.forward_url + "/increment", headers=[sent_ago(WINDOW_SECONDS + 40 + 5), cookie])
        assert response.status == 401


async def test_a_session_reading_added_to_a_request_its_credential_was_made_for_is_refused(two_replicas):
    """The sending worker's reading of the cookie, which the owner takes as read, is bound by the credential."""
    (r1, _), caller = two_replicas
    owner = r1.workers[0]
    cookies = await new_session(caller, owner)
    cookie = session_cookie(owner, cookies)
    made = credential(owner.server.secret, "/echo/x", r1.address, owner.server.worker_id, cookie)
    forged = ("X-NeMo-Gym-Session-Read", json.dumps({SESSION_ID_KEY: "victim", OWNER_KEY: owner.server.worker_id}))
    response = await caller.http.post(r1.forward_url + "/echo/x", headers=[made, cookie, forged])
    assert response.status == 401
    served = await caller.http.post(r1.forward_url + "/echo/x", headers=[made, cookie])
    assert (await served.json())["session_id"] == session(owner, cookies)[SESSION_ID_KEY]

