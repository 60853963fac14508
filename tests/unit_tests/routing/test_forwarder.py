"""The forwarder: a request reaches its owner unchanged and the reply comes back streamed; a live owner
that takes no connection is waited for (then 503), a dead one never; and when an owner ends a
connection under a request, what is sent again and what gets 503 (whether it took effect unknown).

Two in-process workers of one server (``two_workers``), or one worker and an owner played by the test
on a real Unix socket in the workers' socket directory (``PlayedOwner``), holding a real life name.
The background-task promise is held to the standard clients (aiohttp's jar, httpx, requests, a client
replacing its cookies with each reply's); the played owner's, whose cookie the test signs, to aiohttp,
httpx and requests each sending that cookie.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest
import requests
from fastapi import BackgroundTasks, FastAPI, Request

from nemo_gym import SESSION_ID_KEY
from nemo_gym.client.reading import cookie_header
from nemo_gym.routing.forwarder import Forwarder
from nemo_gym.routing.transport.unix import LifeName, is_alive, socket_address
from nemo_gym.sessions.worker import OWNER_KEY, new_worker_id
from resources_servers.example_session_state_mgmt import standard_clients
from tests.session_cookies import session_of, signed_session
from tests.unit_tests.routing_workers import EchoServer, Worker, new_session, two_workers, unreachable

pytestmark = pytest.mark.anyio

# Long enough that the next request is on the connection when the background task fails.
FAIL_AFTER_SECONDS = 0.3
SLOW_SECONDS = 3 * FAIL_AFTER_SECONDS
# Bounds, never expectations: how long a played owner waits for a request, or lets a test run.
WAIT_SECONDS = 10

Post = Callable[[str, dict[str, str]], Awaitable[tuple[int, dict]]]


async def aiohttp_post(url: str, cookies: dict[str, str]) -> tuple[int, dict]:
    import aiohttp

    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.post(url, headers={"Cookie": cookie_header(cookies)}, json={}) as reply:
            return reply.status, json.loads(await reply.text())


async def httpx_post(url: str, cookies: dict[str, str]) -> tuple[int, dict]:
    async with httpx.AsyncClient(timeout=WAIT_SECONDS) as http:
        reply = await http.post(url, headers={"Cookie": cookie_header(cookies)}, json={})
        return reply.status_code, reply.json()


async def requests_post(url: str, cookies: dict[str, str]) -> tuple[int, dict]:
    def post() -> tuple[int, dict]:
        with requests.Session() as http:
            reply = http.post(url, headers={"Cookie": cookie_header(cookies)}, json={}, timeout=WAIT_SECONDS)
            return reply.status_code, reply.json()

    return await asyncio.to_thread(post)


CLIENTS: dict[str, Post] = {"aiohttp": aiohttp_post, "httpx": httpx_post, "requests": requests_post}
# The standard clients, each keeping its cookies its own way, where the server gives the cookies.
STANDARD_CLIENTS = ["aiohttp_jar", "httpx_jar", "requests_session", "replacing"]
PLACED_SESSIONS = 6


class FailingAfterReplyServer(EchoServer):
    """EchoServer with a reply whose background task fails a little later, and a slow reply."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/fail_after_reply")(self.fail_after_reply)
        app.post("/slow_increment")(self.slow_increment)
        return app

    async def fail_after_reply(self, background: BackgroundTasks) -> dict[str, str]:
        async def fail() -> None:
            await asyncio.sleep(FAIL_AFTER_SECONDS)
            raise RuntimeError("a background task failed")

        background.add_task(fail)
        return {"worker": self.worker_id}

    async def slow_increment(self, request: Request) -> dict:
        await asyncio.sleep(SLOW_SECONDS)
        return await self.increment(request)


def cookies_of(worker: Worker, owner: str) -> dict[str, str]:
    """A session cookie naming ``owner``, signed as ``worker``'s server signs it."""
    session = {SESSION_ID_KEY: new_worker_id(), OWNER_KEY: owner}
    return {worker.server.session_cookie: signed_session(worker.server.signing_key, session)}


