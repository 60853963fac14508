"""swe_rebench's durable sessions end to end: 200 sessions at 8 workers outlive two SIGKILLed workers and a whole-server
restart (at 2 workers, so the owners the cookies name are gone and every session is taken over by a new worker)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from nemo_gym.client.reading import ReadingClient, cookie_header
from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from nemo_gym.routing.request_id import ID_HEADER_NAME
from resources_servers.swe_rebench.tmpfs import mounts_under
from responses_api_models.scripted_backend.app import swe_rebench_playbook
from tests.e2e.test_swe_rebench_one_worker import EPISODES, SWE, episodes, sandboxes_in
from tests.e2e.test_swe_rebench_sweep import assert_nothing_left, swe_alone, wait_for
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


@contextlib.contextmanager
def held(lock: Path) -> Iterator[None]:
    """The SQLite store's write lock, held by this process: the workers' commits wait on it."""
    descriptor = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def waits_on(lock: Path, pid: int) -> bool:
    """Whether process ``pid`` waits for the flock of ``lock`` (a blocked entry of /proc/locks, "->")."""
    inode = str(os.stat(lock).st_ino)
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[5] == str(pid) and fields[6].split(":")[-1] == inode:
            return True
    return False


def test_a_verify_whose_worker_is_sigkilled_before_its_commit_leaves_the_sandbox_and_its_retry_scores_one(start_servers, tmp_path: Path):
    """One fixed session at 2 workers; the store's write lock held by the test, so that its owner's verify, graded,
    waits to commit; the owner SIGKILLed there. The verify gets no reward (its outcome unknown); sent again under
    the same Idempotency-Key, it is adopted by the other worker, which re-attaches the sandbox (a verify never
    removes it: the session's end does, after the commit) and grades it: 1.0, and the sandbox goes with the end."""
    sandbox_dir, state_dir = tmp_path / "sandboxes", tmp_path / "state"
    launcher = start_servers(swe_alone(sandbox_dir, num_workers=2), {"NEMO_GYM_STATE_DIR": str(state_dir)})
    url = launcher.instances[SWE].url
    (row,) = episodes(1)
    ((jar, owner),) = asyncio.run(seed_all(url, [row]))
    assert statuses(each_session(launcher, [jar], "/write_file", [fix_of(row)])) == {200: 1}
    (lock,) = state_dir.rglob("*.sqlite3.lock")

    async def verify_twice() -> tuple[int | str, tuple[int, dict]]:
        body = {**row, "response": new_response().model_dump(mode="json")}
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=60)) as http:

            async def verify() -> tuple[int, dict]:
                headers = {ID_HEADER_NAME: "verify-once", "Cookie": cookie_header(jar)}
                async with http.post(f"{url}/verify", json=body, headers=headers) as reply:
                    jar.update({key: morsel.value for key, morsel in reply.cookies.items()})
                    return reply.status, await reply.json(content_type=None)

            with held(lock):
                first = asyncio.create_task(verify())
                assert await asyncio.to_thread(wait_for, lambda: waits_on(lock, owner) or first.done(), 60), "the verify's commit never waited"
                assert not first.done(), first.result()
                await asyncio.to_thread(kill, owner)
            try:
                killed = (await first)[0]
            except aiohttp.ClientError as error:
                killed = type(error).__name__
            deadline = time.monotonic() + 60
            while (retried := await verify())[0] == 503 and time.monotonic() < deadline:
                await asyncio.sleep(1)
            return killed, retried

    killed, (status, body) = asyncio.run(verify_twice())
    assert killed != 200 and status == 200 and body["reward"] == 1.0, (killed, status, body)
    assert sandboxes_in(sandbox_dir) == []
    launcher.stop()
    assert_nothing_left(sandbox_dir)
