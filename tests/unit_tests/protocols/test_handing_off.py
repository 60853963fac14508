"""The public port's protocol gives a connection away with every byte read from it, only where that is all the receiver needs.

A real uvicorn serves, in a thread, an app that gives the connection of ``/give`` away through the scope
extension; the "receiver" is this test, which gets a duplicate of the descriptor and the bytes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator

import pytest

from nemo_gym.config import free_port
from nemo_gym.protocols import handing_off
from nemo_gym.protocols.handing_off import CONNECTION_EXTENSION, HandingOffProtocol
from nemo_gym.protocols.input_limits import InputLimits
from tests.unit_tests.in_process_server import serving_in_a_thread

TIMEOUT_SECONDS = 10
HEAD_LIMIT = 1000
# What the test's send answers: None gives the connection away; a reason refuses it.
ANSWER: dict[str, str | None] = {"reason": None}
GIVEN: list[tuple[int, bytes]] = []


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    reason = "served here"
    if scope["path"] == "/give-late":
        # Given away only once the protocol has read more than it keeps (the rest of the body may come in later reads).
        connection = scope["extensions"][CONNECTION_EXTENSION]
        for _ in range(TIMEOUT_SECONDS * 100):
            if connection.kept is None:
                break
            await asyncio.sleep(0.01)
        scope["path"] = "/give"
    if scope["path"] == "/give":

        async def take(fd: int, data: bytes) -> str | None:
            if ANSWER["reason"] is None:
                GIVEN.append((os.dup(fd), data))
            return ANSWER["reason"]

        reason = await scope["extensions"][CONNECTION_EXTENSION].give_away(scope, take)
        if reason is None:
            return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    text = f"{reason}:{body.decode()}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(text)).encode())]})
    await send({"type": "http.response.body", "body": text})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serving_in_a_thread(app, free_port(), http=InputLimits(max_header_bytes=HEAD_LIMIT).protocol(HandingOffProtocol)) as port:
        yield port


@pytest.fixture(autouse=True)
def fresh():
    ANSWER["reason"] = None
    yield
    for fd, _ in GIVEN:
        os.close(fd)
    GIVEN.clear()


def post(path: str, body: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


def replies(connection: socket.socket, count: int) -> list[bytes]:
    """The bodies of the next ``count`` replies (each with a content-length)."""
    data, bodies = b"", []
    while len(bodies) < count:
        head, separator, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), None)
        if separator and length is not None and len(rest) >= length:
            bodies.append(rest[:length])
            data = rest[length:]
            continue
        chunk = connection.recv(65536)
        assert chunk, (data, bodies)
        data += chunk
    return bodies


def given() -> tuple[int, bytes]:
    """The one connection given away (its descriptor, duplicated, and the bytes), once it has been."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while not GIVEN and time.monotonic() < deadline:
        time.sleep(0.01)
    [handed] = GIVEN
    return handed


def connected(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_SECONDS)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def test_the_bytes_handed_off_are_every_byte_read_the_head_the_body_and_what_was_pipelined_behind(port):
    sent = post("/give", b"the body") + post("/after", b"next")
    with connected(port) as connection:
        connection.sendall(sent)
        fd, data = given()
        assert data == sent
        # The receiver holds the connection now: it answers on it, and the client reads that, and only that.
        with socket.socket(fileno=os.dup(fd)) as received:
            received.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nreceiver")
        assert replies(connection, 1) == [b"receiver"]


def test_the_giving_server_closes_its_descriptor_and_the_connection_lives_on_in_the_receivers(port):
    with connected(port) as connection:
        connection.sendall(post("/give"))
        fd, _ = given()
        with socket.socket(fileno=os.dup(fd)) as received:
            received.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            assert replies(connection, 1) == [b"ok"]
            connection.sendall(b"more")
            assert received.recv(4) == b"more"  # later bytes reach the receiver, none the giving server


def test_a_request_behind_another_in_one_read_is_not_handed_off_and_is_served_here(port):
    with connected(port) as connection:
        connection.sendall(post("/first", b"a") + post("/give", b"b"))
        assert replies(connection, 2) == [b"served here:a", b"pipelined:b"]
    assert GIVEN == []


def test_a_request_on_a_connection_idle_again_is_handed_off(port):
    with connected(port) as connection:
        connection.sendall(post("/first", b"a"))
        assert replies(connection, 1) == [b"served here:a"]
        connection.sendall(post("/give", b"b"))
        assert given()[1] == post("/give", b"b")


def test_a_refused_hand_off_leaves_the_request_whole_to_be_served_here(port):
    ANSWER["reason"] = "full"
    with connected(port) as connection:
        connection.sendall(post("/give", b"the body"))
        assert replies(connection, 1) == [b"full:the body"]
        connection.sendall(post("/again", b"x"))
        assert replies(connection, 1) == [b"served here:x"]


def test_a_body_beyond_what_is_kept_is_not_handed_off(port, monkeypatch):
    monkeypatch.setattr(handing_off, "KEPT_BODY_BYTES", 10)
    body = b"x" * (2 * HEAD_LIMIT)
    with connected(port) as connection:
        connection.sendall(post("/give-late", body))
        assert replies(connection, 1) == [b"large:" + body]
