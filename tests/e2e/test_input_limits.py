"""The limits on request heads and on slow clients, on real processes: the counter at 2 workers, with
the default head limit and time limits of a second, probed by raw sockets (``nemo_gym/protocols/input_limits.py``).

The counter has a ``session_secret``, so it is a replica of a replica set (of one), and its forwarding
port is held to the same time limits (``nemo_gym/routing/transport/tcp.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import secrets
import signal
from pathlib import Path

import httpx
import pytest
import requests

from nemo_gym.client.reading import cookie_header
from nemo_gym.protocols.input_limits import DEFAULT_MAX_HEADER_BYTES
from nemo_gym.process.launcher import Launcher
from nemo_gym.sessions.worker import WORKER_HEADER
from nemo_gym.routing.replica import REPLICA_KEY, forward_address
from nemo_gym.routing.transport.credentials import ReplicaCredentials
from nemo_gym.routing.transport.unix import socket_address
from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key
from tests.e2e.test_every_server_kind import rss_kb, serving_processes
from tests.session_cookies import session_of

LIMIT = DEFAULT_MAX_HEADER_BYTES
TIMEOUT_SECONDS = 1
MIN_RATE = 1000
SETTINGS = {
    "num_workers": 2,
    "header_timeout_seconds": TIMEOUT_SECONDS,
    "body_timeout_seconds": TIMEOUT_SECONDS,
    "min_body_bytes_per_second": MIN_RATE,
    "session_secret": secrets.token_urlsafe(32),
}
STACK = {"counter": {"resources_servers": {"example_session_state_mgmt": SETTINGS}}}
# What a refused connection may take to be answered and closed, generously: a loaded machine.
VERDICT_BOUND_SECONDS = 20
HUGE_HEADER_BYTES = 32 * 1024 * 1024
RSS_GROWTH_LIMIT_KB = 20 * 1024
SLOW_CLIENTS = 150
BYTE_PAUSE_SECONDS = 0.1
# systemd's default soft limit on a service's open files, and a flood of idle connections well over it.
DESCRIPTOR_LIMIT = 1024
IDLE_FLOOD = 2500


@pytest.fixture(scope="module")
def stack(start_module_servers) -> Launcher:
    return start_module_servers(STACK)


@pytest.fixture(scope="module")
def port(stack) -> int:
    return stack.instances["counter"].port


def head_of(size: int, request_line: str = "GET / HTTP/1.1", extra: str = "") -> bytes:
    """A request head of exactly ``size`` bytes, padded by one header."""
    start = f"{request_line}\r\nHost: x\r\n{extra}X-Pad: ".encode()
    end = b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def small_headers_head(size: int, request_line: str, extra: str) -> bytes:
    """A head of exactly ``size`` bytes made of many headers without a space after the colon: the
    forwarder's rebuilt head (a space after every colon) is about a fifth longer."""
    start = f"{request_line}\r\nHost: x\r\n{extra}".encode()
    line = b"a:b\r\n"
    count, rest = divmod(size - len(start) - 2 - len(b"z:\r\n"), len(line))
    return start + line * count + b"z:" + b"c" * rest + b"\r\n\r\n"


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection, sending nothing more."""
    return await reader.read() == b""


async def send_and_read(port: int, data: bytes) -> tuple[int, dict[str, str], bytes, bool]:
    """One request on a fresh connection: the reply, and whether the server then closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(VERDICT_BOUND_SECONDS):
            writer.write(data)
            status, headers, body = await read_reply(reader)
            return status, headers, body, headers.get("connection") == "close" and await closed(reader)
    finally:
        writer.close()


def seeded_session(stack: Launcher, initial_count: int) -> tuple[dict[str, str], str]:
    """A new session of the counter's, and the worker that owns it (the one that accepted its first request)."""
    reply = requests.post(stack.instances["counter"].url + "/seed_session", json={"initial_count": initial_count}, timeout=30)
    assert reply.status_code == 200
    return reply.cookies.get_dict(), reply.headers[WORKER_HEADER]


