"""Session routing, with two in-process workers of one server sharing a real socket directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import Callable

import aiohttp
import httpx
import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.client.reading import cookie_header
from nemo_gym.middleware.cancel_on_disconnect import CancelOnDisconnect
from nemo_gym.routing.liveness import is_alive
from nemo_gym.routing.worker import OWNER_KEY, socket_address
from nemo_gym.sessions.token import TOKEN_HEADER, mint_token, token_serializer
from tests.session_cookies import cookie_owner, session_of, signed_session
from tests.unit_tests.routing_workers import Caller, EchoServer, McpPathEchoServer, Worker, set_cookies, two_workers

pytestmark = pytest.mark.anyio

NOBODY = 65534


@pytest.fixture
async def pair():
    """Workers A and B of the same server (same name, so the same secret), one socket directory."""
    async with two_workers() as workers:
        yield workers


async def new_session(caller: Caller, worker: Worker) -> dict[str, str]:
    response = await caller.post(worker, "/increment")
    assert response.status == 200
    return {key: morsel.value for key, morsel in response.cookies.items()}


async def test_new_session_is_handled_locally_and_owned_by_its_worker(pair):
    a, b, caller = pair
    response = await caller.post(a, "/echo/x")
    body = await response.json()
    cookies = {key: morsel.value for key, morsel in response.cookies.items()}
    assert body["worker"] == a.server.worker_id
    assert cookie_owner(cookies, a.server.name, a.server.secret) == a.server.worker_id


async def test_session_owned_by_other_worker_is_forwarded_with_a_single_set_cookie(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    response = await caller.post(b, "/increment", cookies)
    assert await response.json() == {"worker": a.server.worker_id, "count": 2}
    [cookie] = set_cookies(response) or [None]
    assert cookie is None or cookie.startswith(a.server.session_cookie)
    response = await caller.post(b, "/echo/x", {**cookies, "other": "1"})
    assert (await response.json())["worker"] == a.server.worker_id
    assert len(set_cookies(response)) <= 1


async def test_forwarded_reply_that_changes_the_session_carries_only_the_owners_set_cookie(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    response = await caller.post(b, "/touch", cookies)
    assert (await response.json())["worker"] == a.server.worker_id
    [cookie] = set_cookies(response)
    name, _, value = cookie.partition(";")[0].partition("=")
    assert name == a.server.session_cookie
    assert session_of(a.server.secret, value)["touched_by"] == a.server.worker_id


async def test_method_path_query_and_headers_arrive_unchanged(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    headers = {"X-Custom": "kept as is", "Authorization": "Bearer t0ken", "Content-Type": "text/plain"}
    direct = await (await caller.http.put(f"{a.url}/echo/some%20path/x?b=2&a=1&a=%2F", data="body!", headers={**headers, "Cookie": f"{a.server.session_cookie}={cookies[a.server.session_cookie]}"})).json()
    forwarded = await (await caller.http.put(f"{b.url}/echo/some%20path/x?b=2&a=1&a=%2F", data="body!", headers={**headers, "Cookie": f"{a.server.session_cookie}={cookies[a.server.session_cookie]}"})).json()
    assert forwarded["worker"] == a.server.worker_id
    for key in ("method", "path", "query", "body", "session_id"):
        assert forwarded[key] == direct[key]
    without_host = lambda pairs: [pair for pair in pairs if pair[0] != "host"]  # noqa: E731
    assert without_host(forwarded["headers"]) == without_host(direct["headers"])
    assert dict(forwarded["headers"])["host"] == f"127.0.0.1:{b.port}"


async def test_private_socket_request_is_handled_locally(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    connector = aiohttp.UnixConnector(socket_address(b.server.socket_dir, b.server.worker_id))
    async with aiohttp.ClientSession(connector=connector) as private:
        header = f"{a.server.session_cookie}={cookies[a.server.session_cookie]}"
        async with private.post("http://worker/echo/x", headers={"Cookie": header}) as response:
            assert (await response.json())["worker"] == b.server.worker_id


async def test_session_of_a_worker_that_shut_down_gets_410(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    await a.stop()
    with socket.socket(socket.AF_UNIX) as private, pytest.raises(ConnectionRefusedError):
        private.connect(socket_address(a.server.socket_dir, a.server.worker_id))  # its name went with it
    response = await caller.post(b, "/increment", cookies)
    assert response.status == 410
    assert set_cookies(response) == []  # a lost session is not handed a new cookie
    detail = (await response.json())["detail"]
    assert a.server.worker_id in detail and "gone" in detail


class AnotherUser:
    """A forked child that runs ``work`` as the user nobody. ``work`` calls ``ready()`` once set up,
    and the bytes it returns are the child's report."""

    def __init__(self, work: Callable[[Callable[[], None]], bytes]) -> None:
        if os.getuid() != 0:
            pytest.skip("needs root, to run a process as another user")
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(read)
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                os.write(write, work(lambda: os.write(write, b"ready\n")))
            finally:
                os._exit(0)
        os.close(write)
        self.pipe = os.fdopen(read, "rb")
        assert self.pipe.readline() == b"ready\n"

    def report(self) -> bytes:
        with self.pipe:
            report = self.pipe.read()
        os.waitpid(self.pid, 0)
        return report


