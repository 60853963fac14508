"""``GET /metrics`` of the durable counter at 4 workers, one SIGKILLed mid-run: the server's counts are the client's.

The client counts from each reply: the worker that received it (``X-NeMo-Gym-Worker``), the owner its
cookie named before and the owner its Set-Cookie names after. A reply whose owner is not the receiving
worker was forwarded; the first reply of a dead worker's session from its new owner, the receiving
worker, took it over from the store; a 410 is a 410. The scrape must say the same, exactly, after the
dead worker's restart, though the dead worker's forwards are among them.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from nemo_gym.sessions.worker import WORKER_HEADER
from tests.e2e.session_routing.test_durable_sessions import COOKIE, COUNTER, KEY, counter_config, kill, launch
from tests.session_cookies import session_of
from tests.unit_tests.metrics.scrape import samples, value

SESSIONS = 120
CONCURRENCY = 20
# A bound, never an expectation: scrapes until two workers have answered.
MAX_SCRAPES = 200


@dataclass
class Seen:
    """What the client saw, reply by reply."""

    forwarded: int = 0
    adopted: int = 0
    gone: int = 0
    statuses: Counter = field(default_factory=Counter)
    # Per worker: the requests it received and forwarded.
    forwarded_by: Counter = field(default_factory=Counter)


def owner(cookie: str | None) -> str | None:
    return None if cookie is None else session_of(KEY, cookie).get("nemo_gym_worker")


class Client:
    def __init__(self, url: str, seen: Seen) -> None:
        self.url = url
        self.seen = seen
        self.dead: set[str] = set()

    async def post(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, path: str, body: dict, jar: dict[str, str]) -> tuple[int, dict]:
        headers = {"Cookie": f"{COOKIE}={jar[COOKIE]}"} if COOKIE in jar else {}
        async with limit, http.post(self.url + path, json=body, headers=headers) as reply:
            status, payload, receiving = reply.status, await reply.json(), reply.headers[WORKER_HEADER]
            cookie = reply.cookies[COOKIE].value if COOKIE in reply.cookies else None
        before, after = owner(jar.get(COOKIE)), owner(cookie) or owner(jar.get(COOKIE))
        self.seen.statuses[status] += 1
        if status == 410:
            self.seen.gone += 1
        elif after != receiving:
            self.seen.forwarded += 1
            self.seen.forwarded_by[receiving] += 1
        elif before in self.dead:
            self.seen.adopted += 1
        if cookie is not None:
            jar[COOKIE] = cookie
        return status, payload

    async def each(self, jars: list[dict[str, str]], path: str, body) -> list[int]:
        limit = asyncio.Semaphore(CONCURRENCY)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=aiohttp.DummyCookieJar()) as http:
            replies = await asyncio.gather(*(self.post(http, limit, path, body(index), jar) for index, jar in jars))
        return [status for status, _ in replies]


def scrape(url: str) -> tuple[str, str]:
    """One scrape on a connection of its own: the text, and the worker that answered."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        assert reply.headers.get("Set-Cookie") is None
        return reply.read().decode(), reply.headers[WORKER_HEADER]