@pytest.mark.parametrize("client", STANDARD_CLIENTS)
async def test_a_background_task_failing_after_its_reply_leaves_the_next_forwarded_request_on_that_connection_answered(client):
    """A standard client talks to worker B only; balanced placement starts some of its sessions on A,
    so B forwards them, over one pooled connection (the requests go one at a time)."""
    async with two_workers(FailingAfterReplyServer, place_sessions=True) as (a, b, _):
        for worker in (a, b):
            worker.server.placement.refresh()
        async with standard_clients.CLIENTS[client](b.url, False) as episode_post, contextlib.AsyncExitStack() as stack:
            posts = [await stack.enter_async_context(episode_post()) for _ in range(PLACED_SESSIONS)]
            started = [await post("/increment", {}) for post in posts]
            on_a = [post for post, reply in zip(posts, started) if reply.body["worker"] == a.server.worker_id]
            assert len(on_a) >= 2, [reply.body for reply in started]
            failing, slow = on_a[:2]
            assert ((reply := await failing("/fail_after_reply", {})).status, reply.body) == (200, {"worker": a.server.worker_id})
            # On the connection the failing reply came back on, in flight when the task fails.
            reply = await slow("/slow_increment", {})
            assert (reply.status, reply.body.get("count")) == (200, 2), reply.body
            assert ((reply := await failing("/increment", {})).status, reply.body.get("count")) == (200, 2), reply.body


class PlayedOwner:
    """An owner worker played by the test: its private socket and life name, in a thread of its own.

    It answers the first request of each connection (200, kept alive) and takes the next one as
    ``ending`` says: "unread" closes the connection with the request unread (the kernel resets it,
    as when a process dies with it in its socket); "read" reads it whole, then closes. ``dying``:
    with that close the owner also stops listening, and frees its life name ``release_after`` seconds later.
    ``answer_after``: seconds between reading a request and answering it.
    """

    def __init__(self, socket_dir: str, ending: str, dying: bool = False, release_after: float = 0.0, answer_after: float = 0.0) -> None:
        self.worker_id = new_worker_id()
        self.ending = ending
        self.answer_after = answer_after
        self.dying = dying
        self.release_after = release_after
        self.life_name = LifeName(socket_dir, self.worker_id)
        self.life_name.hold()
        self.path = socket_address(socket_dir, self.worker_id)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(self.path)
        self.listener.listen()
        self.listener.settimeout(0.05)
        self.answered = 0
        self.read = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    @contextlib.contextmanager
    def running(self) -> Iterator["PlayedOwner"]:
        self.thread.start()
        try:
            yield self
        finally:
            self.stopped.set()
            self.thread.join(WAIT_SECONDS)
            self.listener.close()
            self.life_name.release()

    def serve(self) -> None:
        while not self.stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            with connection:
                connection.settimeout(WAIT_SECONDS)
                self.answer(connection)
                if not self.end(connection):
                    return

    def answer(self, connection: socket.socket) -> None:
        read_request(connection)
        self.read += 1
        self.stopped.wait(self.answer_after)
        self.answered += 1
        body = json.dumps({"answered": self.answered}).encode()
        connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    def end(self, connection: socket.socket) -> bool:
        """Take the connection's next request as ``ending`` says; whether to serve on."""
        connection.settimeout(0.05)
        while not self.stopped.is_set():
            try:
                if not connection.recv(1, socket.MSG_PEEK):  # the next request has come, or the end of file
                    return True
                break
            except TimeoutError:
                continue
        else:
            return False
        connection.settimeout(WAIT_SECONDS)
        if self.ending == "read":
            read_request(connection)
            self.read += 1
        if self.dying:
            self.listener.close()
        connection.close()
        if self.dying:
            self.stopped.wait(self.release_after)
            self.life_name.release()
        return not self.dying


