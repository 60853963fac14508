"""Session lifecycle end to end, one start-up for the module, every server at 4 workers: idle sessions end
(state, row and sandbox gone, the hook called once each) and their requests get 410 naming idleness, while
a session kept busy through every worker lives on; /close_session twice is 200 twice and one hook call;
bursts of seeds against max_sessions and max_sandbox_disk_mb get exactly the cap's worth of 200s; and every
standard client (openai's SDK, httpx, requests, aiohttp, urllib, a replacing client) closes a session twice,
scraping /metrics with httpx and requests around it; a SIGKILLed owner's idle sessions, which no request
reaches, are ended as idle by a surviving worker's sweep of the store, the hook once each."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path

import aiohttp
import httpx
import pytest
import requests

from nemo_gym import config as gym_config
from nemo_gym.config.paths import search_roots
from nemo_gym.durable.tombstones import ended_detail
from nemo_gym.openai_utils import new_response
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher
from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.secret import instance_key
from tests.e2e.session_routing.test_counter_routing import worker_pid_of_owner
from tests.e2e.test_swe_rebench_durable import fix_of
from tests.e2e.test_swe_rebench_one_worker import episodes, sandboxes_in
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, steps
from tests.session_cookies import session_of
from tests.unit_tests.metrics.scrape import value
from tests.programs import needs

# Every test here starts swe_rebench, whose commands run in a bubblewrap jail.
pytestmark = needs("bwrap")

ROOT = Path(__file__).resolve().parents[1] / "lifecycle_servers"
SECRET = "session-lifecycle-end-to-end-test-secret"
IDLE_SECONDS = 3
# Each swe_rebench sandbox counts for this much of the capped instance's total.
SANDBOX_MB, SANDBOXES = 16, 6


def server(implementation: str, **settings) -> dict:
    return {"resources_servers": {implementation: {"entrypoint": "app.py", "num_workers": 4, "session_secret": SECRET, **settings}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("lifecycle")
    config = {
        # Forwarded, not handed off: the busy session's requests must be seen to reach several workers, and a
        # reply names the worker that took its connection only when that worker forwards it.
        "counter": server(
            "hooked_counter", hook_log=str(base / "counter.hooks"), session_idle_timeout_seconds=IDLE_SECONDS, place_sessions=True, hand_off=False
        ),
        "capped": server("hooked_counter", hook_log=str(base / "capped.hooks"), max_sessions=100, session_idle_timeout_seconds=0),
        "in_memory": server("hooked_counter", hook_log=str(base / "in_memory.hooks"), durable_sessions=False),
        "swe": server("swe_rebench", sandbox_dir=str(base / "swe"), session_idle_timeout_seconds=IDLE_SECONDS, place_sessions=True),
        "swe_capped": server(
            "swe_rebench", sandbox_dir=str(base / "swe_capped"), max_disk_mb=SANDBOX_MB, max_sandbox_disk_mb=SANDBOX_MB * SANDBOXES + SANDBOX_MB // 2
        ),
    }
    instances = gym_config.parse(config)
    discovery.check_settings(instances, search_roots([ROOT]))
    launcher = Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": str(base / "state")}).start(240)
    try:
        yield launcher, base
    finally:
        launcher.stop()


def hook_calls(path: Path) -> Counter:
    """(session id, reason) -> how many times the hook was called with them."""
    return Counter(tuple(line.split()) for line in path.read_text().splitlines()) if path.exists() else Counter()


def session_id_of(jar: dict[str, str], instance: str) -> str:
    return session_of(instance_key(SECRET, instance), jar[f"{instance}_session"])["session_id"]


def stored_state(base: Path, instance: str, session_id: str) -> str | None:
    with sqlite3.connect(base / "state" / "sessions" / f"{instance}.sqlite3") as db:
        row = db.execute("SELECT state FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


def fresh_connections() -> aiohttp.ClientSession:
    """A connection per request (the kernel spreads them over the workers, so most are forwarded), no cookie jar."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=200), cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=120)
    )


