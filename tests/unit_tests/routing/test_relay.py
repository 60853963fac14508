"""nemo_gym.routing.relay: a request for another replica's session, relayed as bytes by the public port's protocol.

Two replicas of two in-process workers each (``replica_sets``); the second replica's first worker also serves its
app on a port of the protocol a replica's public port has (``HandingOffProtocol``, the relay in its lifespan
state), as a worker process does. What is relayed is read from the worker's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import types
from collections.abc import AsyncIterator

import pytest
import uvicorn
from prometheus_client import generate_latest

from nemo_gym.config import free_port
from nemo_gym.metrics.meters import METERS
from nemo_gym.protocols.handing_off import TAKERS_STATE_KEY, HandingOffProtocol
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.routing.relay import Relays
from nemo_gym.sessions.worker import WORKER_HEADER
from tests.unit_tests.metrics.scrape import summed
from tests.unit_tests.routing.replica_sets import replica_set
from tests.unit_tests.routing_workers import EchoServer, Worker, new_session

TIMEOUT_SECONDS = 10
pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def relaying(worker: Worker) -> AsyncIterator[types.SimpleNamespace]:
    """``worker``'s app served again on a port whose protocol relays, as a worker process's public port: its URL."""
    config = uvicorn.Config(
        worker.app, host="127.0.0.1", port=free_port(), lifespan="off", log_level="warning", http=InputLimits().protocol(HandingOffProtocol)
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while not server.started:
                await asyncio.sleep(0.01)
        server.lifespan.state[TAKERS_STATE_KEY] = [Relays(worker.server._assembly.router, worker.server.config.max_body_bytes)]
        yield types.SimpleNamespace(url=f"http://127.0.0.1:{config.port}", port=config.port, worker_id=worker.server.worker_id, worker=worker)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT_SECONDS)


@contextlib.asynccontextmanager
async def two_replicas_relaying():
    """(owner, the relaying port of a worker of the other replica, caller, the owner's session's cookies)."""
    async with replica_set() as ((r1, r2), caller):
        owner = r1.workers[0]
        async with relaying(r2.workers[0]) as via:
            yield owner, via, caller, await new_session(caller, owner)


def relayed() -> float:
    return summed(generate_latest(METERS.registry).decode(), "nemo_gym_forwards_relayed_total")


async def increment(caller, via, cookies) -> tuple[int, dict, dict]:
    response = await caller.post(via, "/increment", cookies)
    return response.status, await response.json(), response.headers


async def test_a_request_for_another_replicas_session_is_relayed_once_a_connection_to_its_owner_is_kept():
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        assert (await increment(caller, via, cookies))[:2] == (200, {"worker": owner.server.worker_id, "count": 2})
        before = relayed()  # the first opened the connection, through the router's forward
        for count in range(3, 8):
            assert (await increment(caller, via, cookies))[:2] == (200, {"worker": owner.server.worker_id, "count": count})
        assert relayed() == before + 5


async def test_a_relayed_reply_names_the_receiving_worker_carries_the_servers_headers_and_the_owners_cookie():
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        await increment(caller, via, cookies)
        before = relayed()
        response = await caller.post(via, "/touch", cookies)
        assert relayed() == before + 1
        assert response.headers.getall(WORKER_HEADER) == [via.worker_id]
        assert "date" in response.headers and "server" in response.headers
        assert any(value.startswith(owner.server.session_cookie + "=") for value in response.headers.getall("Set-Cookie"))


async def test_a_body_and_a_streamed_reply_cross_the_relay_whole():
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        await increment(caller, via, cookies)
        body = bytes(range(256)) * 200  # 51,200 bytes: under the 64 KiB a relayed body may have
        before = relayed()
        response = await caller.post(via, "/stream", cookies, data=body)
        assert response.status == 200 and await response.read() == body
        assert relayed() == before + 1


async def test_a_body_beyond_64_kib_is_forwarded_by_the_router_not_relayed():
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        await increment(caller, via, cookies)
        body = b"x" * (64 * 1024 + 1)
        before = relayed()
        response = await caller.post(via, "/stream", cookies, data=body)
        assert response.status == 200 and await response.read() == body
        assert relayed() == before


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Forwarded-For": "10.0.0.1"},
        {"Forwarded": "for=10.0.0.1"},
        {"Connection": "close"},
        {"X-NeMo-Gym-Client": "10.0.0.1:1"},
        {"X-NeMo-Gym-Session-Read": '{"session_id": "forged"}'},  # a reading only a forwarding worker may send
    ],
    ids=["x-forwarded-for", "forwarded", "connection-close", "sibling-only", "forged-reading"],
)
async def test_requests_the_relay_leaves_to_the_router_are_forwarded_and_keep_their_count(headers):
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        await increment(caller, via, cookies)
        before = relayed()
        response = await caller.post(via, "/increment", cookies, headers=headers)
        assert response.status == 200 and (await response.json())["count"] == 3
        assert relayed() == before


def raw_request(path: str, cookie: str, body: bytes = b"{}") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nCookie: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        path.encode(), cookie.encode(), len(body), body)


def read_replies(sock: socket.socket, count: int) -> list[dict]:
    """``count`` replies read off ``sock`` (each with a Content-Length): their JSON bodies."""
    replies, buffer = [], b""
    while len(replies) < count:
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(65536)
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
        while len(buffer) < length:
            buffer += sock.recv(65536)
        replies.append(json.loads(buffer[:length]))
        buffer = buffer[length:]
    return replies


async def test_two_requests_pipelined_on_one_connection_one_relayed_each_get_their_own_reply_in_order():
    async with replica_set() as ((r1, r2), caller):
        owner, local = r1.workers[0], r2.workers[0]
        async with relaying(local) as via:
            remote_cookies = await new_session(caller, owner)
            local_cookies = await new_session(caller, local)
            remote = f"{owner.server.session_cookie}={remote_cookies[owner.server.session_cookie]}"
            here = f"{local.server.session_cookie}={local_cookies[local.server.session_cookie]}"
            await increment(caller, via, remote_cookies)  # a kept connection to the owner
            before = relayed()

            def pipelined() -> list[dict]:
                with socket.create_connection(("127.0.0.1", via.port), timeout=TIMEOUT_SECONDS) as sock:
                    sock.sendall(raw_request("/increment", remote) + raw_request("/increment", here) + raw_request("/increment", remote))
                    return read_replies(sock, 3)

            replies = await asyncio.to_thread(pipelined)
            assert [(reply["worker"], reply["count"]) for reply in replies] == [
                (owner.server.worker_id, 3), (local.server.worker_id, 2), (owner.server.worker_id, 4)
            ]
            assert relayed() >= before + 1


async def test_a_caller_that_leaves_a_relayed_request_cancels_its_owners_handler():
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        await increment(caller, via, cookies)
        before = relayed()
        session_id = (await (await caller.post(owner, "/echo/x", cookies)).json())["session_id"]
        cookie = f"{owner.server.session_cookie}={cookies[owner.server.session_cookie]}"
        sock = socket.create_connection(("127.0.0.1", via.port), timeout=TIMEOUT_SECONDS)
        sock.sendall(raw_request("/hang", cookie, body=b""))  # /hang reads no body: the owner watches for its caller once it is read
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while not any(session_id == hanging for hanging in EchoServer.hanging):
                await asyncio.sleep(0.02)
        sock.close()
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while session_id not in EchoServer.cancelled:
                await asyncio.sleep(0.02)
        assert relayed() == before  # counted only once its reply went whole


def kept_connections(via, owner: Worker) -> list:
    """The connections ``via``'s worker keeps to ``owner`` (its replica's forwarding port), in its pool."""
    transport = via.worker.server._assembly.replicas
    return [kept for pools in transport.pools.values() for kept in pools.get(owner.server.worker_id, [])]


async def test_a_kept_connection_the_owner_closed_while_the_body_came_sends_the_request_through_the_router_on_a_new_one():
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        await increment(caller, via, cookies)
        [connection] = kept_connections(via, owner)
        before = relayed()
        cookie = f"{owner.server.session_cookie}={cookies[owner.server.session_cookie]}"
        request = raw_request("/increment", cookie)
        head, body = request[: request.index(b"\r\n\r\n") + 4], request[request.index(b"\r\n\r\n") + 4 :]

        def send_in_two() -> dict:
            with socket.create_connection(("127.0.0.1", via.port), timeout=TIMEOUT_SECONDS) as sock:
                sock.sendall(head)
                closing.wait(TIMEOUT_SECONDS)
                sock.sendall(body)
                return read_replies(sock, 1)[0]

        closing = threading.Event()
        replied = asyncio.ensure_future(asyncio.to_thread(send_in_two))
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while connection in kept_connections(via, owner):  # taken by the relay once the head came
                await asyncio.sleep(0.01)
        connection.close()
        closing.set()
        reply = await replied
        assert reply == {"worker": owner.server.worker_id, "count": 3}
        assert relayed() == before


async def test_a_relayed_request_whose_connection_breaks_after_it_was_sent_gets_503_with_retry_after_and_its_cookie():
    async with two_replicas_relaying() as (owner, via, caller, cookies):
        await increment(caller, via, cookies)
        [connection] = kept_connections(via, owner)
        session_id = (await (await caller.post(owner, "/echo/x", cookies)).json())["session_id"]
        replied = asyncio.ensure_future(caller.post(via, "/hang", cookies))
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while session_id not in EchoServer.hanging:
                await asyncio.sleep(0.02)
        connection.close()  # as a connection that breaks under a request the owner has read
        response = await replied
        assert response.status == 503 and response.headers["Retry-After"]
        assert response.headers[WORKER_HEADER] == via.worker_id
        assert any(value.startswith(owner.server.session_cookie + "=") for value in response.headers.getall("Set-Cookie"))
        assert "Idempotency-Key" in (await response.json())["detail"]