def verify_body(expected: int) -> dict:
    return {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json"), "expected_count": expected}


def counted(text: str) -> dict:
    """The scrape's samples that are not 0."""
    return {key: count for key, count in samples(text).items() if count}


def live_by_worker(text: str) -> dict[str, float]:
    return {dict(labels)["worker"]: count for (name, labels), count in samples(text).items() if name == "nemo_gym_live_sessions" and count}


@pytest.fixture(scope="module")
def counter(tmp_path_factory) -> Launcher:
    # Forwarded, not handed off: the counts of forwards a worker made are among those that must survive its death,
    # and a reply then names the worker that forwarded it, as the client's tally reads it.
    launcher = launch(counter_config(4, place_sessions=True, hand_off=False), tmp_path_factory.mktemp("metrics_state"))
    yield launcher
    launcher.stop()


def test_metrics_during_a_run_with_a_sigkilled_worker_match_what_the_client_saw(counter):
    url = counter.instances[COUNTER].url
    start, _ = scrape(url)  # the launcher's own GET / as it waited for the server are counted already
    seen = Seen()
    client = Client(url, seen)
    jars = [(index, {}) for index in range(SESSIONS)]
    assert asyncio.run(client.each(jars, "/seed_session", lambda index: {"initial_count": index})) == [200] * SESSIONS
    assert asyncio.run(client.each(jars, "/increment_counter", lambda index: {"count": 1})) == [200] * SESSIONS
    verified, kept = jars[::3], [pair for number, pair in enumerate(jars) if number % 3]
    assert asyncio.run(client.each(verified, "/verify", lambda index: verify_body(index + 1))) == [200] * len(verified)
    before_kill, _ = scrape(url)
    assert live_by_worker(before_kill) == Counter(owner(jar[COOKIE]) for _, jar in kept)

    # Of the workers owning both kinds of session, the one that forwarded most (on a loaded machine one worker may
    # have accepted few connections): its own forwards are among the counts that must survive it.
    both = {owner(jar[COOKIE]) for _, jar in kept} & {owner(jar[COOKIE]) for _, jar in verified}
    victim = max(sorted(both), key=lambda worker: seen.forwarded_by[worker])
    assert seen.forwarded_by[victim] > 0, "the victim's own forwards are among the counts that must survive it"
    kill(counter, victim)
    client.dead.add(victim)
    orphans = [pair for pair in verified if owner(pair[1][COOKIE]) == victim]
    assert asyncio.run(client.each(kept, "/increment_counter", lambda index: {"count": 1})) == [200] * len(kept)
    assert asyncio.run(client.each(orphans, "/increment_counter", lambda index: {"count": 1})) == [410] * len(orphans)
    middle, _ = scrape(url)
    assert live_by_worker(middle) == Counter(owner(jar[COOKIE]) for _, jar in kept) and victim not in live_by_worker(middle)
    assert asyncio.run(client.each(kept, "/verify", lambda index: verify_body(index + 2))) == [200] * len(kept)

    # Scrapes on connections of their own until two workers answered (which worker accepts is the kernel's choice).
    scrapes = [scrape(url)]
    while len({worker for _, worker in scrapes}) < 2 and len(scrapes) < MAX_SCRAPES:
        scrapes.append(scrape(url))
    text = scrapes[0][0]
    # A worker uvicorn starts in the killed one's place may come up between scrapes, with samples of its own at 0.
    assert all(counted(other) == counted(text) for other, _ in scrapes), "every worker answers with the instance's aggregate"
    assert len({worker for _, worker in scrapes}) > 1
    assert seen.adopted > 0 and seen.gone == len(orphans) > 0 and set(seen.statuses) == {200, 410}
    assert value(text, "nemo_gym_requests_forwarded_total", hop="worker") == seen.forwarded
    assert value(text, "nemo_gym_forward_duration_seconds_count", hop="worker") == seen.forwarded
    assert value(text, "nemo_gym_sessions_adopted_total") == seen.adopted
    assert value(text, "nemo_gym_responses_total", status="410") == seen.gone
    assert value(text, "nemo_gym_responses_total", status="200") - value(start, "nemo_gym_responses_total", status="200") == seen.statuses[200]
    assert value(text, "nemo_gym_responses_total", status="503") == 0
    served_here = value(text, "nemo_gym_requests_served_here_total") - value(start, "nemo_gym_requests_served_here_total")
    assert served_here == sum(seen.statuses.values()) - seen.forwarded - seen.gone
    assert value(text, "nemo_gym_sessions_started_total") == SESSIONS
    assert value(text, "nemo_gym_sessions_ended_total", reason="verify") == SESSIONS
    assert value(text, "nemo_gym_store_commit_duration_seconds_count") > 0
    assert live_by_worker(text) == {}
    assert value(before_kill, "nemo_gym_requests_forwarded_total", hop="worker") <= seen.forwarded