async def post(http: aiohttp.ClientSession, url: str, jar: dict[str, str] | None = None, body: dict | None = None) -> tuple[int, dict, dict]:
    async with http.post(url, json=body if body is not None else {}, cookies=jar or {}) as reply:
        return reply.status, await reply.json(), dict(reply.headers)


def verify_body(expected: int) -> dict:
    return {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json"), "expected_count": expected}


def cookies_of(reply_cookies) -> dict[str, str]:
    return {key: morsel.value for key, morsel in reply_cookies.items()}


async def seed(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict, dict, dict[str, str]]:
    async with http.post(f"{url}/seed_session", json=body) as reply:
        return reply.status, await reply.json(), dict(reply.headers), cookies_of(reply.cookies)


def test_idle_sessions_end_once_with_state_row_and_sandbox_and_a_busy_one_lives_on_then_closes_once(stack):
    launcher, base = stack
    counter, swe = launcher.instances["counter"].url, launcher.instances["swe"].url
    rows = episodes(5)

    async def run() -> None:
        async with fresh_connections() as http:
            counters = [(await seed(http, counter, {"initial_count": number}))[3] for number in range(6)]
            sandboxes = [(await seed(http, swe, row))[3] for row in rows]
            assert len(sandboxes_in(base / "swe")) == 5
            busy_counter, idle_counters = counters[0], counters[1:]
            busy_swe, idle_swe = sandboxes[0], sandboxes[1:]
            # The busy sessions get requests every half timeout, each on a new connection. Four at once per
            # round, and more rounds at once until two workers took some: a quiet kernel hands a lone
            # connection to the same worker again and again (all six did, once, on CI's loaded machine).
            served_by, increments = set(), 0

            async def increment() -> str:
                async with http.post(f"{counter}/increment_counter", json={"count": 1}, cookies=busy_counter) as reply:
                    assert reply.status == 200, await reply.text()
                    return reply.headers["X-NeMo-Gym-Worker"]

            deadline = time.monotonic() + IDLE_SECONDS * 3
            while time.monotonic() < deadline:
                for _ in range(10):
                    served_by.update(await asyncio.gather(*(increment() for _ in range(4))))
                    increments += 4
                    if len(served_by) > 1:
                        break
                status, body, _ = await post(http, f"{swe}/run_command", busy_swe, {"command": "true"})
                assert status == 200, body
                await asyncio.sleep(IDLE_SECONDS / 2)
            assert len(served_by) > 1  # the connections reached several workers (the label names the one that took each)
            hooks = base / "counter.hooks"
            idle_ids = [session_id_of(jar, "counter") for jar in idle_counters]
            give_up = time.monotonic() + 60
            while time.monotonic() < give_up and (len(hook_calls(hooks)) < 5 or len(sandboxes_in(base / "swe")) > 1):
                await asyncio.sleep(0.2)
            assert hook_calls(hooks) == Counter({(session_id, "idle"): 1 for session_id in idle_ids})
            assert len(sandboxes_in(base / "swe")) == 1
            for jar, session_id in zip(idle_counters, idle_ids):
                status, body, _ = await post(http, f"{counter}/get_counter_value", jar)
                assert status == 410 and "idle for" in body["detail"], body
                assert "idle for" in ended_detail(stored_state(base, "counter", session_id))
            for jar in idle_swe:
                status, body, _ = await post(http, f"{swe}/read_file", jar, {"path": "README.md"})
                assert status == 410 and "idle for" in body["detail"], body
            status, body, _ = await post(http, f"{counter}/get_counter_value", busy_counter)
            assert (status, body["count"]) == (200, increments)
            # Closed twice, each close on a connection of its own (forwarded to the owner): 200 both times, one hook call.
            busy_id = session_id_of(busy_counter, "counter")
            closes = [await post(http, f"{counter}/close_session", busy_counter) for _ in range(2)]
            assert [(status, body["status"]) for status, body, _ in closes] == [(200, "closed"), (200, "already closed")]
            assert hook_calls(hooks)[(busy_id, "close")] == 1 and len(hook_calls(hooks)) == 6
            assert ended_detail(stored_state(base, "counter", busy_id)) is not None
            swe_closes = [await post(http, f"{swe}/close_session", busy_swe) for _ in range(2)]
            assert [(status, body["status"]) for status, body, _ in swe_closes] == [(200, "closed"), (200, "already closed")]
            assert sandboxes_in(base / "swe") == []
            status, body, _ = await post(http, f"{counter}/close_session")
            assert status == 400 and "names no session" in body["detail"]

    asyncio.run(run())


def test_a_burst_of_500_seeds_against_max_sessions_100_gets_exactly_100_and_they_all_verify(stack):
    launcher, base = stack
    url = launcher.instances["capped"].url

    async def run() -> None:
        async with fresh_connections() as http:
            seeds = await asyncio.gather(*(seed(http, url, {"initial_count": number}) for number in range(500)))
            admitted = [(number, jar) for number, (status, _, _, jar) in enumerate(seeds) if status == 200]
            refused = [(status, body, headers) for status, body, headers, _ in seeds if status != 200]
            assert len(admitted) == 100
            assert all(status == 503 and headers.get("Retry-After") and "max_sessions (100)" in body["detail"] for status, body, headers in refused)
            increments = await asyncio.gather(*(post(http, f"{url}/increment_counter", jar, {"count": 7}) for _, jar in admitted))
            assert all(status == 200 for status, _, _ in increments)
            verdicts = await asyncio.gather(*(post(http, f"{url}/verify", jar, verify_body(number + 7)) for number, jar in admitted))
            assert [(status, body["reward"]) for status, body, _ in verdicts] == [(200, 1.0)] * 100
            assert hook_calls(base / "capped.hooks") == Counter({(session_id_of(jar, "capped"), "verify"): 1 for _, jar in admitted})
            assert (await seed(http, url, {"initial_count": 0}))[0] == 200  # the verified ones made room

    asyncio.run(run())


def test_a_burst_of_seeds_against_the_sandbox_disk_cap_gets_exactly_the_sandboxes_it_allows_and_they_all_verify(stack):
    launcher, base = stack
    url = launcher.instances["swe_capped"].url
    rows = episodes(30)

    async def run() -> None:
        async with fresh_connections() as http:
            seeds = await asyncio.gather(*(seed(http, url, row) for row in rows))
            admitted = [(row, jar) for row, (status, _, _, jar) in zip(rows, seeds) if status == 200]
            refused = [(status, body, headers) for status, body, headers, _ in seeds if status != 200]
            assert len(admitted) == SANDBOXES, [body for _, body, _, _ in seeds if "detail" in body][:3]
            detail = f"max_sandbox_disk_mb ({SANDBOX_MB * SANDBOXES + SANDBOX_MB // 2} MB, {SANDBOX_MB} MB per sandbox)"
            assert all(status == 503 and headers.get("Retry-After") and detail in body["detail"] for status, body, headers in refused)
            assert len(sandboxes_in(base / "swe_capped")) == SANDBOXES
            for row, jar in admitted:
                status, body, _ = await post(http, f"{url}/write_file", jar, fix_of(row))
                assert status == 200, body
            verdicts = await asyncio.gather(
                *(post(http, f"{url}/verify", jar, {**row, "response": new_response().model_dump(mode="json")}) for row, jar in admitted)
            )
            assert [(status, body["reward"]) for status, body, _ in verdicts] == [(200, 1.0)] * SANDBOXES
            assert sandboxes_in(base / "swe_capped") == []

    asyncio.run(run())


@pytest.mark.parametrize("library", sorted(CLIENTS))
def test_every_standard_client_closes_a_session_twice_200_then_gets_410_and_the_metrics_count_one_close(stack, library):
    launcher, base = stack
    url = launcher.instances["capped"].url
    before = value(httpx.get(f"{url}/metrics", timeout=30).text, "nemo_gym_sessions_ended_total", reason="close")

    async def run() -> list:
        async with CLIENTS[library](url, True) as per_session, per_session() as post:
            calls = [*steps(0)[:2], ("/get_counter_value", {}), ("/close_session", {}), ("/close_session", {}), ("/get_counter_value", {})]
            return [await post(path, body) for path, body in calls]

    seeded, incremented, counted, closed, closed_again, read = asyncio.run(run())
    assert (seeded.status, incremented.status, counted.status, counted.body["count"]) == (200, 200, 200, 1)
    assert [(reply.status, reply.body["status"]) for reply in (closed, closed_again)] == [(200, "closed"), (200, "already closed")]
    assert read.status == 410 and "ended by /close_session" in read.body["detail"], read
    after = value(requests.get(f"{url}/metrics", timeout=30).text, "nemo_gym_sessions_ended_total", reason="close")
    assert after - before == 1


def test_the_idle_sessions_of_a_sigkilled_owner_are_ended_as_idle_by_a_survivor_once_each(stack):
    launcher, base = stack
    url = launcher.instances["counter"].url
    hooks = base / "counter.hooks"

    async def seeded() -> list[dict[str, str]]:
        async with fresh_connections() as http:
            return [(await seed(http, url, {"initial_count": number}))[3] for number in range(12)]

    jars = asyncio.run(seeded())
    owner_of = {session_id_of(jar, "counter"): session_of(instance_key(SECRET, "counter"), jar["counter_session"])[OWNER_KEY] for jar in jars}
    victim = Counter(owner_of.values()).most_common(1)[0][0]
    orphans = sorted(session_id for session_id, owner in owner_of.items() if owner == victim)
    os.kill(worker_pid_of_owner(launcher.processes["counter"].pid, victim), signal.SIGKILL)
    # No request reaches them: only a survivor's sweep of the store can end them (once per timeout).
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up and not all(hook_calls(hooks)[(session_id, "idle")] for session_id in owner_of):
        time.sleep(0.2)
    assert {session_id: hook_calls(hooks)[(session_id, "idle")] for session_id in owner_of} == dict.fromkeys(owner_of, 1)
    assert all("idle for" in ended_detail(stored_state(base, "counter", session_id)) for session_id in orphans)

    async def read() -> list[tuple[int, dict, dict]]:
        async with fresh_connections() as http:
            return [await post(http, f"{url}/get_counter_value", jar) for jar in jars if session_id_of(jar, "counter") in orphans]

    assert all(status == 410 and "idle for" in body["detail"] for status, body, _ in asyncio.run(read()))


def test_a_stopped_server_ends_each_session_held_only_in_its_workers_memory_through_the_hook_once(tmp_path):
    hooks = tmp_path / "memory.hooks"
    instances = gym_config.parse({"memory": server("hooked_counter", hook_log=str(hooks), durable_sessions=False, num_workers=2)})
    discovery.check_settings(instances, search_roots([ROOT]))
    launcher = Launcher(instances, gym_config.free_port(), {"NEMO_GYM_STATE_DIR": str(tmp_path / "state")}).start(240)
    try:

        async def seeded() -> list[dict[str, str]]:
            async with fresh_connections() as http:
                return [(await seed(http, launcher.instances["memory"].url, {"initial_count": number}))[3] for number in range(8)]

        session_ids = [session_id_of(jar, "memory") for jar in asyncio.run(seeded())]
        assert hook_calls(hooks) == Counter()
    finally:
        launcher.stop()
    assert hook_calls(hooks) == Counter({(session_id, "stop"): 1 for session_id in session_ids})


FROZEN_SECONDS = IDLE_SECONDS + 2


def test_a_session_whose_request_waited_on_its_sigstopped_owner_past_the_idle_timeout_is_served_not_ended(stack):
    launcher, base = stack
    url = launcher.instances["counter"].url

    async def run() -> tuple[str, int, tuple[int, dict, dict]]:
        async with fresh_connections() as http:
            jar = (await seed(http, url, {"initial_count": 0}))[3]
            owner = session_of(instance_key(SECRET, "counter"), jar["counter_session"])[OWNER_KEY]
            pid = worker_pid_of_owner(launcher.processes["counter"].pid, owner)
            os.kill(pid, signal.SIGSTOP)
            try:
                waiting = asyncio.ensure_future(post(http, f"{url}/increment_counter", jar, {"count": 1}))
                await asyncio.sleep(FROZEN_SECONDS)
            finally:
                os.kill(pid, signal.SIGCONT)
            incremented = await waiting
            return session_id_of(jar, "counter"), incremented, await post(http, f"{url}/get_counter_value", jar)

    session_id, (status, body, _), read = asyncio.run(run())
    assert status == 200, body
    assert (read[0], read[1]["count"]) == (200, 1)
    assert not any(called == session_id for called, _ in hook_calls(base / "counter.hooks"))


def wait_dead(pid: int) -> None:
    """Until the process is gone or a zombie (its sockets closed), at most 10 s."""
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    raise TimeoutError(f"worker {pid} still runs 10 s after SIGKILL")


def kill_owner(launcher, instance: str, jar: dict[str, str]) -> None:
    """SIGKILL, by its PID, the worker that owns the session of ``jar``, and wait for it to be gone."""
    owner = session_of(instance_key(SECRET, instance), jar[f"{instance}_session"])[OWNER_KEY]
    pid = worker_pid_of_owner(launcher.processes[instance].pid, owner)
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)


