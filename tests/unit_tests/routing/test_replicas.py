"""A replica set: the replicas of one server (same name and session_secret), each on its own forwarding port.

Two in-process replicas of two workers each, on loopback, each replica with its own socket directory
and forwarding port (held as its main process holds it): a session's requests reach its owner worker
from any worker of any replica; the forwarding port takes only requests with a valid credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from nemo_gym import SESSION_ID_KEY
from nemo_gym.client.owner_pool import OwnerPool
from nemo_gym.client.reading import cookie_header
from nemo_gym.sessions.worker import WORKER_HEADER
from nemo_gym.config import free_port
from nemo_gym.routing.replica import FORWARD_PORT_KEY, REPLICA_KEY
from nemo_gym.routing.transport.base import Transport
from nemo_gym.routing.transport.credentials import AUTH_HEADER, WINDOW_SECONDS, ReplicaCredentials
from nemo_gym.routing.transport.tcp import USER_TIMEOUT_SECONDS, claim_forward_port
from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.token import TOKEN_HEADER, mint_token
from tests.e2e.test_input_limits import read_reply
from tests.session_cookies import session_of, signed_session
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.unit_tests.routing_workers import Caller, EchoServer, Worker, new_session

pytestmark = pytest.mark.anyio


@dataclass
class Replica:
    workers: list[Worker]
    claim: socket.socket
    socket_dir: str

    @property
    def address(self) -> str:
        return self.workers[0].server.replica

    @property
    def forward_url(self) -> str:
        return f"http://127.0.0.1:{self.claim.getsockname()[1]}"

    async def stop(self) -> None:
        await asyncio.gather(*(worker.stop() for worker in self.workers))
        self.claim.close()


@contextlib.asynccontextmanager
async def replica_set(
    count: int = 2, workers: int = 2, server_class: type = EchoServer, secret: str | None = None, **settings
) -> AsyncIterator[tuple[list[Replica], Caller]]:
    """``secret``: the set's session_secret (default: one of its own)."""
    name = f"echo_{uuid.uuid4().hex[:8]}"
    secret = secret or secrets.token_urlsafe(32)
    replicas: list[Replica] = []
    caller = Caller()
    try:
        for _ in range(count):
            socket_dir = tempfile.mkdtemp(prefix="ngw-test-", dir="/tmp")
            claim = claim_forward_port("127.0.0.1")
            replica = Replica([], claim, socket_dir)
            replicas.append(replica)
            # The replica's public address, its identity (its in-process workers each listen on a port of their own).
            identity = free_port()
            for index in range(workers):
                forward_port = claim.getsockname()[1]
                worker = Worker(name, workers, socket_dir, server_class, session_secret=secret, port=identity, forward_port=forward_port, **settings)
                if index == 0:
                    worker.port = identity  # the replica's public address reaches its first worker
                replica.workers.append(await worker.start())
        yield replicas, caller
    finally:
        await caller.close()
        # All at once: each worker's stop waits out uvicorn's shutdown ticks (about 0.2 s per server it runs).
        await asyncio.gather(*(replica.stop() for replica in replicas))
        for replica in replicas:
            os.rmdir(replica.socket_dir)


@pytest.fixture
async def two_replicas():
    async with replica_set() as made:
        yield made


def session(worker: Worker, cookies: dict[str, str]) -> dict:
    return session_of(worker.server.signing_key, cookies[worker.server.session_cookie])


async def count_of(caller: Caller, worker: Worker, cookies: dict[str, str]) -> int:
    """The session's count after one more increment, asked through ``worker``."""
    response = await caller.post(worker, "/increment", cookies)
    assert response.status == 200, await response.text()
    return (await response.json())["count"]


