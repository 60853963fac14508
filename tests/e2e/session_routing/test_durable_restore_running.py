"""``gym sessions restore`` into a running durable counter: the restored sessions are usable at once.

Ten sessions per client are seeded and added to, exported, ended (``/verify``), then restored into the
same running server: each client's old cookies (naming live workers that no longer hold those sessions
in memory) read the restored count, add to it and score. Two workers, fresh connections, so a request
reaches the owner directly or is forwarded to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.process.launcher import Launcher
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, Post
from tests.e2e.session_routing.test_durable_sessions import COUNTER, counter_config, rows
from tests.e2e.session_routing.test_durable_standard_clients import each, verify

SESSIONS = 10
STANDARD_CLIENTS = ["aiohttp_jar", "httpx_jar", "replacing", "requests_session"]


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("restore_running_state")


@pytest.fixture(scope="module")
def counter(start_module_servers, state_dir: Path) -> Launcher:
    return start_module_servers(counter_config(2), {"NEMO_GYM_STATE_DIR": str(state_dir)}, timeout=120)


def gym_sessions(state_dir: Path, *args: str) -> str:
    command = [sys.executable, "-m", "nemo_gym.cli.main", "sessions", *args, "--instance", COUNTER]
    done = subprocess.run(command, env={**os.environ, "NEMO_GYM_STATE_DIR": str(state_dir)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("client", STANDARD_CLIENTS)
def test_sessions_restored_into_a_running_server_continue_at_once_with_their_old_cookies(counter, state_dir, tmp_path, client):
    exported = tmp_path / "sessions.json"

    async def scenario() -> tuple[str, list, list, list, list]:
        async with CLIENTS[client](counter.instances[COUNTER].url, True) as episode_post, contextlib.AsyncExitStack() as stack:
            posts: list[Post] = [await stack.enter_async_context(episode_post()) for _ in range(SESSIONS)]
            await each(posts, lambda number: ("/seed_session", {"initial_count": number}))
            await each(posts, lambda number: ("/increment_counter", {"count": 1}))
            await asyncio.to_thread(gym_sessions, state_dir, "export", "--output", str(exported))
            ended = await each(posts, lambda number: ("/verify", {**verify(number)[1], "expected_count": number + 1}))
            restored = await asyncio.to_thread(gym_sessions, state_dir, "restore", "--input", str(exported))
            read = await each(posts, lambda number: ("/get_counter_value", {}))
            added = await each(posts, lambda number: ("/increment_counter", {"count": 2}))
            verified = await each(posts, verify)
            return restored, ended, read, added, verified

    restored, ended, read, added, verified = asyncio.run(scenario())
    assert [(reply.status, reply.body["reward"]) for reply in ended] == [(200, 1.0)] * SESSIONS
    assert f"restored {SESSIONS} sessions of {COUNTER}" in restored
    assert [(reply.status, reply.body) for reply in read] == [(200, {"count": number + 1}) for number in range(SESSIONS)]
    assert [reply.status for reply in added] == [200] * SESSIONS
    assert [(reply.status, reply.body["reward"]) for reply in verified] == [(200, 1.0)] * SESSIONS
    # Every session ended with its verify: each row is its tombstone (docs/lifecycle.md).
    assert all(ended_detail(state) is not None for _, _, state in rows(state_dir).values())
