"""Durable sessions in a PostgreSQL store (a real server, tests/postgres.py), the counter at 4 workers on one host.

One PostgreSQL (with a password, given in the location) and one counter for the module. A SIGKILLed
worker's sessions are adopted, and all 200 episodes score; a worker SIGSTOPped past its owner lease has
its sessions adopted by the others (the forwards waiting on it given up), and when it wakes, the
requests it had taken get 503 with the cookie naming the adopter, which then serves them; PostgreSQL
stopped for 5 s refuses every increment with 503 and Retry-After, and then all goes on. Every count
read is the sum of the increments acknowledged, per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import http.cookies
import json
import os
import signal
import socket
import time
import urllib.request
import uuid
from urllib.parse import quote
from collections import Counter
from collections.abc import Iterator

import aiohttp
import psycopg
import pytest

from nemo_gym import config as gym_config
from nemo_gym.process.launcher import LaunchError, Launcher
from tests.e2e.session_routing.test_counter_routing import worker_pid_of_owner
from tests.e2e.session_routing.test_durable_sessions import COUNTER, EPISODES, KEY, SECRET, add, all_score, counter_config, kill, seed, verify
from tests.hostile_passwords import libpq_raw, pieces_shown
from tests.postgres import Postgres, postgres_or_skip
from tests.session_cookies import cookie_owner, session_of

# Every character a URL gives a meaning to, written raw where libpq takes it raw: no output may show it,
# whole or in pieces.
PASSWORD = "Kq7w?Zr8x#Wm9y@Xt6z/Yv5u%Ub4t:Jn3s"
SESSIONS = 40
# Sessions of the worker that is frozen.
HELD = 8
DOWN_SECONDS = 5
# PostgreSQL hung (SIGSTOP) past the owner lease (10 s): reads from memory end with the lease.
FROZEN_SECONDS = 20
# Bounds, never expectations: a request waits at most two store deadlines (5 s: one commit ahead of its own).
REQUEST_BOUND_SECONDS = 15
HEALTH_BOUND_SECONDS = 5
# Bounds, never expectations.
REQUEST_TIMEOUT_SECONDS = 120
MAX_ROUNDS = 200


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_or_skip(password=PASSWORD) as server:
        yield server


def location(postgres: Postgres) -> str:
    return postgres.dsn().replace(quote(PASSWORD, safe=""), libpq_raw(PASSWORD))


@pytest.fixture(scope="module")
def counter(postgres: Postgres, tmp_path_factory) -> Iterator[Launcher]:
    # The default owner lease (10 s): on a loaded machine a shorter one lapsed now and then, whose requests got 503.
    config = counter_config(4, session_store=location(postgres))
    env = {"NEMO_GYM_STATE_DIR": str(tmp_path_factory.mktemp("pg_state"))}
    launcher = Launcher(gym_config.parse(config), gym_config.free_port(), env).start(120)
    yield launcher
    launcher.stop()


class Session:
    """One counter session of a test: its cookies, and the increments the server acknowledged."""

    def __init__(self, jar: dict[str, str], count: int) -> None:
        self.jar = jar
        self.count = count
        # The owner the latest reply's Set-Cookie named (None: it set none).
        self.named: str | None = None

    async def post(self, http: aiohttp.ClientSession, url: str, path: str, body: dict) -> tuple[int, dict, dict]:
        async with http.post(f"{url}{path}", json=body, cookies=self.jar) as reply:
            cookies = {key: morsel.value for key, morsel in reply.cookies.items()}
            self.jar.update(cookies)
            self.named = cookie_owner(cookies, COUNTER, SECRET)
            return reply.status, dict(reply.headers), await reply.json(content_type=None)

    async def increment(self, http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
        status, headers, body = await self.post(http, url, "/increment_counter", {"count": 1})
        if status == 200:
            self.count += 1
        return status, headers

    async def read(self, http: aiohttp.ClientSession, url: str) -> int | None:
        """The count the server reads (None for a refusal), checked against the acknowledged increments."""
        status, _, body = await self.post(http, url, "/get_counter_value", {})
        if status != 200:
            return None
        assert body["count"] == self.count, (body, self.count)
        return body["count"]


def fresh_connections() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    )


async def seeded(url: str, count: int, http: aiohttp.ClientSession | None = None) -> list[Session]:
    """``count`` new sessions, seeded over ``http`` (default: a new connection each)."""
    async with contextlib.AsyncExitStack() as stack:
        http = http or await stack.enter_async_context(fresh_connections())

        async def one(number: int) -> Session:
            session = Session({}, number)
            status, _, body = await session.post(http, url, "/seed_session", {"initial_count": number})
            assert status == 200, body
            return session

        return await asyncio.gather(*(one(number) for number in range(count)))


def test_the_served_config_names_the_store_without_its_password(counter, postgres):
    with urllib.request.urlopen(f"{counter.head_url}/global_config", timeout=30) as reply:
        served = reply.read().decode()
    store = json.loads(served)[COUNTER]["resources_servers"][COUNTER]["session_store"]
    assert not pieces_shown(PASSWORD, served) and store == postgres.dsn(password="")


def test_200_sessions_score_and_a_sigkilled_workers_are_adopted_with_no_acknowledged_increment_lost(counter):
    jars = seed(counter)
    assert [status for status, _ in add(counter, jars, 1)] == [200] * EPISODES
    victim, held = Counter(cookie_owner(jar, COUNTER, SECRET) for jar in jars).most_common(1)[0]
    kill(counter, victim)

    added = add(counter, jars, 2)
    assert [status for status, _ in added] == [200] * EPISODES, [body for status, body in added if status != 200][:3]
    assert victim not in {cookie_owner(jar, COUNTER, SECRET) for jar in jars}, "every reply's Set-Cookie names a live owner"
    verdicts = verify(counter, jars)
    assert held > 1 and all_score(verdicts), [body for status, body in verdicts if status != 200][:3]


def test_while_postgresql_is_down_increments_get_503_with_retry_after_and_then_all_goes_on(counter, postgres):
    url = counter.instances[COUNTER].url

    async def scenario() -> tuple[list[tuple[int, dict]], list[int], str]:
        sessions = await seeded(url, SESSIONS)
        async with fresh_connections() as http:
            postgres.stop()
            refused: list[tuple[int, dict]] = []
            deadline = time.monotonic() + DOWN_SECONDS
            try:
                while time.monotonic() < deadline:
                    refused += await asyncio.gather(*(session.increment(http, url) for session in sessions))
                start_error = failed_start(postgres)
            finally:
                postgres.start()
            for _ in range(MAX_ROUNDS):
                statuses = [status for status, _ in await asyncio.gather(*(session.increment(http, url) for session in sessions))]
                if statuses == [200] * SESSIONS:
                    break
            counts = await asyncio.gather(*(session.read(http, url) for session in sessions))
        return refused, counts, start_error

    refused, counts, start_error = asyncio.run(scenario())
    assert refused and {status for status, _ in refused} == {503} and all(headers.get("Retry-After") for _, headers in refused)
    assert None not in counts  # each read equals that session's acknowledged increments (Session.read)
    assert "cannot start" in start_error and not pieces_shown(PASSWORD, start_error), start_error


def test_while_postgresql_is_frozen_requests_get_503_within_the_store_deadline_get_slash_never_waits_and_no_count_is_wrong(counter, postgres):
    """A hung store (its processes SIGSTOPped: connections open, nothing answered) past the owner lease."""
    url = counter.instances[COUNTER].url
    bounded = aiohttp.ClientTimeout(total=REQUEST_BOUND_SECONDS)

    async def healthy(http: aiohttp.ClientSession, stop: asyncio.Event) -> int:
        answered = 0
        while not stop.is_set():
            async with http.get(f"{url}/", timeout=aiohttp.ClientTimeout(total=HEALTH_BOUND_SECONDS)) as reply:
                assert reply.status == 200
                answered += 1
            await asyncio.sleep(0.5)
        return answered

    async def scenario() -> tuple[list[tuple[int, dict]], int, list[tuple[int, int, int]]]:
        sessions = await seeded(url, SESSIONS)
        unknown = [0] * SESSIONS
        replies: list[tuple[int, dict]] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar(), timeout=bounded) as http:
            stop = asyncio.Event()
            postgres.freeze()
            try:
                health = asyncio.ensure_future(healthy(http, stop))
                deadline = time.monotonic() + FROZEN_SECONDS
                while time.monotonic() < deadline:
                    round_ = await asyncio.gather(*(session.increment(http, url) for session in sessions))
                    for number, (status, headers) in enumerate(round_):
                        unknown[number] += status != 200
                    replies += round_
                    replies += [(status, headers) for status, headers, _ in await asyncio.gather(*(session.post(http, url, "/get_counter_value", {}) for session in sessions))]
                stop.set()
                answered = await health
            finally:
                postgres.thaw()
            for _ in range(MAX_ROUNDS):
                if [status for status, _ in await asyncio.gather(*(session.increment(http, url) for session in sessions))] == [200] * SESSIONS:
                    break
            counts = [(await session.post(http, url, "/get_counter_value", {}))[2].get("count") for session in sessions]
        return replies, answered, [(session.count, count, unknown[number]) for number, (session, count) in enumerate(zip(sessions, counts))]

    replies, answered, counts = asyncio.run(scenario())
    refused = [headers for status, headers in replies if status != 200]
    assert refused and {status for status, _ in replies} <= {200, 503} and all(headers.get("Retry-After") for headers in refused)
    assert answered > 1
    # Acknowledged <= count <= acknowledged + replies that said it may have taken effect.
    assert all(acknowledged <= count <= acknowledged + unknown for acknowledged, count, unknown in counts), counts


def test_a_503_while_postgresql_is_down_says_the_store_is_unavailable_and_nothing_about_it(counter, postgres):
    url = counter.instances[COUNTER].url

    async def scenario() -> list[dict]:
        session = (await seeded(url, 1))[0]
        async with fresh_connections() as http:
            postgres.stop()
            try:
                return [(await session.post(http, url, "/increment_counter", {"count": 1}))[2] for _ in range(3)]
            finally:
                postgres.start()

    details = [body["detail"] for body in asyncio.run(scenario())]
    assert all("session store is unavailable" in detail for detail in details), details
    about_the_store = ["gym@", str(postgres.port), "postgresql", "connection"]
    assert not [(part, detail) for detail in details for part in about_the_store if part in detail]
    assert not [pieces_shown(PASSWORD, detail) for detail in details if pieces_shown(PASSWORD, detail)]


def test_no_log_of_the_server_or_its_workers_shows_the_stores_password(counter):
    logs = "".join(path.read_text(errors="replace") for path in counter.run_dir.glob("*.log"))
    assert "session store" in logs and not pieces_shown(PASSWORD, logs)


def failed_start(postgres: Postgres) -> str:
    """What a counter with this store says when it cannot start (PostgreSQL down)."""
    try:
        with Launcher(gym_config.parse(counter_config(2, session_store=location(postgres))), gym_config.free_port()).start(60):
            pass
    except LaunchError as error:
        return str(error)
    return "it started"


def worker_pid(launcher: Launcher, owner: str) -> int:
    return worker_pid_of_owner(launcher.processes[COUNTER].pid, owner)


def test_a_worker_frozen_past_its_lease_loses_its_sessions_to_the_adopters_and_its_stale_requests_get_503_naming_them(counter):
    url = counter.instances[COUNTER].url

    async def scenario():
        # One kept-alive connection: the worker that accepted it serves it, and owns the sessions seeded on it.
        stale_client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1), cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
        )
        held = await seeded(url, HELD, stale_client)
        frozen = held[0].named
        assert {session.named for session in held} == {frozen}
        sessions = held + await seeded(url, SESSIONS)
        pid = worker_pid(counter, frozen)
        os.kill(pid, signal.SIGSTOP)
        try:
            # Taken by the frozen worker's kernel, on its own connection: it reads it only when it wakes.
            stale = asyncio.ensure_future(held[0].increment(stale_client, url))
            async with fresh_connections() as http:
                # The others forward to it, give up once its lease has expired, adopt and serve.
                # held[0] too, by a read: its stale increment waits in the frozen worker meanwhile.
                adopted, _ = await asyncio.gather(
                    asyncio.gather(*(session.increment(http, url) for session in held[1:])), held[0].read(http, url)
                )
                # Woken well before uvicorn's supervisor would kill it for missing its health pings (30 s).
                os.kill(pid, signal.SIGCONT)
                stale_reply = await stale
                adopter = held[0].named
                again = await held[0].increment(stale_client, url)
                counts = await asyncio.gather(*(session.read(http, url) for session in sessions))
        finally:
            os.kill(pid, signal.SIGCONT)
            await stale_client.close()
        return frozen, held, adopted, stale_reply, adopter, again, counts, [cookie_owner(session.jar, COUNTER, SECRET) for session in held]

    frozen, held, adopted, (stale_status, stale_headers), adopter, (again_status, _), counts, owners_after = asyncio.run(scenario())
    assert len(held) > 2 and [status for status, _ in adopted] == [200] * (len(held) - 1)
    assert frozen not in owners_after[1:], "the adopters' replies name themselves"
    assert (stale_status, stale_headers.get("Retry-After")) == (503, "1") and adopter not in (None, frozen), (stale_status, adopter)
    assert again_status == 200 and None not in counts  # each read equals that session's acknowledged increments


class Forwarding:
    """One raw keep-alive connection, accepted by a worker that is not ``owner``, whose requests are forwarded to the
    owner: each is written behind a ``GET /`` in one write, and a request behind another in one read is never handed
    off with its connection (``protocols.handing_off``). Replies are read in order from one buffer."""

    def __init__(self, url: str, owner: str) -> None:
        host, port = url.split("//")[1].rsplit(":", 1)
        for _ in range(MAX_ROUNDS):
            self.sock = socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_SECONDS)
            self.file = self.sock.makefile("rb")
            self.sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            if self.reply().getheader("X-NeMo-Gym-Worker") != owner:
                return
            self.end()
        raise AssertionError(f"every connection reached {owner}")

    def makefile(self, *args, **kwargs) -> "Forwarding":
        return self  # http.client reads each reply from the one buffer, and its close() closes nothing

    def read(self, *args):
        return self.file.read(*args)

    def readline(self, *args):
        return self.file.readline(*args)

    def reply(self) -> http.client.HTTPResponse:
        response = http.client.HTTPResponse(self)
        response.begin()
        response.body = response.read()
        return response

    def post(self, path: str, body: dict, jar: dict[str, str], headers: dict[str, str]) -> http.client.HTTPResponse:
        """``body`` posted to ``path``, forwarded to the owner; its reply."""
        data = json.dumps(body).encode()
        head = [f"POST {path} HTTP/1.1", "Host: t", "Content-Type: application/json", f"Content-Length: {len(data)}"]
        head += [f"Cookie: {'; '.join(f'{name}={value}' for name, value in jar.items())}"] + [f"{name}: {value}" for name, value in headers.items()]
        self.sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" + "\r\n".join(head).encode() + b"\r\n\r\n" + data)
        self.reply()
        return self.reply()

    def close(self) -> None:
        pass

    def end(self) -> None:
        self.file.close()
        self.sock.close()


def test_a_forward_replayed_to_the_adopter_after_its_frozen_owner_committed_it_is_applied_once(counter, postgres):
    """The owner commits a forwarded increment and freezes before it replies (the test holds the row's lock,
    so the commit waits in PostgreSQL: the owner is SIGSTOPped there, then the lock is let go). The forward
    is given up once the owner's lease expired and replayed to the adopter: the row holds its id, so the
    adopter answers with the owner's reply and does not add it again."""
    url = counter.instances[COUNTER].url
    key = f"frozen-after-commit-{uuid.uuid4()}"

    async def scenario() -> tuple[int, str | None, int, int]:
        session = (await seeded(url, 1))[0]
        owner, session_id = session.named, session_of(KEY, session.jar[f"{COUNTER}_session"])["session_id"]
        forwarding = await asyncio.to_thread(Forwarding, url, owner)
        pid = worker_pid(counter, owner)
        lock = await psycopg.AsyncConnection.connect(postgres.dsn())
        try:
            await lock.execute("SELECT 1 FROM nemo_gym_sessions WHERE instance = %s AND session_id = %s FOR UPDATE", (COUNTER, session_id))
            increment = asyncio.ensure_future(asyncio.to_thread(forwarding.post, "/increment_counter", {"count": 1}, session.jar, {"Idempotency-Key": key}))
            watch = await psycopg.AsyncConnection.connect(postgres.dsn(), autocommit=True)
            for _ in range(MAX_ROUNDS * 10):
                cursor = await watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = 'nemo_gym'")
                if (await cursor.fetchone())[0]:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the owner's commit never waited on the row")
            os.kill(pid, signal.SIGSTOP)
            await lock.commit()
            for _ in range(MAX_ROUNDS * 10):
                cursor = await watch.execute("SELECT state FROM nemo_gym_sessions WHERE instance = %s AND session_id = %s", (COUNTER, session_id))
                if key in (await cursor.fetchone())[0]:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the frozen owner's commit did not go through")
            await watch.close()
            reply = await increment
            status, replayed = reply.status, reply.getheader("Idempotent-Replayed")
            for header in reply.headers.get_all("Set-Cookie") or ():
                session.jar.update({name: morsel.value for name, morsel in http.cookies.SimpleCookie(header).items()})
        finally:
            os.kill(pid, signal.SIGCONT)
            await lock.close()
            forwarding.end()
        async with fresh_connections() as reader:
            _, _, body = await session.post(reader, url, "/get_counter_value", {})
        return status, replayed, session.count, body["count"]

    status, replayed, start, count = asyncio.run(scenario())
    assert (status, replayed) == (200, "true") and count == start + 1, (status, replayed, start, count)
