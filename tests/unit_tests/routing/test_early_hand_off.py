"""nemo_gym.routing.early_hand_off: a request of a sibling's session hands its connection over before any layer of
the receiving worker sees it; one the sibling refuses goes on through the router.

Two in-process workers of one server (``routing_workers``), each also serving its app on a port of the protocol a
worker process's public port has (``HandingOffProtocol``, the early hand-off in its lifespan state) with its hand-off
socket, as a worker process does. Each such app is wrapped to count the requests that reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncIterator
from unittest import mock

import aiohttp
import pytest
import uvicorn
from itsdangerous import TimestampSigner
from prometheus_client import generate_latest

from nemo_gym.config import free_port
from nemo_gym.metrics.meters import METERS
from nemo_gym.process.public_server import TakesConnections
from nemo_gym.protocols.handing_off import TAKERS_STATE_KEY, HandingOffProtocol
from nemo_gym.protocols.input_limits import InputLimits
from nemo_gym.routing.early_hand_off import EarlyHandOff
from nemo_gym.routing.transport import hand_off
from nemo_gym.routing.transport.hand_off_receiver import HandOffReceiver
from nemo_gym.sessions.worker import WORKER_HEADER
from tests.unit_tests.metrics.scrape import summed
from tests.unit_tests.routing_workers import Worker, new_session, two_workers

TIMEOUT_SECONDS = 10
pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def public_port(worker: Worker, receives: bool = True) -> AsyncIterator[types.SimpleNamespace]:
    """``worker``'s app on a port that hands off early, and (``receives``) its hand-off socket: the port's URL, and the
    paths of the requests that reached the app there (its own, or handed to it)."""
    reached: list[str] = []

    async def counted(scope, receive, send) -> None:
        if scope["type"] == "http":
            reached.append(scope["path"])
        await worker.app(scope, receive, send)

    config = uvicorn.Config(counted, host="127.0.0.1", port=free_port(), lifespan="off", log_level="warning", http=InputLimits().protocol(HandingOffProtocol))
    server = TakesConnections(config)
    task = asyncio.create_task(server.serve())
    assembly = worker.server._assembly
    receiver = HandOffReceiver(assembly.socket_dir, worker.server.worker_id, server)
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            while not server.started:
                await asyncio.sleep(0.01)
        server.lifespan.state[TAKERS_STATE_KEY] = [EarlyHandOff(assembly.router, assembly.hand_offs)]
        if receives:
            receiver.start()
        yield types.SimpleNamespace(url=f"http://127.0.0.1:{config.port}", reached=reached)
    finally:
        await receiver.stop()
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT_SECONDS)


def not_handed_off(reason: str) -> float:
    return summed(generate_latest(METERS.registry).decode(), "nemo_gym_forwards_not_handed_off_total", reason=reason)


async def post(url: str, path: str, cookies: dict[str, str]) -> tuple[int, str, dict]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.post(url + path, cookies=cookies, json={}) as response:
            return response.status, response.headers[WORKER_HEADER], await response.json()


async def test_a_request_of_a_siblings_session_is_handed_to_it_and_never_reaches_this_workers_app(monkeypatch):
    # Both ends share this loop: on a loaded machine its turn may come later than the sender's second (then taken back).
    monkeypatch.setattr(hand_off, "ANSWER_SECONDS", TIMEOUT_SECONDS)
    async with two_workers() as (a, b, caller):
        async with public_port(a) as a_port, public_port(b) as b_port:
            cookies = await new_session(caller, b)
            for count in (2, 3, 4):
                status, worker, body = await post(a_port.url, "/increment", cookies)
                assert (status, worker, body["count"]) == (200, b.server.worker_id, count)
            assert a_port.reached == [] and b_port.reached == ["/increment"] * 3


async def test_a_request_whose_sibling_refuses_its_connection_is_forwarded_by_the_router_and_counted_once():
    async with two_workers() as (a, b, caller):
        async with public_port(a) as a_port, public_port(b, receives=False) as b_port:
            cookies = await new_session(caller, b)
            refused = not_handed_off("refused")
            status, worker, body = await post(a_port.url, "/increment", cookies)
            assert (status, worker, body["count"]) == (200, a.server.worker_id, 2)  # forwarded: the reply is a's
            assert a_port.reached == ["/increment"] and b_port.reached == []
            assert not_handed_off("refused") == refused + 1


async def test_a_request_of_this_workers_own_session_is_served_here():
    async with two_workers() as (a, b, caller):
        async with public_port(a) as a_port, public_port(b) as b_port:
            cookies = await new_session(caller, a)
            status, worker, body = await post(a_port.url, "/increment", cookies)
            assert (status, worker, body["count"]) == (200, a.server.worker_id, 2)
            assert a_port.reached == ["/increment"] and b_port.reached == []


async def test_a_handed_requests_cookie_is_verified_once_on_this_host_and_the_next_request_on_its_connection_is_read_anew(monkeypatch):
    """The owner takes the sender's reading of the handed request's session with the connection (a sibling, of this
    process's user), as it takes a forwarding sibling's: one signature check on the host, not two. The reading is the
    handed request's alone: the next request on the connection, of the other worker's session, is read by the owner
    and handed back."""
    monkeypatch.setattr(hand_off, "ANSWER_SECONDS", TIMEOUT_SECONDS)
    async with two_workers() as (a, b, caller):
        async with public_port(a) as a_port, public_port(b) as b_port:
            cookies = {worker: await new_session(caller, worker) for worker in (a, b)}
            connector = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as http:
                with mock.patch.object(TimestampSigner, "unsign", autospec=True, side_effect=TimestampSigner.unsign) as unsign:
                    async with http.post(a_port.url + "/increment", cookies=cookies[b], json={}) as response:
                        handed = (response.headers[WORKER_HEADER], (await response.json())["count"])
                    checks = unsign.call_count
                async with http.post(a_port.url + "/increment", cookies=cookies[a], json={}) as response:
                    back = (response.headers[WORKER_HEADER], (await response.json())["count"])
            assert (handed, checks) == ((b.server.worker_id, 2), 1)
            assert back == (a.server.worker_id, 2) and b_port.reached == ["/increment"] and a_port.reached == ["/increment"]
