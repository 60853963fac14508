"""A busy owner is never declared dead: real workers, one blocked while 3000 requests queue for its sessions.

The server is scripts/bench/server.py's BenchServer at 2 workers, whose ``/verify`` holds its worker's
event loop for seconds of CPU. While the owner burns, only its sibling accepts connections, and every
request for the owner's sessions is forwarded into the owner's private socket's backlog.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

import aiohttp

from nemo_gym.client.reading import cookie_header
from nemo_gym.routing.transport.unix import live_workers, make_socket_dir, remove_socket_dir
from scripts.bench.client import VERIFY_BODY
from scripts.bench.processes import Spawned
from scripts.bench.servers import bench_server, owner_of, server_env, write_config

INSTANCE = "busy"
QUEUED = 3000
BLOCK_CPU_MS = 4000
# The client opens 3000 connections at once: on two loaded cores more than the 10 s default may pass between
# a connection's accept and its head, and the server ends such a connection (408: slow clients, whose tests
# are in test_input_limits.py). This test is about a busy owner, so its clients get longer to speak.
HEADER_TIMEOUT_SECONDS = 120


def test_blocked_owner_with_3000_requests_queued_answers_every_one_and_never_410():
    log_dir = Path(tempfile.mkdtemp(prefix="busy_owner_"))
    socket_dir = make_socket_dir()
    instances, config_path = write_config(log_dir, INSTANCE, {INSTANCE: bench_server(num_workers=2, verify_cpu_ms=BLOCK_CPU_MS, header_timeout_seconds=HEADER_TIMEOUT_SECONDS)})
    argv = [sys.executable, "-m", "scripts.bench.server", "serve", "--module", "scripts.bench.server"]
    server = Spawned(INSTANCE, argv, log_dir, server_env(config_path, INSTANCE, socket_dir))
    try:
        server.wait_ready(instances[INSTANCE].url + "/", timeout=120)
        asyncio.run(wait_for_workers(socket_dir, 2))
        statuses = asyncio.run(block_and_queue(instances[INSTANCE].url))
    finally:
        server.stop()
        remove_socket_dir(socket_dir)
        shutil.rmtree(log_dir, ignore_errors=True)
    counts = {status: statuses.count(status) for status in set(statuses)}
    assert set(counts) <= {200, "503 with Retry-After"}, counts
    assert counts.get(200, 0) > 0


async def wait_for_workers(socket_dir: str, count: int) -> None:
    async with asyncio.timeout(60):
        while live_workers(socket_dir) < count:
            await asyncio.sleep(0.1)


async def block_and_queue(url: str) -> list[object]:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=0),
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=120),
    ) as http:
        sessions = await asyncio.gather(*(seed(http, url) for _ in range(40)))
        owner = owner_of(sessions[0], INSTANCE)
        of_owner = [cookies for cookies in sessions if owner_of(cookies, INSTANCE) == owner]
        blocker = asyncio.ensure_future(http.post(url + "/verify", json=VERIFY_BODY, headers={"Cookie": cookie_header(of_owner[0])}))
        await asyncio.sleep(0.5)  # the owner is now burning CPU in /verify, its event loop held

        async def queued(number: int) -> object:
            # The owner's other sessions: the blocker's ends with its /verify.
            headers = {"Cookie": cookie_header(of_owner[1 + number % (len(of_owner) - 1)])}
            async with http.post(url + "/touch", headers=headers) as reply:
                await reply.read()
                if reply.status == 503 and reply.headers.get("Retry-After"):
                    return "503 with Retry-After"
                served_by = owner_of({name: morsel.value for name, morsel in reply.cookies.items()}, INSTANCE)
                return reply.status if served_by == owner else f"{reply.status} from a worker that is not the owner"

        statuses = await asyncio.gather(*(queued(number) for number in range(QUEUED)))
        blocked = await blocker
        blocked.release()
        assert blocked.status == 200  # the owner did burn its CPU in /verify
        return statuses


async def seed(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    async with http.post(url + "/seed_session", json={}) as reply:
        assert reply.status == 200, await reply.text()
        return {name: morsel.value for name, morsel in reply.cookies.items()}
