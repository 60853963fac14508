"""The TCP transport's side of the seam: its peers are other replicas' workers, it stamps their credential, and it says why one is lost.

Between two in-process replicas of two workers each, on loopback (``replica_sets``): a request to another replica
carries one credential, the transport's own, and speaks TLS when configured; a peer that refuses connections, stays
silent or stops acknowledging is lost (503 with Retry-After until ``peer_dead_after_seconds``, then 410 naming its
host), and alive again once it answers. What the forwarding port admits is ``test_replica_port``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time

import aiohttp
import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.config import free_port
from nemo_gym.routing.replica import FORWARD_PORT_KEY, REPLICA_KEY, ReplicaPeer
from nemo_gym.routing.transport.base import Transport
from nemo_gym.routing.transport.credentials import AUTH_HEADER_KEY, ReplicaCredentials, body_digest
from nemo_gym.routing.transport.replica_port import Doorkeeper
from nemo_gym.routing.transport.tcp import USER_TIMEOUT_SECONDS, TcpTransport
from nemo_gym.sessions.worker import OWNER_KEY
from tests.session_cookies import signed_session
from tests.unit_tests.routing.replica_sets import count_of, credential, replica_set, session_cookie, two_replicas  # noqa: F401 (fixture)
from tests.unit_tests.routing_workers import new_session

pytestmark = pytest.mark.anyio

THIS = "127.0.0.1:18001"
OTHER = "127.0.0.2:18002"
WORKER, SIBLING = "a" * 16, "b" * 16


def transport(secret: str = "shared") -> TcpTransport:
    return TcpTransport(ReplicaCredentials(secret), THIS, "127.0.0.1", 0)


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


async def test_a_replicas_kept_connections_serve_the_worker_they_were_kept_for_and_a_dead_replicas_are_all_dropped():
    """A kept connection reaches the worker its last request was handed to (``SessionRouter.from_replica``): it is
    reused for that worker's requests only. A replica found dead is gone whole: every connection to it is dropped."""
    server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    tcp = transport()
    try:
        connection = await tcp.connect(ReplicaPeer(WORKER, OTHER, address))
        tcp.give_back(ReplicaPeer(WORKER, OTHER, address), connection)
        other = await tcp.connect(ReplicaPeer(SIBLING, OTHER, address))
        assert other is not connection
        tcp.give_back(ReplicaPeer(SIBLING, OTHER, address), other)
        assert await tcp.connect(ReplicaPeer(WORKER, OTHER, address)) is connection
        tcp.give_back(ReplicaPeer(WORKER, OTHER, address), connection)
        tcp.forget(ReplicaPeer(WORKER, OTHER, address))
        assert tcp.pools == {} and connection.closed and other.closed
    finally:
        await tcp.close()
        server.close()
        await server.wait_closed()


async def test_the_transport_to_other_replicas_is_a_transport(two_replicas):
    (r1, _), _ = two_replicas
    assert isinstance(r1.workers[0].server.replicas, Transport)


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