def read_request(connection: socket.socket) -> None:
    """One request, head and (content-length) body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(65536) or b""
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += connection.recv(65536)


@contextlib.asynccontextmanager
async def worker_and_played_owner(**playing):
    async with two_workers() as (a, b, caller):
        with PlayedOwner(b.server.transport.socket_dir, **playing).running() as owner:
            yield b, owner


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_request_a_live_owner_closed_its_pooled_connection_under_unread_is_sent_again_on_a_new_one(client):
    post = CLIENTS[client]
    async with worker_and_played_owner(ending="unread") as (b, owner):
        cookies = cookies_of(b, owner.worker_id)
        assert await post(b.url + "/increment", cookies) == (200, {"answered": 1})
        async with asyncio.timeout(WAIT_SECONDS):
            assert await post(b.url + "/increment", cookies) == (200, {"answered": 2})
        assert owner.read == 2  # the request that was sent twice was read once


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_request_a_live_owner_read_and_left_unanswered_is_never_sent_twice_and_gets_503_to_retry_under_its_id(client):
    post = CLIENTS[client]
    async with worker_and_played_owner(ending="read") as (b, owner):
        cookies = cookies_of(b, owner.worker_id)
        assert await post(b.url + "/increment", cookies) == (200, {"answered": 1})
        async with asyncio.timeout(WAIT_SECONDS):
            status, body = await post(b.url + "/increment", cookies)
        assert status == 503 and owner.worker_id in body["detail"] and "Idempotency-Key" in body["detail"]
        assert (owner.read, owner.answered) == (2, 1)


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("ending", ["unread", "read"])
async def test_an_owner_that_resets_a_request_and_frees_its_life_name_a_moment_later_is_dead_and_the_session_gets_410(client, ending):
    """The kernel closes a killed process's sockets one after the other: the reset
    comes first, and the owner proves dead a moment later."""
    post = CLIENTS[client]
    async with worker_and_played_owner(ending=ending, dying=True, release_after=0.1) as (b, owner):
        cookies = cookies_of(b, owner.worker_id)
        assert await post(b.url + "/increment", cookies) == (200, {"answered": 1})
        async with asyncio.timeout(WAIT_SECONDS):
            status, body = await post(b.url + "/increment", cookies)
        assert status == 410 and owner.worker_id in body["detail"], body


async def test_a_reply_that_starts_while_the_owners_lease_is_checked_is_the_callers_and_the_forward_is_not_given_up():
    """A store slow to say the owner's lease lapsed (a hung PostgreSQL) while the owner's reply comes and is sent
    on: that reply was the request's one application, never given up and replayed to an adopter (L19: the
    adopter applied it again, and wrote a second reply after the first had completed)."""
    async with worker_and_played_owner(ending="read", answer_after=0.5) as (b, owner):
        sent: list[dict] = []
        started = asyncio.Event()
        checks = 0

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "http.response.start":
                started.set()

        bodies = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive() -> dict:
            if bodies:
                return bodies.pop()
            await asyncio.Event().wait()  # the caller stays

        async def lease_lapsed_once_the_reply_started(worker: str) -> bool:
            nonlocal checks
            checks += 1
            await started.wait()  # the store answers only after the owner's reply began
            return True

        forwarder = Forwarder(b.server.transport, owner_expired=lease_lapsed_once_the_reply_started, expiry_check_seconds=0.01)
        scope = {"type": "http", "method": "POST", "path": "/increment", "raw_path": b"/increment", "query_string": b"", "headers": [(b"content-type", b"application/json")]}
        async with asyncio.timeout(WAIT_SECONDS):
            await forwarder.forward(owner.worker_id, scope, receive, send)
        assert checks >= 1
        assert [message["type"] for message in sent][:1] == ["http.response.start"] and sent[0]["status"] == 200
        assert json.loads(b"".join(message.get("body", b"") for message in sent[1:])) == {"answered": 1}


async def test_method_path_query_and_headers_arrive_unchanged(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    # The client's own request id: passed on as is (without one, each request gets an id of its own).
    headers = {"X-Custom": "kept as is", "Authorization": "Bearer t0ken", "Content-Type": "text/plain", "Idempotency-Key": "client-key-1"}
    direct = await (await caller.http.put(f"{a.url}/echo/some%20path/x?b=2&a=1&a=%2F", data="body!", headers={**headers, "Cookie": f"{a.server.session_cookie}={cookies[a.server.session_cookie]}"})).json()
    forwarded = await (await caller.http.put(f"{b.url}/echo/some%20path/x?b=2&a=1&a=%2F", data="body!", headers={**headers, "Cookie": f"{a.server.session_cookie}={cookies[a.server.session_cookie]}"})).json()
    assert forwarded["worker"] == a.server.worker_id
    for key in ("method", "path", "query", "body", "session_id"):
        assert forwarded[key] == direct[key]
    without_host = lambda pairs: [pair for pair in pairs if pair[0] != "host"]  # noqa: E731
    assert without_host(forwarded["headers"]) == without_host(direct["headers"])
    assert dict(forwarded["headers"])["host"] == f"127.0.0.1:{b.port}"


async def test_streamed_request_body_and_streamed_reply_cross_the_hop_intact(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    payload = os.urandom(300_000)

    async def chunks():
        for start in range(0, len(payload), 7_000):
            yield payload[start : start + 7_000]

    response = await caller.post(b, "/stream", cookies, data=chunks())
    assert response.status == 200
    assert response.headers["x-worker"] == a.server.worker_id
    assert response.headers.get("Transfer-Encoding") == "chunked"
    assert await response.read() == payload


async def test_caller_disconnect_cancels_the_owner_handler(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    session_id = session_of(a.server.signing_key, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    request = asyncio.ensure_future(caller.post(b, "/hang", cookies))
    await asyncio.sleep(0.5)
    request.cancel()  # the caller goes away mid-request
    async with asyncio.timeout(10):
        while session_id not in EchoServer.cancelled:
            await asyncio.sleep(0.05)


async def test_caller_address_survives_the_hop(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    direct = await (await caller.post(a, "/echo/x", cookies)).json()
    forwarded = await (await caller.post(b, "/echo/x", cookies)).json()
    assert forwarded["worker"] == a.server.worker_id
    assert forwarded["client"][0] == direct["client"][0] == "127.0.0.1"  # over the socket alone it would be None
    assert "x-nemo-gym-client" not in dict(forwarded["headers"])


async def test_live_owner_that_takes_no_connection_gets_503_with_retry_after_never_410(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    b.server.forwarder.busy_wait_seconds = 0.5
    with unreachable(b, a):  # a lives and holds its name, but its socket takes no connection
        response = await caller.post(b, "/increment", cookies)
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        assert a.server.worker_id in (await response.json())["detail"]
    assert (await (await caller.post(b, "/increment", cookies)).json())["count"] == 2  # the session is intact


async def test_busy_owner_keeps_its_pooled_connections_and_requests_in_flight(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    session_id = session_of(a.server.signing_key, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    in_flight = asyncio.ensure_future(caller.post(b, "/hang", cookies))  # holds b's pooled connection to a
    await asyncio.sleep(0.3)
    pool = b.server.transport.idle(a.server.worker_id)
    b.server.forwarder.busy_wait_seconds = 0.5
    try:
        with unreachable(b, a):
            assert (await caller.post(b, "/increment", cookies)).status == 503
            assert b.server.transport.idle(a.server.worker_id) is pool
            assert not in_flight.done() and session_id not in EchoServer.cancelled
    finally:
        in_flight.cancel()


async def test_owner_whose_life_name_is_free_is_dead_and_gets_410_at_once(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    await a.stop()
    assert not is_alive(a.server.transport.socket_dir, a.server.worker_id)
    b.server.forwarder.busy_wait_seconds = 60  # a dead owner is never waited for
    async with asyncio.timeout(5):
        response = await caller.post(b, "/increment", cookies)
    assert response.status == 410
