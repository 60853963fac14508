"""Session routing end to end: real processes, the counter at 4 workers, agent and model at 1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import run_episodes
from nemo_gym.config.presets import agent_name, environment_trio
from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from resources_servers.example_session_state_mgmt.episodes import plus_one_plus_two
from tests.session_cookies import cookie_owner

COUNTER = "example_session_state_mgmt"
EPISODES = 200


def trio(num_workers: int, route_sessions: bool = True, durable_sessions: bool = True) -> dict:
    config = environment_trio(COUNTER, num_workers)
    config[COUNTER]["resources_servers"][COUNTER].update(route_sessions=route_sessions, durable_sessions=durable_sessions)
    return config


async def run_all(instances) -> list[dict]:
    client = ReadingClient(instances)
    try:
        return await run_episodes(client, agent_name(COUNTER), plus_one_plus_two(EPISODES), EPISODES, progress=False)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def four_workers(start_module_servers) -> Launcher:
    """``trio(4)``, started once for the tests that only add sessions of their own to it (each new, with its own cookie)."""
    return start_module_servers(trio(4))


def test_run_episodes_all_score_at_four_workers(four_workers):
    results = asyncio.run(run_all(four_workers.instances))
    assert sum(result["reward"] == 1.0 for result in results) == EPISODES, [r.get("error") for r in results if "error" in r][:3]


def test_run_episodes_lose_rewards_with_routing_switched_off(start_servers):
    launcher = start_servers(trio(4, route_sessions=False))
    results = asyncio.run(run_all(launcher.instances))
    assert sum(result["reward"] == 1.0 for result in results) < EPISODES


async def seed_all(url: str) -> list[dict[str, str]]:
    """Seed every session on a connection of its own, arriving over a second, as rollouts start."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def seed(start: int) -> dict[str, str]:
            await asyncio.sleep(start * 0.005)
            async with http.post(f"{url}/seed_session", json={"initial_count": start}) as reply:
                assert reply.status == 200, await reply.text()
                return {key: morsel.value for key, morsel in reply.cookies.items()}

        return await asyncio.gather(*(seed(start) for start in range(EPISODES)))


async def verify_all(client: ReadingClient, cookies: list[dict[str, str]]) -> list:
    async def verify(start: int, jar: dict[str, str]):
        await asyncio.sleep(0.05)  # think time, so requests spread over connections and workers
        body = {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json"), "expected_count": start}
        reply = await client.post(COUNTER, "/verify", json=body, cookies=jar)
        return reply.status, reply.body

    return await asyncio.gather(*(verify(start, jar) for start, jar in enumerate(cookies)))


def owners(cookies: list[dict[str, str]]) -> list[str]:
    return [cookie_owner(jar, COUNTER) for jar in cookies]


def test_seed_then_verify_sessions_all_score_and_spread_over_workers(four_workers):
    launcher = four_workers

    async def scenario():
        client = ReadingClient(launcher.instances)
        try:
            cookies = await seed_all(launcher.instances[COUNTER].url)
            return cookies, await verify_all(client, cookies)
        finally:
            await client.close()

    cookies, verdicts = asyncio.run(scenario())
    assert [status for status, _ in verdicts] == [200] * EPISODES
    assert sum(body["reward"] == 1.0 for _, body in verdicts) == EPISODES
    assert len(set(owners(cookies))) > 1


def worker_pid_of_owner(supervisor_pid: int, owner: str) -> int:
    """The worker process serving ``owner``'s private socket, found through /proc (socket inode -> fd)."""
    names = {f"socket:[{line.split()[6]}]" for line in Path("/proc/net/unix").read_text().splitlines()[1:] if line.endswith(f"/{owner}.sock")}
    for pid in Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text().split():
        # A descriptor (or a whole worker) may close while it is read: it is not the one sought then.
        with contextlib.suppress(FileNotFoundError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if os.readlink(fd) in names:
                        return int(pid)
    raise LookupError(f"no worker serves {owner}")


def test_without_durable_state_killed_worker_sessions_get_410_and_the_others_still_score(start_servers):
    launcher = start_servers(trio(4, durable_sessions=False))

    cookies = asyncio.run(seed_all(launcher.instances[COUNTER].url))
    owner_of = owners(cookies)
    victim = owner_of[0]
    pid = worker_pid_of_owner(launcher.processes[COUNTER].pid, victim)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}/cmdline") and time.monotonic() < deadline:
        time.sleep(0.05)

    async def verify():
        client = ReadingClient(launcher.instances)
        try:
            return await verify_all(client, cookies)
        finally:
            await client.close()

    verdicts = asyncio.run(verify())
    assert len(set(owner_of)) > 1
    for owner, (status, body) in zip(owner_of, verdicts):
        if owner == victim:
            assert status == 410 and victim in body["detail"] and "gone" in body["detail"], body
        else:
            assert status == 200 and body["reward"] == 1.0, body