async def connection_to_worker_other_than(port: int, worker: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A kept-alive connection that a worker other than ``worker`` accepted (the reply's label names it)."""
    for _ in range(100):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        _, headers, _ = await read_reply(reader)
        if headers[WORKER_HEADER.lower()] != worker:
            return reader, writer
        writer.close()
    raise AssertionError(f"no connection reached a worker other than {worker} in 100 tries")


async def trickle(port: int, at_once: bytes, data: bytes) -> tuple[int, bool]:
    """Send ``at_once``, then ``data`` a byte at a time until the server answers; its status, and whether it then closed."""
    return await trickle_on(*await asyncio.open_connection("127.0.0.1", port), at_once, data)


async def trickle_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, at_once: bytes, data: bytes) -> tuple[int, bool]:
    try:
        async with asyncio.timeout(VERDICT_BOUND_SECONDS):
            reply = asyncio.ensure_future(read_reply(reader))
            writer.write(at_once)
            for byte in data:
                if reply.done():
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(BYTE_PAUSE_SECONDS)
            status, headers, _ = await reply
            return status, headers.get("connection") == "close" and await closed(reader)
    finally:
        writer.close()


def seed_request(size: int) -> tuple[bytes, bytes]:
    """A /seed_session request with a body of ``size`` bytes (JSON padded with spaces)."""
    start = b'{"initial_count": 0'
    body = start + b" " * (size - len(start) - 1) + b"}"
    head = b"POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head, body


def slow_head() -> tuple[bytes, bytes]:
    """A head, all of it a byte at a time."""
    return b"", head_of(1000)


def slow_body() -> tuple[bytes, bytes]:
    """A head at once, then its body a byte at a time."""
    return seed_request(1000)


def test_a_head_of_exactly_64_kib_is_served(port):
    status, _, body, _ = asyncio.run(send_and_read(port, head_of(LIMIT)))
    assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_a_head_one_byte_over_64_kib_gets_431_and_the_connection_closes(port):
    status, _, body, closed_after = asyncio.run(send_and_read(port, head_of(LIMIT + 1)))
    assert status == 431
    assert "limit of 65536 bytes (max_header_bytes)" in json.loads(body)["detail"]
    assert closed_after


@pytest.mark.parametrize("client", ["requests", "httpx"])
def test_a_standard_client_sending_a_1_mib_header_reads_the_431(stack, client):
    url = stack.instances["counter"].url + "/"
    headers = {"X-Big": "a" * (1024 * 1024)}
    if client == "requests":
        reply = requests.get(url, headers=headers, timeout=VERDICT_BOUND_SECONDS)
    else:
        reply = httpx.get(url, headers=headers, timeout=VERDICT_BOUND_SECONDS)
    assert reply.status_code == 431
    assert "max_header_bytes" in reply.json()["detail"]


def test_a_chunked_trailer_over_the_limit_gets_431(port):
    head = b"POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b'{"initial_count": 0}'
    trailer = b"X-Trailer: " + b"a" * (4 * LIMIT) + b"\r\n\r\n"
    status, _, _, closed_after = asyncio.run(send_and_read(port, head + b"%x\r\n%s\r\n0\r\n" % (len(body), body) + trailer))
    assert (status, closed_after) == (431, True)


def reset_peak_rss(pid: int) -> None:
    """Restart the kernel's record of the process's peak RSS (VmHWM) from its RSS now."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except PermissionError:
        pytest.skip("resetting a worker's peak RSS needs root")


def peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for process {pid}")


def test_a_32_mib_header_gets_431_and_grows_no_worker_by_20_mb_even_at_its_peak(stack, port):
    workers = serving_processes(stack.processes["counter"].pid)
    assert len(workers) == 2
    for pid in workers:
        reset_peak_rss(pid)
    before = {pid: rss_kb(pid) for pid in workers}

    async def send_huge() -> tuple[int, bool]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            async with asyncio.timeout(VERDICT_BOUND_SECONDS * 3):
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Huge: ")
                chunk = b"a" * (1024 * 1024)
                try:
                    for _ in range(HUGE_HEADER_BYTES // len(chunk)):
                        writer.write(chunk)
                        await writer.drain()
                    writer.write(b"\r\n\r\n")
                    await writer.drain()
                except ConnectionError:
                    pass  # the server stopped reading: its answer is waiting
                status, headers, _ = await read_reply(reader)
                return status, headers.get("connection") == "close"
        finally:
            writer.close()

    status, close = asyncio.run(send_huge())
    growth = {pid: peak_rss_kb(pid) - before[pid] for pid in workers}
    assert max(growth.values()) < RSS_GROWTH_LIMIT_KB, growth
    assert (status, close) == (431, True)
    assert requests.get(stack.instances["counter"].url + "/", timeout=30).json() == {"status": "ok"}


def test_the_head_limit_holds_for_a_request_forwarded_to_another_owner(stack, port):
    cookies, owner = seeded_session(stack, initial_count=7)
    request_line = "POST /get_counter_value HTTP/1.1"
    extra = f"Cookie: {cookie_header(cookies)}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"

    async def over_and_at_the_limit() -> list[tuple[int, bytes]]:
        results = []
        for head in (head_of(LIMIT + 1, request_line, extra), small_headers_head(LIMIT, request_line, extra)):
            reader, writer = await connection_to_worker_other_than(port, owner)
            try:
                async with asyncio.timeout(VERDICT_BOUND_SECONDS):
                    writer.write(head + b"{}")
                    status, _, body = await read_reply(reader)
                    results.append((status, body))
            finally:
                writer.close()
        return results

    (over, over_body), (at, at_body) = asyncio.run(over_and_at_the_limit())
    assert over == 431, over_body
    # At the limit, the forwarded head is longer than the limit, and the owner still serves it.
    assert (at, json.loads(at_body)) == (200, {"count": 7})


def test_the_private_socket_refuses_a_head_over_three_times_the_limit(stack):
    """Three times: a forwarded head is rebuilt and carries the forwarding worker's reading of the cookie (``InputLimits.for_siblings``)."""
    _, owner = seeded_session(stack, initial_count=0)
    path = socket_address(stack.socket_dirs["counter"], owner)

    async def on_private_socket(head: bytes) -> tuple[int, bool]:
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            async with asyncio.timeout(VERDICT_BOUND_SECONDS):
                writer.write(head)
                status, headers, _ = await read_reply(reader)
                return status, headers.get("connection") == "close" and await closed(reader)
        finally:
            writer.close()

    assert asyncio.run(on_private_socket(head_of(3 * LIMIT)))[0] == 200
    assert asyncio.run(on_private_socket(head_of(3 * LIMIT + 1))) == (431, True)


def test_a_head_sent_a_byte_at_a_time_gets_408_and_the_connection_closes(port):
    assert asyncio.run(trickle(port, *slow_head())) == (408, True)


def test_a_body_sent_a_byte_at_a_time_gets_408_and_the_connection_closes(port):
    assert asyncio.run(trickle(port, *slow_body())) == (408, True)


def test_a_slow_body_for_a_session_of_another_worker_gets_408_and_the_session_still_serves(stack, port):
    cookies, owner = seeded_session(stack, initial_count=3)
    head, body = seed_request(1000)
    head = head.replace(b"Host: x\r\n", f"Host: x\r\nCookie: {cookie_header(cookies)}\r\n".encode())

    async def slow_forward() -> tuple[int, bool]:
        return await trickle_on(*await connection_to_worker_other_than(port, owner), head, body)

    assert asyncio.run(slow_forward()) == (408, True)
    reply = requests.post(stack.instances["counter"].url + "/get_counter_value", json={}, cookies=cookies, timeout=30)
    assert reply.json() == {"count": 3}


def test_a_body_that_keeps_moving_is_served_however_long_it_takes(port):
    # Five times the minimum rate, for three windows of the time limit.
    rate = 5 * MIN_RATE
    head, body = seed_request(3 * rate * TIMEOUT_SECONDS)

    async def steady() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            async with asyncio.timeout(VERDICT_BOUND_SECONDS):
                writer.write(head)
                piece = rate // 20
                for start in range(0, len(body), piece):
                    writer.write(body[start : start + piece])
                    await asyncio.sleep(piece / rate)
                return (await read_reply(reader))[0]
        finally:
            writer.close()

    assert asyncio.run(steady()) == 200


async def idle_closed(port: int) -> bool:
    """Whether a connection to ``port`` that sends nothing is closed without a reply (within the verdict's bound)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(VERDICT_BOUND_SECONDS):
            return await closed(reader)
    finally:
        writer.close()


def test_a_connection_that_sends_nothing_is_closed_without_a_reply(port):
    assert asyncio.run(idle_closed(port))


def test_with_150_slow_clients_holding_connections_others_are_served_and_the_slow_ones_closed(stack, port):
    url = stack.instances["counter"].url

    async def meanwhile() -> tuple[list[tuple[int, bool]], list[int]]:
        slow = [asyncio.ensure_future(trickle(port, *(slow_head() if number % 2 else slow_body()))) for number in range(SLOW_CLIENTS)]
        await asyncio.sleep(2 * BYTE_PAUSE_SECONDS)
        served = []
        async with httpx.AsyncClient(timeout=VERDICT_BOUND_SECONDS) as client:
            for _ in range(5):
                served.append((await client.post(url + "/seed_session", json={"initial_count": 1})).status_code)
        return await asyncio.gather(*slow), served

    slow, served = asyncio.run(meanwhile())
    assert served == [200] * 5
    assert slow == [(408, True)] * SLOW_CLIENTS


def test_a_head_that_came_while_its_worker_was_stopped_past_the_time_limit_is_served(stack, port):
    workers = serving_processes(stack.processes["counter"].pid)
    head = head_of(1000)

    async def across_a_stop() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            async with asyncio.timeout(VERDICT_BOUND_SECONDS):
                writer.write(head[:100])
                await writer.drain()
                await asyncio.sleep(0.2)  # the worker has begun timing the head
                for pid in workers:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    writer.write(head[100:])
                    await writer.drain()
                    await asyncio.sleep(3 * TIMEOUT_SECONDS)
                finally:
                    for pid in workers:
                        os.kill(pid, signal.SIGCONT)
                return (await read_reply(reader))[0]
        finally:
            writer.close()

    assert asyncio.run(across_a_stop()) == 200


def test_a_kept_alive_connection_idle_past_the_head_time_limit_is_still_served(port):
    async def twice_with_a_pause() -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        statuses = []
        try:
            async with asyncio.timeout(VERDICT_BOUND_SECONDS):
                for _ in range(2):
                    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    statuses.append((await read_reply(reader))[0])
                    await asyncio.sleep(3 * TIMEOUT_SECONDS)
                return statuses
        finally:
            writer.close()

    assert asyncio.run(twice_with_a_pause()) == [200, 200]


def test_pipelined_requests_each_within_the_limit_are_all_served(port):
    head, body = seed_request(300_000)
    pipelined = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + head + body + head_of(LIMIT)

    async def pipeline() -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            async with asyncio.timeout(VERDICT_BOUND_SECONDS):
                writer.write(pipelined)
                return [(await read_reply(reader))[0] for _ in range(3)]
        finally:
            writer.close()

    assert asyncio.run(pipeline()) == [200, 200, 200]


def forwarding_port(stack: Launcher) -> tuple[int, dict[str, str], dict]:
    """The replica's forwarding port, read from a new session's cookie; the cookies and the session."""
    cookies, _ = seeded_session(stack, initial_count=0)
    session = session_of(instance_key(SETTINGS["session_secret"], "counter"), cookies[session_cookie_name("counter")])
    return int(forward_address(session).rpartition(":")[2]), cookies, session


def test_the_forwarding_port_closes_a_connection_that_sends_nothing_or_half_a_head_after_the_header_timeout(stack):
    forward, _, _ = forwarding_port(stack)

    async def half_a_head() -> tuple[int, bool]:
        reader, writer = await asyncio.open_connection("127.0.0.1", forward)
        try:
            async with asyncio.timeout(VERDICT_BOUND_SECONDS):
                writer.write(b"POST /increment_counter HTTP/1.1\r\nHost: x\r\n")
                status, headers, _ = await read_reply(reader)
                return status, headers.get("connection") == "close" and await closed(reader)
        finally:
            writer.close()

    assert asyncio.run(idle_closed(forward))
    assert asyncio.run(half_a_head()) == (408, True)
    assert asyncio.run(trickle(forward, *slow_head())) == (408, True)


def test_a_body_sent_a_byte_at_a_time_to_the_forwarding_port_with_a_valid_credential_gets_408(stack):
    forward, cookies, session = forwarding_port(stack)
    body = b'{"count": 1}' + b" " * 100
    cookie = [(b"cookie", cookie_header(cookies).encode())]
    credentials = ReplicaCredentials(SETTINGS["session_secret"])
    name, value = credentials.header(b"POST", b"/increment_counter", session[REPLICA_KEY], session[OWNER_KEY], cookie, [body])
    head = b"POST /increment_counter HTTP/1.1\r\nHost: x\r\nCookie: %s\r\n%s: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
        cookie[0][1], name, value, len(body))
    assert asyncio.run(trickle(forward, head, body)) == (408, True)
    reply = requests.post(stack.instances["counter"].url + "/get_counter_value", json={}, cookies=cookies, timeout=30)
    assert reply.json() == {"count": 0}


@pytest.fixture
def descriptor_limit(stack):
    """Every worker of the counter held to ``DESCRIPTOR_LIMIT`` open files for the test (as systemd's default
    soft limit would), and this process allowed the flood's sockets."""
    workers = serving_processes(stack.processes["counter"].pid)
    before = {pid: resource.prlimit(pid, resource.RLIMIT_NOFILE) for pid in workers}
    own = resource.getrlimit(resource.RLIMIT_NOFILE)
    if own[1] != resource.RLIM_INFINITY and own[1] < IDLE_FLOOD + 100:
        pytest.skip(f"this process may not open {IDLE_FLOOD} sockets (hard limit {own[1]})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(own[0], IDLE_FLOOD + 100), own[1]))
    for pid, (_, hard) in before.items():
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (DESCRIPTOR_LIMIT, hard))
    try:
        yield
    finally:
        for pid, limits in before.items():
            resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        resource.setrlimit(resource.RLIMIT_NOFILE, own)


def test_2500_idle_half_heads_to_the_forwarding_port_at_a_1024_descriptor_limit_leave_the_public_port_serving(stack, port, descriptor_limit):
    forward, _, _ = forwarding_port(stack)

    async def flood_then_public() -> list[int]:
        writers = []
        try:
            for _ in range(IDLE_FLOOD):
                _, writer = await asyncio.open_connection("127.0.0.1", forward)
                writer.write(b"POST /increment_counter HTTP/1.1\r\nHost: x\r\n")
                writers.append(writer)
            # Held open by this side while the public port is asked, twice on new connections.
            return [(await send_and_read(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))[0] for _ in range(2)]
        finally:
            for writer in writers:
                writer.close()

    assert asyncio.run(flood_then_public()) == [200, 200]
