"""The TCP transport's side of the seam: its peers are other replicas' workers, it stamps their credential, and it says why one is lost.

Between two in-process replicas of two workers each, on loopback (``replica_sets``): the forwarding port takes only
requests with a valid credential (read off the wire, replayed or hostile ones refused), caps its connections not yet
authenticated, and speaks TLS when configured; a peer that refuses connections, stays silent or stops acknowledging is
lost (503 with Retry-After until ``peer_dead_after_seconds``, then 410 naming its host), and alive again once it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import aiohttp
import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.routing.replica import FORWARD_PORT_KEY, REPLICA_KEY, ReplicaPeer
from nemo_gym.routing.transport.base import Transport
from nemo_gym.routing.transport.credentials import AUTH_HEADER, AUTH_HEADER_KEY, WINDOW_SECONDS, ReplicaCredentials, body_digest
from nemo_gym.routing.transport.tcp import USER_TIMEOUT_SECONDS, Doorkeeper, TcpTransport
from nemo_gym.sessions.worker import OWNER_KEY
from resources_servers.example_session_state_mgmt.app import CounterServer
from tests.e2e.test_input_limits import read_reply
from tests.session_cookies import signed_session
from tests.unit_tests.routing.replica_sets import Replica, count_of, replica_set, session, two_replicas  # noqa: F401 (fixture)
from tests.unit_tests.routing_workers import Worker, new_session

pytestmark = pytest.mark.anyio

THIS = "127.0.0.1:18001"
OTHER = "127.0.0.2:18002"
WORKER, SIBLING = "a" * 16, "b" * 16


def transport(secret: str = "shared") -> TcpTransport:
    return TcpTransport(ReplicaCredentials(secret), THIS, "127.0.0.1", 0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_request_to_a_replica_carries_one_credential_its_port_admits_in_place_of_the_callers():
    headers = [(b"cookie", b"counter_session=x"), (AUTH_HEADER_KEY, b"the caller's own"), (b"content-length", b"4")]
    scope = {"method": "POST", "path": "/increment", "raw_path": b"/increment", "query_string": b""}
    transport().stamper(ReplicaPeer(WORKER, OTHER, "127.0.0.2:9000"))(scope, headers, [b"bo", b"dy"])
    assert [name for name, _ in headers].count(AUTH_HEADER_KEY) == 1
    assert Doorkeeper(ReplicaCredentials("shared"), OTHER).admit(b"POST", b"/increment", headers) == (WORKER, body_digest([b"body"]))
    assert Doorkeeper(ReplicaCredentials("shared"), THIS).admit(b"POST", b"/increment", headers) is None  # for that replica only
    assert Doorkeeper(ReplicaCredentials("other"), OTHER).admit(b"POST", b"/increment", headers) is None


async def test_a_replica_that_refuses_connections_is_dead_and_lost_naming_its_worker_replica_and_why():
    tcp = transport()
    peer = ReplicaPeer(WORKER, OTHER, f"127.0.0.1:{free_port()}")
    with pytest.raises(ConnectionRefusedError):
        await tcp.connect(peer)
    assert not tcp.is_alive(peer) and await tcp.proves_dead(peer)
    assert tcp.lost_owner(peer) == f"{WORKER} of replica {OTHER} (its host refused the connection at {peer.address}: nothing listens there)"
    assert tcp.worker_of(peer) == WORKER


async def test_a_silent_replica_is_busy_and_its_503_says_how_long_until_it_counts_dead():
    detail = transport().busy_detail(ReplicaPeer(WORKER, OTHER, "127.0.0.2:9000"), 3)
    assert f"Replica {OTHER}" in detail and "for 3 s" in detail and "30 s (peer_dead_after_seconds)" in detail


async def test_a_replicas_workers_share_its_kept_connections():
    server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    tcp = transport()
    try:
        connection = await tcp.connect(ReplicaPeer(WORKER, OTHER, address))
        tcp.give_back(ReplicaPeer(WORKER, OTHER, address), connection)
        assert await tcp.connect(ReplicaPeer(SIBLING, OTHER, address)) is connection
        tcp.give_back(ReplicaPeer(SIBLING, OTHER, address), connection)
        tcp.forget(ReplicaPeer(WORKER, OTHER, address))
        assert tcp.pools == {} and connection.closed
    finally:
        await tcp.close()
        server.close()
        await server.wait_closed()


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

