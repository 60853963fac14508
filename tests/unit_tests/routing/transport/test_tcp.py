"""The TCP transport's side of the seam: its peers are other replicas' workers, it stamps their credential, and it says why one is lost."""

from __future__ import annotations

import asyncio
import socket

import pytest

from nemo_gym.routing.replica import ReplicaPeer
from nemo_gym.routing.transport.credentials import AUTH_HEADER_KEY, ReplicaCredentials, body_digest
from nemo_gym.routing.transport.tcp import Doorkeeper, TcpTransport

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