async def test_a_session_names_its_replica_and_its_worker(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    assert session(a1, cookies)[OWNER_KEY] == a1.server.worker_id
    assert session(a1, cookies)[REPLICA_KEY] == r1.address == f"127.0.0.1:{a1.server.config.port}"
    assert session(a1, cookies)[FORWARD_PORT_KEY] == r1.claim.getsockname()[1]
    assert r1.address != r2.address
    assert all(worker.server.replica == r1.address for worker in r1.workers)


async def test_a_session_of_another_replica_reaches_its_owner_worker_from_every_worker(two_replicas):
    (r1, r2), caller = two_replicas
    for owner in r1.workers:
        cookies = await new_session(caller, owner)
        counts = []
        for entry in [*r2.workers, *r2.workers, *r1.workers]:
            response = await caller.post(entry, "/increment", cookies)
            body = await response.json()
            assert body["worker"] == owner.server.worker_id
            counts.append(body["count"])
        assert counts == list(range(2, 2 + len(counts)))


async def test_a_session_of_this_replica_takes_the_unix_path_and_never_the_forwarding_port(two_replicas):
    (r1, r2), caller = two_replicas
    a1, b1 = r1.workers
    cookies = await new_session(caller, a1)
    assert await count_of(caller, b1, cookies) == 2
    assert b1.server.replicas.pools == {}
    assert list(b1.server.transport.pools) == [a1.server.worker_id]


async def test_an_mcp_token_alone_reaches_its_owner_on_another_replica(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    session_id = session(a1, cookies)[SESSION_ID_KEY]
    token = mint_token(a1.server.tokens, session_id, a1.server.worker_id, a1.server.replica_keys)
    response = await caller.post(r2.workers[1], "/echo/x", headers={TOKEN_HEADER: token})
    assert (await response.json())["worker"] == a1.server.worker_id


async def test_a_token_of_another_instance_that_shares_the_secret_value_is_refused_not_served_by_its_owner():
    """Two instances (replica sets of one replica), one session_secret value: X's MCP token, sent to Y's /mcp, is not
    forwarded to X's forwarding port and served with X's session, but refused; at X itself it serves X's session."""
    secret = secrets.token_urlsafe(32)
    settings = {"server_class": CounterServer, "count": 1, "secret": secret, "expose_tools_over_mcp": True}
    async with replica_set(**settings) as ([x], caller), replica_set(**settings) as ([y], _):
        seeded = await caller.post(x.workers[0], "/seed_session", json={"initial_count": 100})
        assert seeded.status == 200, await seeded.text()
        token = (await seeded.json())["mcp"]["headers"][TOKEN_HEADER]
        assert await counter_over_mcp(x.workers[1], token) == 100
        for worker in y.workers:
            refusal = await counter_over_mcp(worker, token)
            assert f"not a session token signed by {y.workers[0].server.name}" in refusal


async def counter_over_mcp(worker: Worker, token: str) -> int | str:
    """The counter of the token's session, read with the official MCP client through ``worker``; or the refusal."""
    async with (
        create_mcp_http_client(headers={TOKEN_HEADER: token}) as http,
        streamable_http_client(worker.url + "/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        try:
            result = await session.call_tool("get_counter_value", {})
        except MCPError as refusal:
            return str(refusal)
    assert not result.is_error, result
    return json.loads(result.content[0].text)["count"]


async def test_a_streamed_body_and_reply_cross_replicas_whole(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    payload = os.urandom(300_000)

    async def chunks():
        for start in range(0, len(payload), 7000):
            yield payload[start : start + 7000]

    response = await caller.post(r2.workers[0], "/stream", cookies, data=chunks())
    assert response.headers["x-worker"] == a1.server.worker_id
    assert await response.read() == payload


async def test_the_transport_to_other_replicas_is_a_transport(two_replicas):
    (r1, _), _ = two_replicas
    assert isinstance(r1.workers[0].server.replicas, Transport)


def credential(
    secret: str, path: str, replica: str, worker: str, cookie: tuple[str, str], body: bytes = b"", stamp: int | None = None
) -> tuple[str, str]:
    """The credential a replica makes for a POST to ``path`` with ``cookie`` and ``body``."""
    headers = [(cookie[0].lower().encode(), cookie[1].encode())]
    name, value = ReplicaCredentials(secret).header(b"POST", path.encode(), replica, worker, headers, [body], stamp)
    return name.decode(), value.decode()


def session_cookie(worker: Worker, cookies: dict[str, str]) -> tuple[str, str]:
    return "Cookie", f"{worker.server.session_cookie}={cookies[worker.server.session_cookie]}"


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


async def test_the_public_port_ignores_replica_credentials(two_replicas):
    (r1, r2), caller = two_replicas
    a1, a2 = r1.workers[0], r2.workers[0]
    cookies = await new_session(caller, a2)
    given = [credential(a1.server.secret, "/increment", r2.address, a2.server.worker_id, session_cookie(a2, cookies))]
    # No session: a new one on the worker that took it, as for any request.
    response = await caller.post(a1, "/increment", headers=given)
    assert (await response.json())["worker"] == a1.server.worker_id
    # A session of the other replica: forwarded with this replica's own credential, the caller's dropped.
    response = await caller.post(a1, "/increment", cookies, headers=given)
    assert await response.json() == {"worker": a2.server.worker_id, "count": 2}


async def test_a_session_whose_worker_is_gone_on_a_live_replica_gets_410_from_that_replica(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    await a1.stop()
    response = await caller.post(r2.workers[0], "/increment", cookies)
    assert response.status == 410
    assert a1.server.worker_id in (await response.json())["detail"]


async def test_a_durable_session_whose_worker_is_gone_on_a_live_replica_is_adopted_within_that_host(tmp_path):
    async with replica_set(server_class=CounterServer, session_store=str(tmp_path / "store.sqlite")) as ((r1, r2), caller):
        a1, b1 = r1.workers
        response = await caller.post(a1, "/seed_session", json={"initial_count": 5})
        cookies = {key: morsel.value for key, morsel in response.cookies.items()}
        await a1.stop()
        response = await caller.post(r2.workers[0], "/increment_counter", cookies, json={"count": 1})
        assert response.status == 200, await response.text()
        adopted = {key: morsel.value for key, morsel in response.cookies.items()}
        assert session(b1, adopted)[OWNER_KEY] == b1.server.worker_id and session(b1, adopted)[REPLICA_KEY] == r1.address
        response = await caller.post(r2.workers[1], "/get_counter_value", adopted, json={})
        assert (await response.json())["count"] == 6


async def test_a_session_of_a_replica_that_refuses_connections_gets_410_naming_it():
    async with replica_set() as ((r1, r2), caller):
        cookies = await new_session(caller, r1.workers[0])
        await r1.stop()
        for entry in r2.workers:
            response = await caller.post(entry, "/increment", cookies)
            assert response.status == 410
            detail = (await response.json())["detail"]
            assert r1.address in detail and r1.workers[0].server.worker_id in detail and "refused" in detail
            assert response.headers.getall("Set-Cookie", []) == []


@contextlib.contextmanager
def silent_listener() -> socket.socket:
    """A loopback port whose accept queue is full: the kernel drops further connection attempts unanswered,
    as a host that is down or cut off does."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(listener.getsockname())
            fillers.append(filler)
        time.sleep(0.2)
        yield listener
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_silent_replica_gets_503_with_retry_after_until_peer_dead_after_seconds_then_410_naming_its_host():
    async with replica_set(count=1, peer_dead_after_seconds=8) as ((r1,), caller):
        a1 = r1.workers[0]
        with silent_listener() as listener:
            silent = f"127.0.0.1:{listener.getsockname()[1]}"
            owner = "c" * 16
            named = {SESSION_ID_KEY: "s-silent", OWNER_KEY: owner, REPLICA_KEY: "127.0.0.1:1", FORWARD_PORT_KEY: listener.getsockname()[1]}
            cookie = signed_session(a1.server.signing_key, named)
            statuses = []
            async with asyncio.timeout(60):
                while not statuses or statuses[-1] == 503:
                    response = await caller.post(a1, "/increment", {a1.server.session_cookie: cookie})
                    statuses.append(response.status)
                    body = await response.json()
                    if response.status == 503:
                        assert response.headers["Retry-After"] == "1"
                        assert silent in body["detail"]
        assert statuses[0] == 503 and statuses[-1] == 410, statuses
        assert silent in body["detail"] and owner in body["detail"] and "not answered" in body["detail"]


@contextlib.contextmanager
def unacknowledging_listener() -> socket.socket:
    """A loopback port that takes connections and never reads, its receive buffer tiny: what is sent to it
    soon stays unacknowledged (a zero window), as to a host that went away under an open connection."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield listener
    finally:
        listener.close()


async def test_a_request_a_replica_stops_acknowledging_gets_503_with_retry_after_and_counts_as_its_silence():
    """The kernel gives up on the connection (its user timeout), so the request does not wait without end."""
    async with replica_set(count=1, peer_dead_after_seconds=60) as ((r1,), caller):
        a1 = r1.workers[0]
        with unacknowledging_listener() as listener:
            address = f"127.0.0.1:{listener.getsockname()[1]}"
            named = {SESSION_ID_KEY: "s-unacknowledged", OWNER_KEY: "d" * 16, REPLICA_KEY: "127.0.0.1:1", FORWARD_PORT_KEY: listener.getsockname()[1]}
            cookie = signed_session(a1.server.signing_key, named)
            async with asyncio.timeout(60):
                response = await caller.post(a1, "/increment", {a1.server.session_cookie: cookie}, data=b"x" * (1 << 20))
                body = await response.json()
        assert (response.status, response.headers.get("Retry-After")) == (503, "1"), body
        assert address in body["detail"]
        assert a1.server.replicas.silent_for(address) >= USER_TIMEOUT_SECONDS


async def test_a_replica_that_answers_again_is_alive_again():
    """Silence counts from the first unanswered connect of an unbroken run: an answer resets it."""
    async with replica_set(peer_dead_after_seconds=0.5) as ((r1, r2), caller):
        cookies = await new_session(caller, r1.workers[0])
        transport = r2.workers[0].server.replicas
        forwarding = r1.forward_url.removeprefix("http://")
        transport.silent_since[forwarding] = asyncio.get_running_loop().time() - 0.2
        assert await count_of(caller, r2.workers[0], cookies) == 2
        assert forwarding not in transport.silent_since


async def test_replica_credentials_are_refused_outside_their_window_and_for_anything_they_were_not_made_for():
    credentials = ReplicaCredentials("x" * 40, window_seconds=10)
    headers = [(b"cookie", b"s=1"), (b"x-other", b"a")]
    _, value = credentials.header(b"GET", b"/a?b=1", "h:1", "d" * 16, headers, [b"bo", b"dy"])
    digest = hashlib.sha256(b"body").hexdigest()
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", headers, 4) == ("d" * 16, digest)
    # Headers that do not name the session are not covered; those that do are, in order.
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [(b"cookie", b"s=1")], 4) == ("d" * 16, digest)
    assert credentials.admit(value, b"GET", b"/a?b=2", "h:1", headers, 4) is None
    assert credentials.admit(value, b"POST", b"/a?b=1", "h:1", headers, 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:2", headers, 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", headers, 5) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [(b"cookie", b"s=2")], 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [*headers, (TOKEN_HEADER.lower().encode(), b"t")], 4) is None
    assert credentials.admit(value, b"GET", b"/a?b=1", "h:1", [(b"cookie", b"s=1"), (b"cookie", b"t=1")], 4) is None
    assert ReplicaCredentials("y" * 40).admit(value, b"GET", b"/a?b=1", "h:1", headers, 4) is None
    stamp, worker, _, mac = value.decode().split()
    assert credentials.admit(f"{stamp} {'e' * 16} {digest} {mac}".encode(), b"GET", b"/a?b=1", "h:1", headers, 4) is None
    other = hashlib.sha256(b"bodx").hexdigest()
    assert credentials.admit(f"{stamp} {worker} {other} {mac}".encode(), b"GET", b"/a?b=1", "h:1", headers, 4) is None
    _, late = credentials.header(b"GET", b"/a?b=1", "h:1", worker, headers, [b"body"], int(stamp) - 11)
    assert credentials.admit(late, b"GET", b"/a?b=1", "h:1", headers, 4) is None



def make_certificates(directory: str) -> dict[str, str]:
    """A CA and one certificate it signed for 127.0.0.1 (every replica here shows it): the TLS settings."""
    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True, timeout=30)

    path = {name: os.path.join(directory, name) for name in ("ca.key", "ca.pem", "r.key", "r.csr", "r.pem", "san.ext")}
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", path["ca.key"], "-out", path["ca.pem"], "-days", "1", "-subj", "/CN=replica-test-ca")
    run("req", *ec, "-keyout", path["r.key"], "-out", path["r.csr"], "-subj", "/CN=replica")
    with open(path["san.ext"], "w") as extensions:
        extensions.write("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", path["r.csr"], "-CA", path["ca.pem"], "-CAkey", path["ca.key"], "-CAcreateserial",
        "-out", path["r.pem"], "-days", "1", "-extfile", path["san.ext"])
    return {"replica_tls_certfile": path["r.pem"], "replica_tls_keyfile": path["r.key"], "replica_tls_ca_file": path["ca.pem"]}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
async def test_with_tls_between_replicas_forwards_cross_over_tls_and_plain_http_is_not_served(tmp_path):
    async with replica_set(**make_certificates(str(tmp_path))) as ((r1, r2), caller):
        owner = r1.workers[0]
        cookies = await new_session(caller, owner)
        assert await count_of(caller, r2.workers[0], cookies) == 2
        cookie = session_cookie(owner, cookies)
        given = credential(owner.server.secret, "/increment", r1.address, owner.server.worker_id, cookie)
        with pytest.raises(aiohttp.ClientError):
            await caller.http.post(r1.forward_url + "/increment", headers=[given, cookie])
        assert await count_of(caller, r2.workers[1], cookies) == 3


async def pool_increments(pool: OwnerPool, url: str, server: Worker, cookies: dict[str, str], times: int) -> list[tuple[str, int]]:
    """Gym's owner pool sends ``/increment`` for the session, given ``url``: (worker that answered, count) each time."""
    answers = []
    async with aiohttp.ClientSession() as shared:
        for _ in range(times):
            response = await pool.request(
                shared, server.server.name, cookies[server.server.session_cookie], "POST", url + "/increment", headers={"Cookie": cookie_header(cookies)}
            )
            answers.append((response.headers[WORKER_HEADER], (await response.json())["count"]))
    await pool.close()
    return answers


async def test_gyms_client_sends_a_session_straight_to_its_owner_replica(two_replicas):
    (r1, r2), caller = two_replicas
    a1 = r1.workers[0]
    cookies = await new_session(caller, a1)
    answers = await pool_increments(OwnerPool(), r2.workers[0].url, a1, cookies, 4)
    assert answers == [(a1.server.worker_id, count) for count in range(2, 6)]  # answered by the owner itself: no hop
    assert all(worker.server.replicas.pools == {} for worker in r2.workers)  # nothing crossed from the other replica


async def test_gyms_client_sends_to_the_url_it_was_given_when_the_owner_replica_takes_no_connection_from_it(two_replicas):
    (r1, r2), caller = two_replicas
    a1, b1 = r1.workers
    cookies = await new_session(caller, b1)
    await a1.stop()  # the replica's public address takes no connection now; its forwarding port still does (b1)
    r2_entry = r2.workers[1]
    pool = OwnerPool()
    answers = await pool_increments(pool, r2_entry.url, b1, cookies, 2)
    assert answers == [(r2_entry.server.worker_id, 2), (r2_entry.server.worker_id, 3)]
    assert r1.address in pool.unreachable  # tried once, then not again for a while
