"""swe_rebench's durable sessions end to end: 200 sessions at 8 workers outlive two SIGKILLed workers and a whole-server
restart (at 2 workers, so the owners the cookies name are gone and every session is taken over by a new worker)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path

import aiohttp

from nemo_gym.client.reading import ReadingClient
from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from resources_servers.swe_rebench.tmpfs import mounts_under
from responses_api_models.scripted_backend.app import swe_rebench_playbook
from tests.e2e.test_swe_rebench_one_worker import EPISODES, SWE, episodes, sandboxes_in
from tests.e2e.test_swe_rebench_sweep import assert_nothing_left, swe_alone
from tests.programs import needs

# Every test here starts swe_rebench, whose commands run in a bubblewrap jail.
pytestmark = needs("bwrap")

KILLED = 2


def fix_of(row: dict) -> dict:
    """The write_file arguments that fix the row's task (the scripted policy's fix)."""
    (write,) = [arguments for tool, arguments in swe_rebench_playbook(row["responses_create_params"]["input"][0]["content"]) if tool == "write_file"]
    return write


async def seed_all(url: str, rows: list[dict]) -> list[tuple[dict[str, str], int]]:
    """Seed each session on a connection of its own, as rollouts start: its cookies and the pid of the worker holding it."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def seed(number: int, row: dict) -> tuple[dict[str, str], int]:
            await asyncio.sleep(number * 0.005)
            async with http.post(f"{url}/seed_session", json=row) as reply:
                assert reply.status == 200, await reply.text()
                return {key: morsel.value for key, morsel in reply.cookies.items()}, (await reply.json())["worker_pid"]

        return await asyncio.gather(*(seed(number, row) for number, row in enumerate(rows)))


def each_session(launcher: Launcher, jars: list[dict[str, str]], path: str, bodies: list[dict]) -> list[tuple[int, dict]]:
    """One request per session, all at once after a little think time; each jar takes the reply's cookie."""

    async def run() -> list[tuple[int, dict]]:
        client = ReadingClient(launcher.instances)

        async def one(jar: dict[str, str], body: dict) -> tuple[int, dict]:
            await asyncio.sleep(0.02)
            reply = await client.post(SWE, path, json=body, cookies=jar)
            jar.update(reply.cookies)
            return reply.status, reply.body

        try:
            return await asyncio.gather(*(one(jar, body) for jar, body in zip(jars, bodies)))
        finally:
            await client.close()

    return asyncio.run(run())


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}/cmdline") and time.monotonic() < deadline:
        time.sleep(0.05)


def statuses(replies: list[tuple[int, dict]]) -> Counter:
    return Counter(status for status, _ in replies)


def test_200_sessions_outlive_two_sigkilled_workers_and_a_restart_all_score_and_leave_no_sandbox(start_servers, tmp_path: Path):
    sandbox_dir, state_dir = tmp_path / "sandboxes", tmp_path / "state"
    config, env = swe_alone(sandbox_dir, num_workers=8), {"NEMO_GYM_STATE_DIR": str(state_dir)}
    rows = episodes()
    launcher = start_servers(config, env)
    seeded = asyncio.run(seed_all(launcher.instances[SWE].url, rows))
    jars = [jar for jar, _ in seeded]
    fixes = [fix_of(row) for row in rows]
    assert statuses(each_session(launcher, jars, "/write_file", fixes)) == {200: EPISODES}

    victims = [pid for pid, _ in Counter(pid for _, pid in seeded).most_common(KILLED)]
    for pid in victims:
        kill(pid)
    orphaned = sum(pid in victims for _, pid in seeded)
    # Each session's next call reaches its sandbox, where the killed workers' sessions are adopted.
    read = each_session(launcher, jars, "/read_file", [{"path": fix["path"]} for fix in fixes])
    assert statuses(read) == {200: EPISODES}, [body for status, body in read if status != 200][:3]
    assert [body["content"] for _, body in read] == [fix["content"] for fix in fixes]

    launcher.stop()
    # The whole server stopped: every durable session's sandbox is still there, mounted, for the next start.
    assert len(sandboxes_in(sandbox_dir)) == EPISODES and len(mounts_under(sandbox_dir)) == EPISODES
    launcher = start_servers(swe_alone(sandbox_dir, num_workers=2), env)
    verify = [{**row, "response": new_response().model_dump(mode="json")} for row in rows]
    verdicts = each_session(launcher, jars, "/verify", verify)
    assert orphaned > KILLED and statuses(verdicts) == {200: EPISODES}, [body for status, body in verdicts if status != 200][:3]
    assert Counter(body["reward"] for _, body in verdicts) == {1.0: EPISODES}, Counter(body["reason"] for _, body in verdicts)
    assert sandboxes_in(sandbox_dir) == []
    launcher.stop()
    assert_nothing_left(sandbox_dir)
