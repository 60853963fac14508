"""Hand-off on one host: a request for another worker's session moves its connection to that worker.

One counter at 4 workers (``hand_off`` on, placement off: a new session lives where its connection is),
started once for the module. Raw connections show where a connection is: a seed without a cookie starts its
session on the worker that holds the connection, which the reply's worker header names.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import time

import aiohttp

import pytest

from nemo_gym.process.launcher import children
from nemo_gym.routing.transport.unix import life_sockets
from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.worker import WORKER_HEADER
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, run_episodes
from tests.e2e.session_routing.test_standard_clients import EPISODE_CLIENTS, EPISODES
from tests.unit_tests.metrics.scrape import metric, summed

COUNTER = "example_session_state_mgmt"
NAME = "counter_hand_off"
WORKERS = 4
TIMEOUT_SECONDS = 30
# Connections opened at most to find sessions on two (or every) different workers.
MAX_TRIES = 200
# Requests for a stopped owner's session: more than its hand-off socket queues from its siblings (each sibling's
# queue is bounded by its send buffer, a few hundred small hand-offs).
FROZEN_REQUESTS = 600


@pytest.fixture(scope="module")
def counter(start_module_servers):
    config = {NAME: {"resources_servers": {COUNTER: {"num_workers": WORKERS, "hand_off": True, "place_sessions": False}}}}
    launcher = start_module_servers(config, timeout=120)
    return launcher, launcher.instances[NAME]


class Connection:
    """One raw keep-alive connection: requests written as bytes, replies read in order by http.client."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_SECONDS)
        self.file = self.sock.makefile("rb")

    def makefile(self, *args, **kwargs):
        return Kept(self.file)  # every reply read from one buffer, so pipelined replies are not lost between them

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> tuple[int, str, dict, str | None]:
        """Status, the worker header, the JSON body, and the session cookie it set (if any)."""
        response = http.client.HTTPResponse(self)
        response.begin()
        body = json.loads(response.read())
        match = re.match(rf"{session_cookie_name(NAME)}=([^;]*)", response.getheader("set-cookie") or "")
        return response.status, response.getheader(WORKER_HEADER), body, match and match.group(1)

    def metric(self, name: str, **labels: str) -> float:
        """The sum over the instance's workers of ``name``'s samples that carry ``labels``, read over this connection."""
        self.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        response = http.client.HTTPResponse(self)
        response.begin()
        return summed(response.read().decode(), name, **labels)

    def post(self, path: str, payload: dict, cookie: str | None = None) -> tuple[int, str, dict, str | None]:
        self.write(request(path, payload, cookie))
        return self.reply()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Kept:
    """The connection's buffered reader, which a reply read to its end does not close."""

    def __init__(self, file) -> None:
        self.file = file

    def __getattr__(self, name: str):
        return getattr(self.file, name)

    def close(self) -> None:
        pass


