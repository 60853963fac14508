"""Gym's own client sends an ``Idempotency-Key`` with every request that may change state and retries a 503
with ``Retry-After``, and a connection cut before the reply, with the same key (issue 30); against real
uvicorn servers and a raw TCP server, through every client path: ``ReadingClient``, ``ServerClient`` and
the module-level ``request``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from hypothesis import given, strategies as st
from omegaconf import OmegaConf

from nemo_gym.client import retries
from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import Instance, config_of, free_port
from nemo_gym.sessions.worker import OWNER_KEY, WORKER_HEADER
from nemo_gym.server_utils import ServerClient, request
from nemo_gym.sessions.cookie import session_cookie_name
from tests.session_cookies import signed_session
from tests.unit_tests.in_process_server import serving

NAME = "retried"
COOKIE = session_cookie_name(NAME)
KEY_HEADER = "Idempotency-Key"
# Every call of a test ends well within this (the servers answer Retry-After: 0 unless a test says otherwise).
CALL_TIMEOUT_SECONDS = 20
CHANGING = ["POST", "PUT", "PATCH", "DELETE"]

# (status, JSON body, cookies the reply set)
Result = tuple[int, Any, dict[str, str]]
Call = Callable[..., Awaitable[Result]]


@functools.cache
def moved(attempt: int) -> str:
    """The session cookie the 503 to ``attempt`` sets: signed as Starlette's (once: its signature has the time
    in it), base64 with its ``=`` padding."""
    return signed_session("secret", {"session_id": "s", "moved": attempt})


class Seen(list):
    """What the server received, one entry per attempt: method, Idempotency-Key, session cookie, other cookie, body."""


def attempt_of(request: Request, body: bytes) -> dict[str, Any]:
    return {
        "method": request.method,
        "key": request.headers.get(KEY_HEADER),
        "cookie": request.cookies.get(COOKIE),
        "other": request.cookies.get("other_session"),
        "body": body,
    }


def refusing_app(seen: Seen, refusals: int | None, retry_after: str | None, reply_cookie: bool = True) -> FastAPI:
    """Answers the first ``refusals`` attempts (every one if None) with 503, ``Retry-After: retry_after`` (none if
    None) and a Set-Cookie moving the session to a new owner; then 200 with the attempt count."""
    app = FastAPI()

    @app.api_route("/step", methods=["GET", *CHANGING])
    async def step(request: Request) -> JSONResponse:
        seen.append(attempt_of(request, await request.body()))
        if refusals is None or len(seen) <= refusals:
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            response = JSONResponse({"detail": "the change may have taken effect"}, status_code=503, headers=headers)
            response.set_cookie(COOKIE, moved(len(seen)))
            return response
        response = JSONResponse({"attempts": len(seen)})
        if reply_cookie:
            response.set_cookie("flavour", "oatmeal")
        return response

    return app


@contextlib.asynccontextmanager
async def caller(kind: str, port: int) -> AsyncIterator[Call]:
    """``call(method, body, cookies, headers)`` to ``/step`` of the server at ``port``, through client path ``kind``."""
    instances = {NAME: Instance(NAME, "resources_servers", "example_session_state_mgmt", {"host": "127.0.0.1", "port": port})}
    if kind == "ReadingClient":
        client = ReadingClient(instances)

        async def call(method: str = "POST", body: Any = None, cookies: dict[str, str] | None = None, headers: dict | None = None) -> Result:
            assert headers is None, "ReadingClient takes no headers"
            reply = await (client.post(NAME, "/step", json=body, cookies=cookies) if method == "POST" else client.get(NAME, "/step", cookies=cookies))
            return reply.status, reply.body, reply.cookies

    else:
        client = ServerClient(global_config_dict=OmegaConf.create(config_of(instances)))

        async def call(method: str = "POST", body: Any = None, cookies: dict[str, str] | None = None, headers: dict | None = None) -> Result:
            options = {"json": body, "cookies": cookies, "headers": headers}
            if kind == "ServerClient":
                response = await client.request(NAME, "/step", method, **options)
            else:
                response = await request(method, f"http://127.0.0.1:{port}/step", **options)
            content = await response.read()
            return response.status, json.loads(content) if content else None, {name: morsel.value for name, morsel in response.cookies.items()}

    try:
        async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
            yield call
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def refusing(kind: str, refusals: int | None, retry_after: str | None, reply_cookie: bool = True) -> AsyncIterator[tuple[Call, Seen]]:
    seen = Seen()
    port = free_port()
    async with serving(refusing_app(seen, refusals, retry_after, reply_cookie), port), caller(kind, port) as call:
        yield call, seen


CLIENT_PATHS = ["ReadingClient", "ServerClient", "request"]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", CLIENT_PATHS)
async def test_a_503_with_retry_after_is_sent_again_with_the_same_key_body_and_the_cookie_the_503_set(kind):
    async with refusing(kind, 1, "0") as (call, seen):
        status, body, _ = await call("POST", {"n": 7}, {COOKIE: "old-owner", "other_session": "kept"})
    assert (status, body) == (200, {"attempts": 2})
    first, retry = seen
    assert first["key"] and retry["key"] == first["key"]
    assert (first["cookie"], retry["cookie"]) == ("old-owner", moved(1))
    assert retry["other"] == first["other"] == "kept"
    assert json.loads(retry["body"]) == json.loads(first["body"]) == {"n": 7} and retry["method"] == "POST"


@pytest.mark.anyio
@pytest.mark.parametrize("kind", CLIENT_PATHS)
async def test_the_reply_after_a_503_keeps_the_session_cookie_the_503_set_so_the_caller_holds_it(kind):
    async with refusing(kind, 1, "0") as (call, _):
        status, _, cookies = await call("POST", {}, {COOKIE: "old-owner"})
    assert status == 200 and cookies == {"flavour": "oatmeal", COOKIE: moved(1)}


@pytest.mark.anyio
@pytest.mark.parametrize("method", CHANGING)
@pytest.mark.parametrize("kind", ["ServerClient", "request"])
async def test_every_changing_method_carries_a_fresh_idempotency_key_per_call(kind, method):
    async with refusing(kind, 0, None) as (call, seen):
        await call(method, {})
        await call(method, {})
    keys = [attempt["key"] for attempt in seen]
    assert all(key and len(key) >= 32 for key in keys) and keys[0] != keys[1], keys


@pytest.mark.anyio
async def test_a_reading_client_post_carries_an_idempotency_key():
    async with refusing("ReadingClient", 0, None) as (call, seen):
        await call("POST", {})
    assert seen[0]["key"]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", CLIENT_PATHS)
async def test_a_get_carries_no_idempotency_key_and_is_retried_after_a_503_with_retry_after(kind):
    async with refusing(kind, 1, "0") as (call, seen):
        status, _, _ = await call("GET")
    assert status == 200 and [attempt["key"] for attempt in seen] == [None, None]


@pytest.mark.anyio
@pytest.mark.parametrize("header", ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"])
@pytest.mark.parametrize("kind", ["ServerClient", "request"])
async def test_a_callers_idempotency_key_is_kept_on_every_attempt(kind, header):
    async with refusing(kind, 1, "0") as (call, seen):
        status, _, _ = await call("POST", {}, headers={header: "the-callers-own-key"})
    assert status == 200 and [attempt["key"] for attempt in seen] == ["the-callers-own-key"] * 2


@pytest.mark.anyio
@pytest.mark.parametrize("retry_after", [None, "", "soon", "-1", "1.5", "Wed, 21 Oct 2015 07:28:00 GMT"])
@pytest.mark.parametrize("kind", CLIENT_PATHS)
async def test_a_503_without_a_retry_after_in_seconds_is_returned_at_once(kind, retry_after):
    async with refusing(kind, None, retry_after) as (call, seen):
        status, body, _ = await call("POST", {})
    assert (status, body["detail"], len(seen)) == (503, "the change may have taken effect", 1)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", CLIENT_PATHS)
async def test_a_server_that_always_answers_503_gets_max_attempts_and_the_caller_the_last_503(kind, monkeypatch):
    monkeypatch.setattr(retries, "MAX_ATTEMPTS", 4)
    async with refusing(kind, None, "0") as (call, seen):
        status, _, cookies = await call("POST", {}, {COOKIE: "old-owner"})
    assert (status, len(seen), len({attempt["key"] for attempt in seen})) == (503, 4, 1)
    assert [attempt["cookie"] for attempt in seen] == ["old-owner", moved(1), moved(2), moved(3)]
    assert cookies[COOKIE] == moved(4)


@pytest.mark.anyio
async def test_the_default_bound_holds_too():
    async with refusing("request", None, "0") as (call, seen):
        status, _, _ = await call("POST", {})
    assert (status, len(seen)) == (503, retries.MAX_ATTEMPTS)


@pytest.mark.anyio
async def test_no_retry_is_made_whose_wait_would_pass_the_waiting_budget(monkeypatch):
    """Retry-After: 1 three times with 2.5 s of waiting allowed: two waits, three attempts, the last 503 returned."""
    monkeypatch.setattr(retries, "MAX_WAITING_SECONDS", 2.5)
    async with refusing("request", None, "1") as (call, seen):
        status, _, _ = await call("POST", {})
    assert (status, len(seen)) == (503, 3)


@pytest.mark.anyio
async def test_a_huge_retry_after_is_waited_at_most_max_wait_seconds(monkeypatch):
    monkeypatch.setattr(retries, "MAX_WAIT_SECONDS", 0.01)
    async with refusing("request", 1, "9" * 5000) as (call, seen):
        status, _, _ = await call("POST", {})
    assert (status, len(seen)) == (200, 2)


class CuttingServer:
    """A raw TCP server that reads each request in full, records its Idempotency-Key, and for the first
    ``cuts`` requests ends the connection without a byte of reply (``how``: "close" sends FIN, "reset" RST);
    later ones get 200."""

    def __init__(self, cuts: int, how: str) -> None:
        self.cuts, self.how = cuts, how
        self.keys: list[str | None] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")[1:]
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines if line)}
        await reader.readexactly(int(headers.get("content-length", "0")))
        self.keys.append(headers.get(KEY_HEADER.lower()))
        if len(self.keys) <= self.cuts:
            if self.how == "reset":
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            return
        body = b'{"attempts": %d}' % len(self.keys)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def cutting(kind: str, cuts: int, how: str) -> AsyncIterator[tuple[Call, CuttingServer]]:
    server = CuttingServer(cuts, how)
    port = free_port()
    tcp = await asyncio.start_server(server.handle, "127.0.0.1", port)
    try:
        async with caller(kind, port) as call:
            yield call, server
    finally:
        tcp.close()
        await tcp.wait_closed()


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("kind", CLIENT_PATHS)
async def test_a_connection_cut_before_the_reply_is_retried_with_the_same_key(kind, how):
    async with cutting(kind, 1, how) as (call, server):
        status, body, _ = await call("POST", {"n": 1})
    assert (status, body) == (200, {"attempts": 2})
    assert server.keys[0] and server.keys == [server.keys[0]] * 2


@pytest.mark.anyio
async def test_a_connection_cut_every_time_ends_in_the_error_after_max_num_tries():
    async with cutting("request", 100, "close") as (call, server):
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await call("POST", {})
    assert len(server.keys) == retries.MAX_NUM_TRIES and len(set(server.keys)) == 1


@given(st.integers(min_value=0, max_value=10**30))
def test_the_client_reads_the_retry_after_the_server_writes_as_whole_seconds_capped(seconds):
    assert retries.retry_after(str(seconds)) == min(seconds, retries.MAX_WAIT_SECONDS)


@given(st.text())
def test_a_retry_after_that_is_not_whole_seconds_in_ascii_digits_means_no_retry(value):
    wait = retries.retry_after(value)
    if value.isascii() and value.isdigit():
        assert wait == min(int(value), retries.MAX_WAIT_SECONDS)
    else:
        assert wait is None


def worker_of(port: int) -> str:
    """Each connection plays one worker (a routed server's replies name the worker that accepted it)."""
    return f"{port:016x}"


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["ReadingClient", "ServerClient"])
async def test_the_retry_goes_on_a_connection_to_the_owner_the_503s_cookie_names(kind):
    """The first call labels a connection W; a call whose cookie names another owner opens a new connection
    and gets a 503 moving the session to W: the retry goes on W's connection."""
    ports: list[int] = []
    app = FastAPI()

    @app.post("/step")
    async def step(request: Request) -> JSONResponse:
        ports.append(request.client.port)
        response = JSONResponse({}, status_code=503 if len(ports) == 2 else 200, headers={"Retry-After": "0"})
        if len(ports) == 2:
            response.set_cookie(COOKIE, signed_session("s", {"session_id": "s", OWNER_KEY: worker_of(ports[0])}))
        response.headers[WORKER_HEADER] = worker_of(request.client.port)
        return response

    port = free_port()
    elsewhere = signed_session("s", {"session_id": "s", OWNER_KEY: "0" * 16})
    async with serving(app, port), caller(kind, port) as call:
        assert (await call("POST", {}, {COOKIE: elsewhere}))[0] == 200
        assert (await call("POST", {}, {COOKIE: elsewhere}))[0] == 200
    assert ports[1] != ports[0] and ports[2] == ports[0], ports


async def streamed() -> AsyncIterator[bytes]:
    yield b'{"n": 1}'


@pytest.mark.anyio
async def test_a_streamed_body_is_not_sent_again_after_a_503():
    """A streamed body is gone once sent: the caller gets the 503, not a retry with an empty body."""
    seen = Seen()
    port = free_port()
    async with serving(refusing_app(seen, 1, "0"), port):
        response = await request("POST", f"http://127.0.0.1:{port}/step", data=streamed())
    assert (response.status, len(seen)) == (503, 1)


@pytest.mark.anyio
async def test_a_streamed_body_is_not_sent_again_after_a_cut():
    server = CuttingServer(1, "close")
    port = free_port()
    tcp = await asyncio.start_server(server.handle, "127.0.0.1", port)
    try:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await request("POST", f"http://127.0.0.1:{port}/step", data=streamed())
    finally:
        tcp.close()
        await tcp.wait_closed()
    assert len(server.keys) == 1
