"""A bounded chaos soak: standard clients against the durable counter at 4 workers while workers are
SIGKILLed and SIGSTOPped and the state filesystem fills up.

Four client libraries (aiohttp's cookie jar, httpx's, requests', and a client that replaces its
cookies with each reply's) each run users that seed a session and then add 1 to it, again and again,
on fresh connections, for ``TRAFFIC_SECONDS``. A user honours ``Retry-After`` on a 503 and carries on.
Meanwhile the schedule in ``FAULTS`` SIGKILLs workers (uvicorn starts replacements), SIGSTOPs one for
a few seconds, and fills the state directory's filesystem (a tmpfs of the test's own) for a few
seconds, twice. Then every session's count is read and its episode verified.

The promises: every increment acknowledged with 200 is kept (the count read back is at least the
acknowledged ones, and at most those plus the ones whose outcome the user could not know: a 503 or a
broken connection); no reply is 404, 410 or 502; every 503 carries ``Retry-After``; and every
session's final read and verify answer 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import pytest
import requests

from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, Post
from tests.e2e.session_routing.test_durable_sessions import COUNTER, counter_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the soak mounts a tmpfs of its own to fill up (root only)")

LIBRARIES = ["aiohttp_jar", "httpx_jar", "requests_session", "replacing"]
USERS_PER_LIBRARY = 6
TRAFFIC_SECONDS = 56
STATE_FS_BYTES = 16 << 20
THINK_SECONDS = 0.05
# Seconds into the traffic: what is done to the server then. Eight seconds apart: a SIGKILLed worker's
# replacement is serving again within about three on a loaded machine, so each fault meets a full set.
FAULTS = [
    (6, "sigkill"),
    (14, "sigstop"),
    (22, "disk_full"),
    (30, "sigkill"),
    (38, "disk_full"),
    (46, "sigkill"),
]
STOP_SECONDS = 3
FULL_SECONDS = 5
UNKNOWN_OUTCOME = (aiohttp.ClientError, httpx.HTTPError, requests.RequestException, OSError, asyncio.TimeoutError)


@dataclass
class User:
    """One session of one client library: what it was told, and what it could not know."""

    library: str
    number: int
    acknowledged: int = 0
    unknown: int = 0
    statuses: Counter = field(default_factory=Counter)
    bad_replies: list = field(default_factory=list)
    final: tuple[int, dict] | None = None
    verdict: tuple[int, dict] | None = None


@pytest.fixture(scope="module")
def state_fs(tmp_path_factory) -> Path:
    mount_point = tmp_path_factory.mktemp("soak_state")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STATE_FS_BYTES},mode=0700", "soak_state", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture(scope="module")
def counter(start_module_servers, state_fs: Path) -> Launcher:
    return start_module_servers(counter_config(4), {"NEMO_GYM_STATE_DIR": str(state_fs)}, timeout=180)


def workers(launcher: Launcher) -> list[int]:
    supervisor = launcher.processes[COUNTER].pid
    return [int(pid) for pid in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()]


def fill(directory: Path) -> Path:
    """Write zeros into ``directory`` until its filesystem has no room left; the file is returned."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as out:
        with contextlib.suppress(OSError):
            while True:
                out.write(chunk)
    return filler


async def inject(launcher: Launcher, state_fs: Path, started: float, log: list[str]) -> None:
    chooser = random.Random(18)
    for at, fault in FAULTS:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        pid = chooser.choice(workers(launcher))
        if fault == "sigkill":
            os.kill(pid, signal.SIGKILL)
        elif fault == "sigstop":
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(STOP_SECONDS)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        else:
            filler = await asyncio.to_thread(fill, state_fs)
            await asyncio.sleep(FULL_SECONDS)
            filler.unlink()
        log.append(f"{time.monotonic() - started:.1f}s {fault} {pid if fault != 'disk_full' else ''}")


async def call(user: User, post: Post, path: str, body: dict) -> tuple[int, dict] | None:
    """One request; None when the connection broke (its outcome unknown). A 503 is waited out as it says."""
    try:
        reply = await post(path, body)
    except UNKNOWN_OUTCOME:
        return None
    user.statuses[reply.status] += 1
    if reply.status in (404, 410) or reply.status >= 500 and reply.status != 503:
        user.bad_replies.append((path, reply.status, str(reply.body)[:300]))
    if reply.status == 503 and reply.retry_after is None:
        user.bad_replies.append((path, "503 without Retry-After", str(reply.body)[:300]))
    return reply.status, reply.body


async def play(user: User, post: Post, deadline: float) -> None:
    while (seeded := await call(user, post, "/seed_session", {"initial_count": 0})) is None or seeded[0] != 200:
        await asyncio.sleep(0.5)
    while time.monotonic() < deadline:
        await asyncio.sleep(THINK_SECONDS)
        outcome = await call(user, post, "/increment_counter", {"count": 1})
        if outcome is not None and outcome[0] == 200:
            user.acknowledged += 1
            continue
        user.unknown += outcome is None or outcome[0] == 503
        if outcome is not None and outcome[0] == 503:
            await asyncio.sleep(1.0)
    user.final = await settled(user, post, "/get_counter_value", {})
    if user.final is not None and user.final[0] == 200:
        body = {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json"), "expected_count": user.final[1]["count"]}
        user.verdict = await settled(user, post, "/verify", body)


async def settled(user: User, post: Post, path: str, body: dict) -> tuple[int, dict] | None:
    """The request retried while its outcome is unknown or the server says to retry, for up to 60 s."""
    deadline = time.monotonic() + 60
    while (outcome := await call(user, post, path, body)) is None or outcome[0] == 503:
        if time.monotonic() > deadline:
            return outcome
        await asyncio.sleep(1.0)
    return outcome


def test_a_chaos_soak_keeps_every_acknowledged_increment_and_answers_no_404_410_or_502(counter, state_fs):
    url = counter.instances[COUNTER].url
    users = [User(library, number) for library in LIBRARIES for number in range(USERS_PER_LIBRARY)]
    faults: list[str] = []

    async def scenario() -> None:
        started = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            posts = []
            for user in users:
                episode_post = await stack.enter_async_context(CLIENTS[user.library](url, True))
                posts.append(await stack.enter_async_context(episode_post()))
            await asyncio.gather(
                inject(counter, state_fs, started, faults),
                *(play(user, post, started + TRAFFIC_SECONDS) for user, post in zip(users, posts)),
            )

    asyncio.run(asyncio.wait_for(scenario(), TRAFFIC_SECONDS + 240))
    report = {f"{user.library}#{user.number}": (user.acknowledged, user.unknown, user.final, dict(user.statuses)) for user in users}
    totals = sum((user.statuses for user in users), Counter())
    print(f"soak: acknowledged {sum(user.acknowledged for user in users)}, unknown {sum(user.unknown for user in users)}, replies {dict(totals)}, faults {faults}")
    assert len(faults) == len(FAULTS), faults
    bad = [reply for user in users for reply in user.bad_replies]
    assert bad == [], (faults, Counter((path, status) for path, status, _ in bad), bad[:5])
    for user in users:
        assert user.final is not None and user.final[0] == 200, report
        assert user.acknowledged <= user.final[1]["count"] <= user.acknowledged + user.unknown, report
        assert user.verdict is not None and user.verdict[0] == 200 and user.verdict[1]["reward"] == 1.0, report
    assert sum(user.acknowledged for user in users) > 0
