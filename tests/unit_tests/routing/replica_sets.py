"""A replica set in this process, for the tests of replicas: the replicas of one server (same name and session_secret),
each of in-process workers on loopback with its own socket directory and forwarding port (held as its main process holds it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from nemo_gym.config import free_port
from nemo_gym.routing.transport.credentials import ReplicaCredentials
from nemo_gym.routing.transport.replica_port import claim_forward_port
from tests.session_cookies import session_of
from tests.unit_tests.routing_workers import Caller, EchoServer, Worker


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


def credential(
    secret: str, path: str, replica: str, worker: str, cookie: tuple[str, str], body: bytes = b"", stamp: int | None = None
) -> tuple[str, str]:
    """The credential a replica makes for a POST to ``path`` with ``cookie`` and ``body``."""
    headers = [(cookie[0].lower().encode(), cookie[1].encode())]
    name, value = ReplicaCredentials(secret).header(b"POST", path.encode(), replica, worker, headers, [body], stamp)
    return name.decode(), value.decode()


def session_cookie(worker: Worker, cookies: dict[str, str]) -> tuple[str, str]:
    return "Cookie", f"{worker.server.session_cookie}={cookies[worker.server.session_cookie]}"