def request(path: str, payload: dict, cookie: str | None = None, body: bytes | None = None) -> bytes:
    body = json.dumps(payload).encode() if body is None else body
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    if cookie is not None:
        lines.append(f"Cookie: {session_cookie_name(NAME)}={cookie}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def counted(connection: Connection, cookie: str) -> tuple[int, str, int]:
    """The status, worker and count of a read of the session's counter over ``connection``."""
    status, worker, body, _ = connection.post("/get_counter_value", {}, cookie)
    return status, worker, body.get("count")


def seeded(port: int, start: int) -> tuple[Connection, str, str]:
    """A connection, the session a seed on it started, and the worker that holds both."""
    connection = Connection(port)
    status, worker, _, cookie = connection.post("/seed_session", {"initial_count": start})
    assert status == 200 and cookie
    return connection, worker, cookie


def on_every_worker(port: int, start: int = 0) -> dict[str, tuple[Connection, str]]:
    """For each worker: a connection it holds and a session it owns (the counter at ``start``)."""
    found: dict[str, tuple[Connection, str]] = {}
    for _ in range(MAX_TRIES):
        connection, worker, cookie = seeded(port, start)
        if worker in found:
            connection.close()
        else:
            found[worker] = (connection, cookie)
        if len(found) == WORKERS:
            return found
    raise AssertionError(f"new connections reached only workers {sorted(found)}")


def close_all(found: dict[str, tuple[Connection, str]]) -> None:
    for connection, _ in found.values():
        connection.close()


def test_a_connection_moves_to_the_worker_whose_session_it_names_and_stays_there(counter):
    _, instance = counter
    found = on_every_worker(instance.port)
    try:
        (holder, (connection, _)), (owner, (_, cookie)) = list(found.items())[:2]
        assert connection.post("/increment_counter", {"count": 5}, cookie)[:2] == (200, owner)
        assert counted(connection, cookie) == (200, owner, 5)
        # The connection ends at the owner now: a session started on it is the owner's, not the worker's that accepted it.
        status, worker, _, new_cookie = connection.post("/seed_session", {"initial_count": 0})
        assert (status, worker) == (200, owner), holder
        # Handed on again, to a third worker, for a session of that one.
        third, (_, third_cookie) = list(found.items())[2]
        assert connection.post("/increment_counter", {"count": 1}, third_cookie)[:2] == (200, third)
        assert counted(connection, new_cookie) == (200, owner, 0)
        assert counted(connection, third_cookie) == (200, third, 1)
    finally:
        close_all(found)


def test_every_standard_client_keeps_its_count_with_connections_kept_alive(counter):
    _, instance = counter
    for client in EPISODE_CLIENTS:
        results = asyncio.run(run_episodes(CLIENTS[client], instance.url, list(range(EPISODES)), False, EPISODES))
        errors = [result["error"] for result in results if "error" in result]
        assert sum(result["reward"] == 1.0 for result in results) == EPISODES, (client, errors[:3])


def test_two_sessions_of_different_owners_pipelined_on_one_connection_each_keep_their_count(counter):
    _, instance = counter
    found = on_every_worker(instance.port, start=10)
    try:
        (first, (_, first_cookie)), (second, (_, second_cookie)) = list(found.items())[1:3]
        connection = Connection(instance.port)
        try:
            pipelined = [
                request("/increment_counter", {"count": 1}, first_cookie),
                request("/increment_counter", {"count": 2}, second_cookie),
                request("/increment_counter", {"count": 3}, first_cookie),
                request("/get_counter_value", {}, second_cookie),
                request("/get_counter_value", {}, first_cookie),
            ]
            connection.write(b"".join(pipelined))
            replies = [connection.reply()[:3] for _ in pipelined]
        finally:
            connection.close()
        # The first went to its owner with the connection; the rest came from there, handed on or forwarded.
        assert replies[0][1] == first
        assert [status for status, _, _ in replies] == [200] * len(pipelined)
        assert [replies[3][2]["count"], replies[4][2]["count"]] == [12, 14]
    finally:
        close_all(found)


def test_a_body_streamed_slowly_across_the_hand_off_arrives_whole(counter):
    _, instance = counter
    found = on_every_worker(instance.port, start=100)
    try:
        (_, (connection, _)), (owner, (_, cookie)) = list(found.items())[:2]
        body = json.dumps({"count": 7}).encode()
        head = request("/increment_counter", {}, cookie, body)[: -len(body)]
        connection.write(head + body[:3])
        for piece in (body[3:6], body[6:]):
            time.sleep(0.3)
            connection.write(piece)
        assert connection.reply()[:2] == (200, owner)
        assert counted(connection, cookie) == (200, owner, 107)
    finally:
        close_all(found)


def worker_pids(launcher) -> set[int]:
    return children(launcher.processes[NAME].pid)


def open_fds(pids: set[int]) -> dict[int, int]:
    return {pid: len(os.listdir(f"/proc/{pid}/fd")) for pid in pids}


def settled_fds(pids: set[int]) -> dict[int, int]:
    """The workers' descriptor counts once unchanged for a second (a client's closed connection is closed by its worker soon after)."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    counts = open_fds(pids)
    while time.monotonic() < deadline:
        time.sleep(1)
        if (now := open_fds(pids)) == counts:
            return counts
        counts = now
    raise AssertionError(f"the workers' descriptor counts did not settle: {counts}")


def handed_off_everywhere(port: int, rounds: int) -> None:
    """``rounds`` times: a session on every worker, and each worker's connection handed to every other worker and back."""
    for _ in range(rounds):
        found = on_every_worker(port)
        try:
            for worker, (connection, own) in found.items():
                for other, (_, cookie) in found.items():
                    if other != worker:
                        assert connection.post("/get_counter_value", {}, cookie)[:2] == (200, other)
                        assert connection.post("/get_counter_value", {}, own)[:2] == (200, worker)
        finally:
            close_all(found)


def test_hand_offs_leak_no_file_descriptor_in_any_worker(counter):
    launcher, instance = counter
    pids = worker_pids(launcher)
    assert len(pids) == WORKERS
    handed_off_everywhere(instance.port, 1)  # every worker's connection to each sibling's hand-off socket is made
    sent = metric(instance.url, "nemo_gym_hand_offs_sent_total")
    before = settled_fds(pids)
    handed_off_everywhere(instance.port, 5)
    assert metric(instance.url, "nemo_gym_hand_offs_sent_total") >= sent + 5 * WORKERS * (WORKERS - 1) * 2
    assert settled_fds(pids) == before


def test_metrics_count_hand_offs_sent_and_received_per_worker_and_forwards_by_reason(counter):
    _, instance = counter
    found = on_every_worker(instance.port)
    try:
        connection, _ = next(iter(found.values()))
        owner, (_, cookie) = list(found.items())[1]
        sent, received = metric(instance.url, "nemo_gym_hand_offs_sent_total"), metric(instance.url, "nemo_gym_hand_offs_received_total", worker=owner)
        pipelined = metric(instance.url, "nemo_gym_forwards_not_handed_off_total", reason="pipelined")
        assert connection.post("/get_counter_value", {}, cookie)[:2] == (200, owner)
        assert metric(instance.url, "nemo_gym_hand_offs_sent_total") == sent + 1
        assert metric(instance.url, "nemo_gym_hand_offs_received_total", worker=owner) == received + 1
        # The second of two requests in one write follows a reply under way: forwarded, counted so.
        others = [cookie for worker, (_, cookie) in found.items() if worker != owner]
        connection.write(request("/get_counter_value", {}, others[0]) + request("/get_counter_value", {}, others[1]))
        assert [connection.reply()[0] for _ in range(2)] == [200, 200]
        assert metric(instance.url, "nemo_gym_forwards_not_handed_off_total", reason="pipelined") == pipelined + 1
    finally:
        close_all(found)


def pid_of(launcher, worker: str) -> int:
    """The process of the worker with this ID (the one holding its life name)."""
    inode = life_sockets(launcher.socket_dirs[NAME])[worker]
    [pid] = [pid for pid in worker_pids(launcher) if f"socket:[{inode}]" in {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}]
    return pid


def test_a_stopped_owners_full_hand_off_queue_is_forwarded_to_instead_and_nothing_else_waits(counter):
    """The owner frozen (SIGSTOP): hand-offs queue on its socket until it is full, then requests are forwarded
    (queued on its private socket); the other workers answer their own sessions meanwhile; every request is
    answered once the owner runs again."""
    launcher, instance = counter
    found = on_every_worker(instance.port, start=1000)
    try:
        (stopped, (_, stopped_cookie)), (other, (connection, other_cookie)) = list(found.items())[:2]
        full = connection.metric("nemo_gym_forwards_not_handed_off_total", reason="full")
        pid = pid_of(launcher, stopped)

        async def frozen() -> list[int]:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0), cookie_jar=aiohttp.DummyCookieJar()) as http:

                async def one() -> int:
                    headers = {"Cookie": f"{session_cookie_name(NAME)}={stopped_cookie}"}
                    async with http.post(instance.url + "/increment_counter", json={"count": 1}, headers=headers) as reply:
                        await reply.read()
                        return reply.status

                os.kill(pid, signal.SIGSTOP)
                try:
                    requests = [asyncio.create_task(one()) for _ in range(FROZEN_REQUESTS)]
                    deadline = time.monotonic() + TIMEOUT_SECONDS
                    while await asyncio.to_thread(connection.metric, "nemo_gym_forwards_not_handed_off_total", reason="full") == full:
                        assert time.monotonic() < deadline, "no hand-off found the stopped owner's queue full"
                        await asyncio.sleep(0.1)
                    # Nothing waits on the frozen owner but its own sessions' requests.
                    assert await asyncio.to_thread(counted, connection, other_cookie) == (200, other, 1000)
                finally:
                    os.kill(pid, signal.SIGCONT)
                async with asyncio.timeout(TIMEOUT_SECONDS * 2):
                    return await asyncio.gather(*requests)

        assert asyncio.run(frozen()) == [200] * FROZEN_REQUESTS
        assert counted(connection, stopped_cookie) == (200, stopped, 1000 + FROZEN_REQUESTS)
    finally:
        close_all(found)


