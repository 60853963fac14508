"""The request body limit: 413 before a body over max_body_bytes is buffered, local or forwarded, on a real uvicorn."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from starlette.types import Receive, Scope, Send

from nemo_gym.middleware.body_limit import BodyLimit
from tests.unit_tests.in_process_server import serving
from tests.unit_tests.routing_workers import Worker, two_workers

pytestmark = pytest.mark.anyio

LIMIT = 1000


@pytest.fixture
async def pair():
    """Two routed workers of one server with a 1000-byte body limit."""
    async with two_workers(max_body_bytes=LIMIT) as workers:
        yield workers


async def exchange(url: str, head: str, body: bytes = b"") -> bytes:
    """Send a request head (and some body) on a raw connection, then read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    try:
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read(-1)
    finally:
        writer.close()


def chunked(size: int) -> bytes:
    """``size`` bytes as chunks of 100, without the last chunk: the body never ends."""
    return b"".join(b"64\r\n" + b"x" * 100 + b"\r\n" for _ in range(size // 100))


async def test_a_declared_body_over_the_limit_gets_413_and_the_connection_closes_before_any_of_it_is_sent(pair):
    a, _, _ = pair
    reply = await exchange(a.url, f"POST /echo/x HTTP/1.1\r\nHost: x\r\nContent-Length: {50 * 1024 * 1024}\r\n")
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"\r\nconnection: close\r\n" in reply.lower()
    assert b"larger than this server's limit of 1000 bytes (max_body_bytes)" in reply


async def test_a_chunked_body_over_the_limit_gets_413_without_the_rest_being_read(pair):
    a, _, _ = pair
    reply = await exchange(a.url, "POST /echo/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n", chunked(2 * LIMIT))
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"\r\nconnection: close\r\n" in reply.lower()


async def test_a_body_of_exactly_the_limit_is_served(pair):
    a, _, caller = pair
    reply = await caller.post(a, "/echo/x", data=b"y" * LIMIT)
    assert reply.status == 200
    assert (await reply.json())["body"] == "y" * LIMIT


async def test_a_forwarded_body_over_the_limit_gets_413_declared_or_chunked(pair):
    a, b, caller = pair
    seeded = await caller.post(a, "/echo/x")
    cookies = {key: morsel.value for key, morsel in seeded.cookies.items()}
    declared = await caller.post(b, "/echo/x", cookies, data=b"y" * (LIMIT + 1))

    async def stream():
        for _ in range(20):
            yield b"y" * 100

    streamed = await caller.post(b, "/echo/x", cookies, data=stream())
    assert (declared.status, streamed.status) == (413, 413)
    assert "max_body_bytes" in (await streamed.json())["detail"]
    still_there = await caller.post(b, "/echo/x", cookies, data=b"small")
    assert (await still_there.json())["worker"] == a.server.worker_id


async def test_a_body_that_goes_over_the_limit_after_the_reply_started_drops_the_connection():
    async def reply_then_read(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"transfer-encoding", b"chunked")]})
        await send({"type": "http.response.body", "body": b"early", "more_body": True})
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async with serving(BodyLimit(reply_then_read, LIMIT)) as url:
        reply = await exchange(url, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n", chunked(2 * LIMIT))
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert b"early" in reply
    assert not reply.endswith(b"0\r\n\r\n")


async def test_max_body_bytes_must_be_positive():
    with pytest.raises(ValueError, match="max_body_bytes"):
        Worker("echo", 1, None, max_body_bytes=0)


async def test_without_a_setting_the_limit_is_16_mib():
    worker = Worker("echo", 1, None)
    assert worker.server.config.max_body_bytes == 16 * 1024 * 1024
    async with aiohttp.ClientSession() as session:
        await worker.start()
        try:
            async with session.post(f"{worker.url}/echo/x", headers={"Content-Length": str(16 * 1024 * 1024 + 1)}) as reply:
                assert reply.status == 413
        finally:
            await worker.stop()
