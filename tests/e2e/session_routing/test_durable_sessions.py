"""Durable sessions end to end: the counter's sessions outlive a SIGKILLed worker, a restart, and a move."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.durable.applied import unwrap
from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from nemo_gym.sessions.secret import instance_key
from tests.e2e.session_routing.test_counter_routing import seed_all, worker_pid_of_owner
from tests.session_cookies import cookie_owner, session_of

COUNTER = "example_session_state_mgmt"
COOKIE = f"{COUNTER}_session"
SECRET = "durable-sessions-end-to-end-test-secret"
KEY = instance_key(SECRET, COUNTER)  # what signs the counter's cookies
EPISODES = 200
COMMAND_TIMEOUT_SECONDS = 120


def counter_config(num_workers: int, **settings) -> dict:
    server = {"entrypoint": "app.py", "num_workers": num_workers, "session_secret": SECRET, **settings}
    return {COUNTER: {"resources_servers": {COUNTER: server}}}


def launch(config: dict, state_dir: Path) -> Launcher:
    instances = gym_config.parse(config)
    return Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": str(state_dir)}).start(90)


def gym_sessions(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``gym sessions ARGS --instance`` the counter, with ``state_dir`` as its state directory."""
    command = [sys.executable, "-m", "nemo_gym.cli.main", "sessions", *args, "--instance", COUNTER]
    return subprocess.run(command, env={**os.environ, "NEMO_GYM_STATE_DIR": str(state_dir)}, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS)


@contextlib.contextmanager
def restored(old_dir: Path, fresh_dir: Path, path: Path) -> Iterator[Launcher]:
    """A fresh counter (state in ``fresh_dir``) into which the sessions of ``old_dir`` were exported and restored
    (through the file ``path``), until the block ends."""
    gym_sessions(old_dir, "export", "--output", str(path)).check_returncode()
    launcher = launch(counter_config(4), fresh_dir)
    try:
        gym_sessions(fresh_dir, "restore", "--input", str(path)).check_returncode()
        yield launcher
    finally:
        launcher.stop()


def rows(state_dir: Path) -> dict[str, tuple[str, int, str]]:
    """The store's rows as the workers left them: session id -> (owner, revision, state), the state without
    the requests its row remembers (``nemo_gym.durable.applied``)."""
    with sqlite3.connect(state_dir / "sessions" / f"{COUNTER}.sqlite3") as db:
        return {row[0]: (row[1], row[2], unwrap(row[3])[0]) for row in db.execute("SELECT session_id, owner, revision, state FROM sessions")}


def session_id_of(jar: dict[str, str]) -> str:
    return session_of(KEY, jar[COOKIE])["session_id"]


async def each_session(launcher: Launcher, jars: list[dict[str, str]], path: str, body) -> list[tuple[int, dict]]:
    """One request per session, all at once after a little think time; each jar takes the reply's cookie."""
    client = ReadingClient(launcher.instances)

    async def one(number: int, jar: dict[str, str]) -> tuple[int, dict]:
        await asyncio.sleep(0.02)
        reply = await client.post(COUNTER, path, json=body(number), cookies=jar)
        jar.update(reply.cookies)
        return reply.status, reply.body

    try:
        return await asyncio.gather(*(one(number, jar) for number, jar in enumerate(jars)))
    finally:
        await client.close()


def add(launcher: Launcher, jars: list[dict[str, str]], count: int) -> list[tuple[int, dict]]:
    return asyncio.run(each_session(launcher, jars, "/increment_counter", lambda number: {"count": count}))