ROLLOUT = (("/seed_session", {"initial_count": 5}), ("/verify", verify_body(5)))
NEXT_ROLLOUT = (("/seed_session", {"initial_count": 7}), ("/get_counter_value", {}))


@pytest.mark.parametrize("instance", ["counter", "in_memory"])
def test_a_seed_with_the_cookie_of_an_ended_session_whose_owner_died_starts_a_new_session(stack, instance):
    """A client that keeps one cookie jar across rollouts (aiohttp's for the durable counter, requests' for the one in
    memory): its next seed, after the ended session's owner was SIGKILLed, is 200 with a new session, which serves."""
    launcher, _ = stack
    url = launcher.instances[instance].url
    if instance == "counter":

        async def run() -> tuple[list[tuple[int, dict]], dict[str, str], list[tuple[int, dict]], dict[str, str]]:
            jar = aiohttp.CookieJar(unsafe=True)  # unsafe: it keeps the cookies of an IP address (127.0.0.1)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=jar, timeout=aiohttp.ClientTimeout(total=60)) as http:

                async def calls(steps) -> list[tuple[int, dict]]:
                    replies = []
                    for path, body in steps:
                        async with http.post(url + path, json=body) as reply:
                            replies.append((reply.status, await reply.json()))
                    return replies

                rollout = await calls(ROLLOUT)
                ended = {cookie.key: cookie.value for cookie in jar}
                kill_owner(launcher, instance, ended)
                return rollout, ended, await calls(NEXT_ROLLOUT), {cookie.key: cookie.value for cookie in jar}

        rollout, ended, replies, now = asyncio.run(run())
    else:
        with requests.Session() as http:
            # A connection per request: one kept alive may be the killed owner's own, reset under the next request.
            http.headers["Connection"] = "close"
            rollout = [(reply.status_code, reply.json()) for reply in (http.post(url + path, json=body, timeout=60) for path, body in ROLLOUT)]
            ended = http.cookies.get_dict()
            kill_owner(launcher, instance, ended)
            replies = [(reply.status_code, reply.json()) for reply in (http.post(url + path, json=body, timeout=60) for path, body in NEXT_ROLLOUT)]
            now = http.cookies.get_dict()
    assert [status for status, _ in rollout] == [200, 200], rollout
    assert replies[0][0] == 200, replies[0]
    assert replies[1] == (200, {"count": 7})
    assert session_id_of(now, instance) != session_id_of(ended, instance)