def test_a_hand_off_its_stopped_owner_does_not_take_is_taken_back_forwarded_and_applied_once(counter):
    """The owner frozen (SIGSTOP): it does not answer a hand-off, so the sender takes the connection back and
    forwards the request instead (which waits on the owner as any forward does, and gives it up on its lease where
    sessions are durable). Woken, the owner reads the hand-off it was sent, is told it was taken back, and does not
    serve it: the increment is applied once, by the forward."""
    launcher, instance = counter
    found = on_every_worker(instance.port, start=2000)
    try:
        (stopped, (_, stopped_cookie)), (sender, (connection, _)), (_, (watching, _)) = list(found.items())[:3]
        unanswered = watching.metric("nemo_gym_forwards_not_handed_off_total", reason="unanswered")
        pid = pid_of(launcher, stopped)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            os.kill(pid, signal.SIGSTOP)
            try:
                reply = pool.submit(connection.post, "/increment_counter", {"count": 1}, stopped_cookie)
                deadline = time.monotonic() + TIMEOUT_SECONDS
                while watching.metric("nemo_gym_forwards_not_handed_off_total", reason="unanswered") == unanswered:
                    assert time.monotonic() < deadline, "the hand-off to the stopped owner was never taken back"
                    time.sleep(0.1)
            finally:
                os.kill(pid, signal.SIGCONT)
            status, worker, body, _ = reply.result(timeout=TIMEOUT_SECONDS)
        # The connection stayed with the worker that took it back: the reply is its forward's.
        assert (status, worker) == (200, sender), body
        assert counted(watching, stopped_cookie) == (200, stopped, 2001)
    finally:
        close_all(found)