def verify(launcher: Launcher, jars: list[dict[str, str]]) -> list[tuple[int, dict]]:
    def body(number: int) -> dict:
        return {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json"), "expected_count": number + 3}

    return asyncio.run(each_session(launcher, jars, "/verify", body))


def seed(launcher: Launcher) -> list[dict[str, str]]:
    return asyncio.run(seed_all(launcher.instances[COUNTER].url))


def kill(launcher: Launcher, owner: str) -> None:
    pid = worker_pid_of_owner(launcher.processes[COUNTER].pid, owner)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def dead(pid: int) -> bool:
    """Gone, or a zombie not yet reaped (uvicorn's supervisor may be busy restarting another worker):
    either way its sockets are closed, and with them its life name."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def all_score(verdicts: list[tuple[int, dict]]) -> bool:
    return [status for status, _ in verdicts] == [200] * len(verdicts) and all(body["reward"] == 1.0 for _, body in verdicts)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("durable_state")


@pytest.fixture(scope="module")
def counter(state_dir: Path):
    launcher = launch(counter_config(4), state_dir)
    yield launcher
    launcher.stop()


def test_sessions_of_a_sigkilled_worker_are_adopted_and_all_200_episodes_score(counter, state_dir):
    jars = seed(counter)
    assert [status for status, _ in add(counter, jars, 1)] == [200] * EPISODES
    victim, held = Counter(cookie_owner(jar, COUNTER, SECRET) for jar in jars).most_common(1)[0]
    kill(counter, victim)

    assert [status for status, _ in add(counter, jars, 2)] == [200] * EPISODES
    assert victim not in {cookie_owner(jar, COUNTER, SECRET) for jar in jars}, "every reply's Set-Cookie names a live owner"
    verdicts = verify(counter, jars)
    assert held > 1 and all_score(verdicts), [body for status, body in verdicts if status != 200][:3]


def test_rows_of_verified_sessions_hold_their_tombstones_and_no_state(counter, state_dir):
    jars = seed(counter)
    ids = {session_id_of(jar) for jar in jars}
    assert ids <= set(rows(state_dir))
    add(counter, jars, 3)
    assert all_score(verify(counter, jars))
    stored = rows(state_dir)
    assert all("ended with its /verify" in ended_detail(stored[session_id][2]) for session_id in ids)


def test_requests_that_change_nothing_write_nothing(counter, state_dir):
    jars = seed(counter)[:20]
    add(counter, jars, 1)
    before = {session_id_of(jar): rows(state_dir)[session_id_of(jar)] for jar in jars}
    for _ in range(3):
        statuses = asyncio.run(each_session(counter, jars, "/get_counter_value", lambda number: {}))
        assert [status for status, _ in statuses] == [200] * len(jars)
    assert {session_id: rows(state_dir)[session_id] for session_id in before} == before
    add(counter, jars, 1)
    assert all(rows(state_dir)[session_id][1] == revision + 1 for session_id, (_, revision, _) in before.items())


RACERS = 40


async def race(url: str, jar: dict[str, str]) -> list[tuple[int, str]]:
    """RACERS increments of one session at once, each on a connection of its own."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def one() -> tuple[int, str]:
            headers = {"Cookie": f"{COOKIE}={jar[COOKIE]}"}
            async with http.post(f"{url}/increment_counter", json={"count": 1}, headers=headers) as reply:
                return reply.status, reply.cookies[COOKIE].value

        return await asyncio.gather(*(one() for _ in range(RACERS)))


def test_of_eight_workers_receiving_an_orphaned_session_at_once_exactly_one_adopts(tmp_path):
    launcher = launch(counter_config(8), tmp_path)
    try:
        jar = seed(launcher)[0]
        kill(launcher, cookie_owner(jar, COUNTER, SECRET))
        replies = asyncio.run(race(launcher.instances[COUNTER].url, jar))
        assert [status for status, _ in replies] == [200] * RACERS
        adopters = {cookie_owner({COOKIE: cookie}, COUNTER, SECRET) for _, cookie in replies}
        assert len(adopters) == 1
        owner, revision, state = rows(tmp_path)[session_id_of(jar)]
        # Seeded at 0 (revision 1), taken over once (2), then a write per group of increments committed
        # together: one consistent count.
        assert (owner, state) == (adopters.pop(), str(RACERS)) and 2 < revision <= 2 + RACERS
    finally:
        launcher.stop()


def test_a_restarted_server_continues_every_session_with_old_cookies_and_tokens(tmp_path):
    config = counter_config(4, expose_tools_over_mcp=True)
    launcher = launch(config, tmp_path)
    try:
        jars = seed(launcher)
        add(launcher, jars, 1)
        client = ReadingClient(launcher.instances)
        token_seed = asyncio.run(client.post(COUNTER, "/seed_session", json={"initial_count": 500}))
        asyncio.run(client.close())
    finally:
        launcher.stop()
    launcher = launch(config, tmp_path)
    try:
        add(launcher, jars, 2)
        assert all_score(verify(launcher, jars))
        client = ReadingClient(launcher.instances)
        assert asyncio.run(continue_over_mcp(client, token_seed.body["mcp"]["headers"])) == 500 + 3
    finally:
        launcher.stop()


async def continue_over_mcp(client: ReadingClient, headers: dict[str, str]) -> int:
    """Add 3 over /mcp with the token alone, and read the count."""
    try:
        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(client.url(COUNTER, "/mcp"), http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.call_tool("increment_counter", {"count": 3})
            result = await session.call_tool("get_counter_value", {})
        return json.loads(result.content[0].text)["count"]
    finally:
        await client.close()


def test_sessions_exported_and_restored_into_a_fresh_server_all_200_continue(tmp_path):
    old_dir, fresh_dir, path = tmp_path / "old", tmp_path / "fresh", tmp_path / "sessions.json"
    launcher = launch(counter_config(4), old_dir)
    try:
        jars = seed(launcher)
        add(launcher, jars, 1)
    finally:
        launcher.stop()
    with restored(old_dir, fresh_dir, path) as launcher:
        add(launcher, jars, 2)
        assert all_score(verify(launcher, jars))