def squat(address: str) -> Callable[[Callable[[], None]], bytes]:
    def work(ready: Callable[[], None]) -> bytes:
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            listener.listen()
            listener.settimeout(3)
            ready()
            try:
                connection, _ = listener.accept()
                connection.settimeout(3)
                return b"got a request: " + connection.recv(100) if connection.recv(1, socket.MSG_PEEK) else b"nothing"
            except OSError as error:
                return repr(error).encode()

    return work


def visit(address: str) -> Callable[[Callable[[], None]], bytes]:
    def work(ready: Callable[[], None]) -> bytes:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.settimeout(5)
            connection.connect(address)
            ready()
            try:
                connection.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                return connection.recv(100)
            except ConnectionResetError:
                return b""

    return work


async def test_a_dead_owners_socket_name_taken_by_another_user_gets_no_request_and_the_session_410(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    assert (await (await caller.post(b, "/increment", cookies)).json())["count"] == 2  # b now pools a connection to a
    await a.stop()
    squatter = AnotherUser(squat(socket_address(a.server.socket_dir, a.server.worker_id)))
    response = await caller.post(b, "/increment", cookies)
    assert response.status == 410
    assert a.server.worker_id in (await response.json())["detail"]
    assert b"got a request" not in squatter.report()


async def test_the_private_socket_answers_no_process_of_another_user(pair):
    a, b, caller = pair
    visitor = AnotherUser(visit(socket_address(a.server.socket_dir, a.server.worker_id)))
    assert await asyncio.to_thread(visitor.report) == b""  # closed, unanswered
    assert (await caller.post(a, "/echo/x")).status == 200


async def test_cookie_minted_before_a_restart_gets_410():
    name = f"echo_{uuid.uuid4().hex[:8]}"
    first_run, second_run = (tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp") for _ in range(2))
    caller = Caller()
    try:
        before = await Worker(name, 2, first_run).start()
        cookies = await new_session(caller, before)
        await before.stop()
        after = await Worker(name, 2, second_run).start()
        try:
            response = await caller.post(after, "/increment", cookies)
            assert response.status == 410
        finally:
            await after.stop()
    finally:
        await caller.close()
        os.rmdir(first_run)
        os.rmdir(second_run)


async def test_badly_signed_cookie_is_handled_locally(pair):
    a, b, caller = pair
    forged = signed_session("not the secret", {SESSION_ID_KEY: "x", OWNER_KEY: a.server.worker_id})
    response = await caller.post(b, "/echo/x", {a.server.session_cookie: forged})
    body = await response.json()
    assert body["worker"] == b.server.worker_id
    assert body["session_id"] != "x"


async def test_garbage_cookie_is_handled_locally(pair):
    a, b, caller = pair
    response = await caller.post(b, "/echo/x", {a.server.session_cookie: "%%%garbage"})
    assert response.status == 200
    assert (await response.json())["worker"] == b.server.worker_id


async def test_single_worker_cookie_is_adopted(pair):
    a, b, caller = pair
    cookie = signed_session(a.server.secret, {SESSION_ID_KEY: "from-one-worker"})
    response = await caller.post(b, "/echo/x", {a.server.session_cookie: cookie})
    body = await response.json()
    assert body["worker"] == b.server.worker_id
    assert body["session_id"] == "from-one-worker"
    stamped = {key: morsel.value for key, morsel in response.cookies.items()}
    assert session_of(b.server.secret, stamped[b.server.session_cookie]) == {
        SESSION_ID_KEY: "from-one-worker",
        OWNER_KEY: b.server.worker_id,
    }


async def test_single_worker_server_has_no_routing():
    worker = await Worker(f"echo_{uuid.uuid4().hex[:8]}", 1, None).start()
    caller = Caller()
    try:
        assert worker.server.worker_id is None and worker.server.socket_dir is None
        response = await caller.post(worker, "/echo/x")
        cookies = {key: morsel.value for key, morsel in response.cookies.items()}
        assert OWNER_KEY not in session_of(worker.server.secret, cookies[worker.server.session_cookie])
        assert isinstance(worker.app.app, CancelOnDisconnect)  # no router between the body limit and the app
    finally:
        await caller.close()
        await worker.stop()


async def test_routing_switched_off_in_the_config_installs_nothing():
    worker = await Worker(f"echo_{uuid.uuid4().hex[:8]}", 4, None, route_sessions=False).start()
    try:
        assert worker.server.worker_id is None and worker.server.socket_dir is None
    finally:
        await worker.stop()


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
    session_id = session_of(a.server.secret, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    request = asyncio.ensure_future(caller.post(b, "/hang", cookies))
    await asyncio.sleep(0.5)
    request.cancel()  # the caller goes away mid-request
    async with asyncio.timeout(10):
        while session_id not in EchoServer.cancelled:
            await asyncio.sleep(0.05)


async def test_forged_owner_cannot_escape_the_socket_directory(pair):
    a, b, caller = pair
    outside = tempfile.mkdtemp(prefix="ngw-outside-", dir="/tmp")
    for owner in ("../" + os.path.basename(outside) + "/x", "/tmp/x", "A" * 16, 42):
        cookie = signed_session(a.server.secret, {SESSION_ID_KEY: "s", OWNER_KEY: owner})
        response = await caller.post(b, "/echo/x", {a.server.session_cookie: cookie})
        assert response.status == 400, owner
        assert "owner" in (await response.json())["detail"]
    assert os.listdir(outside) == []
    os.rmdir(outside)


async def test_caller_address_survives_the_hop(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    direct = await (await caller.post(a, "/echo/x", cookies)).json()
    forwarded = await (await caller.post(b, "/echo/x", cookies)).json()
    assert forwarded["worker"] == a.server.worker_id
    assert forwarded["client"][0] == direct["client"][0] == "127.0.0.1"  # over the socket alone it would be None
    assert "x-nemo-gym-client" not in dict(forwarded["headers"])


async def test_client_address_header_from_the_public_port_is_stripped(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    spoof = {"X-NeMo-Gym-Client": "6.6.6.6:666"}
    for worker in (a, b):
        body = await (await caller.post(worker, "/echo/x", cookies, headers=spoof)).json()
        assert body["client"][0] == "127.0.0.1"
        assert "x-nemo-gym-client" not in dict(body["headers"])


async def test_nothing_in_the_routing_grows_with_sessions_served(pair):
    a, b, caller = pair
    for _ in range(50):
        cookies = await new_session(caller, a)
        assert (await (await caller.post(b, "/increment", cookies)).json())["count"] == 2
    assert list(b.server.forwarder.pools) == [a.server.worker_id]
    assert len(b.server.forwarder.pools[a.server.worker_id].idle) == 1  # one request at a time: one connection
    assert a.server.forwarder.pools == {}


async def test_mcp_token_minted_on_one_worker_routes_a_cookieless_request_to_it(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    session_id = session_of(a.server.secret, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    token = mint_token(token_serializer(a.server.secret), session_id, a.server.worker_id)
    response = await caller.post(b, "/mcp/echo", headers={TOKEN_HEADER: token})
    assert response.status == 404  # no MCP endpoint on this server, but the owner answered
    body = await (await caller.post(b, "/echo/x", headers={TOKEN_HEADER: token})).json()
    assert body["worker"] == a.server.worker_id


async def test_mcp_token_without_owner_is_handled_locally(pair):
    a, b, caller = pair
    token = mint_token(token_serializer(a.server.secret), "s", None)
    body = await (await caller.post(b, "/echo/x", headers={TOKEN_HEADER: token})).json()
    assert body["worker"] == b.server.worker_id


async def test_badly_signed_mcp_token_is_handled_locally(pair):
    a, b, caller = pair
    token = mint_token(token_serializer("wrong secret"), "s", a.server.worker_id)
    for bad in (token, "garbage"):
        body = await (await caller.post(b, "/echo/x", headers={TOKEN_HEADER: bad})).json()
        assert body["worker"] == b.server.worker_id


async def test_on_the_mcp_path_the_token_outranks_the_cookie_and_elsewhere_the_cookie_does():
    async with two_workers(McpPathEchoServer) as (a, b, caller):
        cookies_of_b = await new_session(caller, b)
        token_of_a = mint_token(token_serializer(a.server.secret), "s", a.server.worker_id)
        both = {"cookies": cookies_of_b, "headers": {TOKEN_HEADER: token_of_a}}
        assert (await (await caller.post(b, "/mcp/x", **both)).json())["worker"] == a.server.worker_id
        assert (await (await caller.post(a, "/echo/x", **both)).json())["worker"] == b.server.worker_id


async def test_quoted_cookie_from_aiohttps_own_cookie_handling_is_routed_to_its_owner(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    async with aiohttp.ClientSession() as standard:  # aiohttp quotes a value that holds "="
        for _ in range(3):
            async with standard.post(b.url + "/increment", cookies=cookies) as response:
                assert response.status == 200
                body = await response.json()
                assert body["worker"] == a.server.worker_id
    assert body["count"] == 4


async def test_two_different_session_cookies_get_400_naming_the_cookie_header(pair):
    a, b, caller = pair
    name = a.server.session_cookie
    on_a, on_b = await new_session(caller, a), await new_session(caller, b)
    for header in (f"{name}={on_a[name]}; {name}={on_b[name]}", f'{name}="{on_a[name]}"; other=1; {name}={on_b[name]}'):
        response = await caller.post(b, "/increment", headers={"Cookie": header})
        assert response.status == 400
        assert "Cookie" in (await response.json())["detail"]


async def test_the_same_session_cookie_twice_is_not_ambiguous(pair):
    a, b, caller = pair
    name = a.server.session_cookie
    on_a = await new_session(caller, a)
    response = await caller.post(b, "/increment", headers={"Cookie": f'{name}={on_a[name]}; {name}="{on_a[name]}"'})
    assert (await response.json()) == {"worker": a.server.worker_id, "count": 2}


async def test_session_cookie_outside_the_first_cookie_header_gets_400(pair):
    a, b, caller = pair
    name = a.server.session_cookie
    on_a = await new_session(caller, a)
    response = await caller.post(b, "/increment", headers=[("Cookie", "other=1"), ("Cookie", f"{name}={on_a[name]}")])
    assert response.status == 400
    assert "first Cookie header" in (await response.json())["detail"]


async def test_two_different_mcp_tokens_get_400_naming_the_token_header(pair):
    a, b, caller = pair
    serializer = token_serializer(a.server.secret)
    tokens = [mint_token(serializer, "s1", a.server.worker_id), mint_token(serializer, "s2", b.server.worker_id)]
    response = await caller.post(b, "/echo/x", headers=[(TOKEN_HEADER, token) for token in tokens])
    assert response.status == 400
    assert TOKEN_HEADER in (await response.json())["detail"]


@contextlib.contextmanager
def unreachable(forwarding: Worker, owner: Worker):
    """The owner's socket takes none of ``forwarding``'s new connections (as when its backlog is full)."""
    pool = forwarding.server.forwarder.pool_for(owner.server.worker_id)
    pool.path = "\0nemo_gym-test-nobody-listens-here"
    try:
        yield
    finally:
        pool.path = socket_address(owner.server.socket_dir, owner.server.worker_id)


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


async def busy_reply_cookies_by_aiohttp(caller: Caller, worker: Worker, cookies: dict[str, str]) -> dict[str, str]:
    response = await caller.post(worker, "/increment", cookies)
    assert response.status == 503
    return {name: morsel.value for name, morsel in response.cookies.items()}


async def busy_reply_cookies_by_httpx(caller: Caller, worker: Worker, cookies: dict[str, str]) -> dict[str, str]:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(worker.url + "/increment", headers={"Cookie": cookie_header(cookies)})
    assert response.status_code == 503
    return dict(response.cookies)


@pytest.mark.parametrize("read_reply", [busy_reply_cookies_by_aiohttp, busy_reply_cookies_by_httpx], ids=["aiohttp", "httpx"])
async def test_a_503_for_a_busy_owner_sets_the_session_cookie_so_a_client_that_replaces_its_cookies_keeps_the_session(pair, read_reply):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    b.server.forwarder.busy_wait_seconds = 0.5
    with unreachable(b, a):
        cookies = await read_reply(caller, b, cookies)  # the client's own reading of the 503's Set-Cookie, replacing its cookies
    assert cookie_owner(cookies, a.server.name, a.server.secret) == a.server.worker_id
    assert (await (await caller.post(b, "/increment", cookies)).json())["count"] == 2


async def test_busy_owner_keeps_its_pooled_connections_and_requests_in_flight(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    session_id = session_of(a.server.secret, cookies[a.server.session_cookie])[SESSION_ID_KEY]
    in_flight = asyncio.ensure_future(caller.post(b, "/hang", cookies))  # holds b's pooled connection to a
    await asyncio.sleep(0.3)
    pool = b.server.forwarder.pools[a.server.worker_id]
    b.server.forwarder.busy_wait_seconds = 0.5
    try:
        with unreachable(b, a):
            assert (await caller.post(b, "/increment", cookies)).status == 503
            assert b.server.forwarder.pools[a.server.worker_id] is pool
            assert not in_flight.done() and session_id not in EchoServer.cancelled
    finally:
        in_flight.cancel()


async def test_owner_whose_life_name_is_free_is_dead_and_gets_410_at_once(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    await a.stop()
    assert not is_alive(a.server.socket_dir, a.server.worker_id)
    b.server.forwarder.busy_wait_seconds = 60  # a dead owner is never waited for
    async with asyncio.timeout(5):
        response = await caller.post(b, "/increment", cookies)
    assert response.status == 410


@pytest.fixture
async def placing_pair():
    """Workers A and B with balanced placement on, each aware of the other."""
    async with two_workers(place_sessions=True) as (a, b, caller):
        for worker in (a, b):
            worker.server.placement.refresh()
        yield a, b, caller


async def test_new_sessions_arriving_at_one_worker_are_started_on_the_one_that_started_fewest(placing_pair):
    a, b, caller = placing_pair
    owners = []
    for number in range(20):
        response = await caller.post(a, "/echo/x", data=f"seed {number}")
        body = await response.json()
        assert body["body"] == f"seed {number}"  # the body the placement read first still arrives
        owners.append(body["worker"])
        assert cookie_owner({key: morsel.value for key, morsel in response.cookies.items()}, a.server.name, a.server.secret) == body["worker"]
    assert abs(owners.count(a.server.worker_id) - owners.count(b.server.worker_id)) <= 4


async def test_a_new_session_meant_for_a_dead_sibling_starts_here(placing_pair):
    a, b, caller = placing_pair
    for _ in range(5):
        await caller.post(a, "/echo/x")  # a has started more than b, so the next goes to b
    assert a.server.placement.least_loaded() == b.server.worker_id
    await b.stop()
    response = await caller.post(a, "/echo/x", data="kept")
    assert response.status == 200
    body = await response.json()
    assert (body["worker"], body["body"]) == (a.server.worker_id, "kept")
    assert b.server.worker_id not in a.server.placement.siblings


async def test_a_replacement_worker_starts_level_with_the_least_loaded_sibling(placing_pair):
    a, b, caller = placing_pair
    for _ in range(6):
        await caller.post(b, "/echo/x", headers={"Cookie": "ignored=1"})
    started = a.server.placement.counts()[b.server.worker_id]
    c = await Worker(a.server.name, 2, a.server.socket_dir, place_sessions=True).start()
    try:
        assert c.server.placement.counts() == {a.server.worker_id: c.server.placement.counts()[a.server.worker_id], b.server.worker_id: started}
        assert c.server.placement.own.value == min(c.server.placement.counts().values())
    finally:
        await c.stop()
