"""nemo_gym.routing.exchange: one forwarded request. The body is taken as it came (none, one piece, every piece
when it is to be stamped, else a stream), kept so a request that reached no owner can be replayed from the start,
sent up without hop-by-hop headers with its own framing, and the owner's reply streamed back; a caller that leaves
mid-body is noticed.

The owner here is a raw loopback TCP server that records the bytes it reads and writes a fixed reply."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from nemo_gym.routing.exchange import CallerLeft, Exchange, replaying
from nemo_gym.routing.transport.connection import OwnerConnection
from nemo_gym.routing.transport.private_server import CLIENT_HEADER

pytestmark = pytest.mark.anyio

REPLY = b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nConnection: keep-alive\r\nX-Owner: yes\r\n\r\nhello"


def scope(method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None) -> dict:
    return {"type": "http", "method": method, "path": "/step", "raw_path": b"/step", "query_string": b"a=1", "client": ("10.0.0.7", 5555), "headers": headers or []}


def messages(*pieces: bytes, disconnect: bool = False):
    """A caller's receive: the body in ``pieces``, then (``disconnect``) its leaving, then waiting forever."""
    queue = [{"type": "http.request", "body": piece, "more_body": index < len(pieces) - 1} for index, piece in enumerate(pieces)]
    if disconnect:
        queue = queue[:-1] + [{"type": "http.disconnect"}]

    async def receive():
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()

    return receive


async def sink(message) -> None:
    pass


async def drained(body) -> bytes:
    return b"".join([piece async for piece in body])


async def test_a_request_without_a_body_header_has_no_body():
    assert await Exchange(scope("GET"), messages(b"ignored"), sink).body_start() is None


async def test_a_body_in_one_message_is_its_bytes():
    exchange = Exchange(scope(headers=[(b"content-length", b"3")]), messages(b"abc"), sink)
    assert await exchange.body_start() == b"abc"
    assert exchange.replayable()


async def test_a_body_to_be_stamped_is_read_whole_in_its_pieces_and_replayed_from_the_start():
    exchange = Exchange(scope(headers=[(b"transfer-encoding", b"chunked")]), messages(b"ab", b"c", b"d"), sink, stamp=lambda *_: None)
    assert await exchange.body_start() == [b"ab", b"c", b"d"]
    replay = exchange.replay()
    assert [(await replay())["body"] for _ in range(3)] == [b"ab", b"c", b"d"]


async def test_a_streamed_body_is_replayable_only_until_read_past_its_first_message():
    exchange = Exchange(scope(headers=[(b"transfer-encoding", b"chunked")]), messages(b"ab", b"c", b"d"), sink)
    body = await exchange.body_start()
    assert exchange.replayable()
    # Sent again from its start (its first message kept), the rest read from the caller as it comes.
    assert await drained(exchange.body_again(body)) == b"abcd"
    assert not exchange.replayable()


async def test_a_streamed_body_streams_whole():
    exchange = Exchange(scope(headers=[(b"transfer-encoding", b"chunked")]), messages(b"ab", b"c", b"d"), sink)
    assert await drained(await exchange.body_start()) == b"abcd"
    assert exchange.body_sent.is_set()


async def test_a_caller_that_leaves_mid_body_is_caller_left_and_not_replayable():
    exchange = Exchange(scope(headers=[(b"transfer-encoding", b"chunked")]), messages(b"ab", b"c", disconnect=True), sink)
    with pytest.raises(CallerLeft):
        await drained(await exchange.body_start())
    assert exchange.caller_left and not exchange.replayable()


async def test_replaying_gives_back_the_taken_messages_first_then_the_rest():
    replay = replaying(messages(b"rest"), {"type": "http.request", "body": b"taken", "more_body": True})
    assert [(await replay())["body"] for _ in range(2)] == [b"taken", b"rest"]


@contextlib.asynccontextmanager
async def owner(reply: bytes = REPLY) -> AsyncIterator[tuple[OwnerConnection, bytearray]]:
    """A connection to a loopback server that records what it reads and answers ``reply`` once it has a request."""
    received = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while b"\r\n\r\n" not in received or (b"0\r\n\r\n" not in received and b"chunked" in received):
            chunk = await reader.read(65536)
            if not chunk:
                return
            received.extend(chunk)
        writer.write(reply)
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    _, connection = await asyncio.get_running_loop().create_connection(OwnerConnection, "127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        yield connection, received
    finally:
        connection.close()
        server.close()
        await server.wait_closed()


async def test_a_relayed_request_goes_up_with_its_own_framing_and_no_hop_by_hop_headers_and_its_reply_comes_down():
    sent = []

    async def send(message) -> None:
        sent.append(message)

    headers = [(b"connection", b"close"), (b"content-length", b"999"), (b"expect", b"100-continue"), (b"x-keep", b"1")]
    exchange = Exchange(scope(headers=headers), messages(b"abc"), send)
    async with owner() as (connection, received):
        reusable = await asyncio.wait_for(exchange.relay(connection, await exchange.body_start()), 10)
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /step?a=1 HTTP/1.1"
    assert sorted(lines[1:]) == sorted([b"x-keep: 1", b"%s: 10.0.0.7:5555" % CLIENT_HEADER, b"content-length: 3"])
    assert body == b"abc"
    assert sent[0]["status"] == 201 and (b"x-owner", b"yes") in [(name.lower(), value) for name, value in sent[0]["headers"]]
    assert all(name.lower() != b"connection" for name, _ in sent[0]["headers"])
    assert b"".join(message.get("body", b"") for message in sent[1:]) == b"hello" and sent[-1]["more_body"] is False
    assert reusable is True and exchange.finished


async def test_a_stamp_sees_the_headers_as_sent_and_the_whole_body_and_a_stream_goes_up_chunked():
    seen = []

    def stamp(scope, headers, body) -> None:
        seen.append(list(body))
        headers.append((b"x-credential", b"signed"))

    exchange = Exchange(scope(headers=[(b"transfer-encoding", b"chunked")]), messages(b"ab", b"c"), sink, stamp=stamp)
    async with owner() as (connection, received):
        await asyncio.wait_for(exchange.relay(connection, await exchange.body_start()), 10)
    assert seen == [[b"ab", b"c"]]
    assert b"x-credential: signed" in received and b"content-length: 3" in received and received.endswith(b"\r\n\r\nabc")

    streamed = Exchange(scope(headers=[(b"transfer-encoding", b"chunked")]), messages(b"ab", b"c"), sink)
    async with owner() as (connection, received):
        await asyncio.wait_for(streamed.relay(connection, await streamed.body_start()), 10)
    assert b"transfer-encoding: chunked" in received and received.endswith(b"\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n")


async def test_the_reply_to_a_head_request_has_no_body_and_its_connection_is_not_reused():
    sent = []

    async def send(message) -> None:
        sent.append(message)

    exchange = Exchange(scope("HEAD"), messages(), send)
    async with owner() as (connection, _):
        assert await asyncio.wait_for(exchange.relay(connection, None), 10) is False
    assert [message.get("body") for message in sent[1:]] == [b""]
