"""The clients that play the benchmark's episodes, and the episodes: a generic pooled client and Gym's own."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from http.cookies import SimpleCookie
from typing import Any

import aiohttp

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient, cookie_header
from nemo_gym.openai_utils import new_response
from nemo_gym.client.owner_pool import OwnerPool
from nemo_gym.sessions.worker import WORKER_HEADER
from scripts.bench.servers import owner_of

REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)


class RequestFailed(Exception):
    pass


class EpisodeClient:
    """A generic pooled client: one aiohttp session, no cookie jar, each episode's cookies threaded by hand.

    It knows nothing of workers; it records every request's latency.
    """

    def __init__(self, connections: int = 0, connector: aiohttp.BaseConnector | None = None) -> None:
        self.http = aiohttp.ClientSession(
            connector=connector or aiohttp.TCPConnector(limit=connections),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=REQUEST_TIMEOUT,
        )
        self.latencies: list[float] = []
        # Each episode's cookies right after its seed: where its session lives.
        self.seeded: list[dict[str, str]] = []

    async def post(self, url: str, body: dict, cookies: dict[str, str]) -> dict:
        """POST ``body``; the reply's Set-Cookie updates ``cookies``. A non-200 reply raises."""
        headers = {"Cookie": cookie_header(cookies)} if cookies else None
        started = time.perf_counter()
        async with self.http.post(url, json=body, headers=headers) as reply:
            payload = await reply.read()
            cookies.update({name: morsel.value for name, morsel in reply.cookies.items()})
        self.latencies.append(time.perf_counter() - started)
        if reply.status != 200:
            raise RequestFailed(f"{url}: HTTP {reply.status}: {payload[:200]!r}")
        return json.loads(payload)

    async def close(self) -> None:
        await self.http.close()


class GymEpisodeClient(EpisodeClient):
    """Gym's own ``ReadingClient``, whose owner pool sends a session's requests on a connection to its owner.

    It lives as long as the benchmark (as an agent's client lives as long as the agent). For every request
    that carries a session cookie it notes the cookie and the worker that answered; whether that worker was
    the owner is worked out after the run, so the benchmark's own bookkeeping costs the measured client nothing.
    """

    def __init__(self, instances: dict[str, gym_config.Instance], name: str) -> None:
        self.name = name
        self.base = instances[name].url
        self.cookie = f"{name}_session"
        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(self.count_hit)
        self.gym = ReadingClient(instances)
        self.gym.owner_pool = OwnerPool(timeout=REQUEST_TIMEOUT, trace_configs=[trace])
        self.latencies: list[float] = []
        self.seeded: list[dict[str, str]] = []
        self.answered: list[tuple[str, str | None]] = []

    async def count_hit(self, session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestEndParams) -> None:
        self.answered.append((params.headers.get("Cookie", ""), params.response.headers.get(WORKER_HEADER)))

    async def post(self, url: str, body: dict, cookies: dict[str, str]) -> dict:
        started = time.perf_counter()
        reply = await self.gym.post(self.name, url.removeprefix(self.base), json=body, cookies=cookies)
        cookies.update(reply.cookies)
        self.latencies.append(time.perf_counter() - started)
        if reply.status != 200:
            raise RequestFailed(f"{url}: HTTP {reply.status}: {reply.text[:200]!r}")
        return reply.body

    def take_counts(self) -> tuple[list[float], list[dict[str, str]], float | None]:
        """What one run measured (its latencies, its seeds, its direct-hit share), and a fresh start for the next."""
        hits = []
        for sent, worker in self.answered:
            cookies = {name: morsel.value for name, morsel in SimpleCookie(sent).items()}
            if self.cookie in cookies:
                hits.append(worker == owner_of(cookies, self.name))
        share = sum(hits) / len(hits) if hits else None
        measured = (self.latencies, self.seeded, share)
        self.latencies, self.seeded, self.answered = [], [], []
        return measured

    async def close(self) -> None:
        await self.gym.close()


VERIFY_BODY = {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json")}

Episode = Callable[[EpisodeClient, str], Awaitable[Any]]


async def counter_episode(client: EpisodeClient, url: str) -> Any:
    cookies: dict[str, str] = {}
    await client.post(f"{url}/seed_session", {"initial_count": 0}, cookies)
    client.seeded.append(dict(cookies))
    await client.post(f"{url}/increment_counter", {"count": 1}, cookies)
    await client.post(f"{url}/increment_counter", {"count": 2}, cookies)
    reply = await client.post(f"{url}/verify", {**VERIFY_BODY, "expected_count": 3}, cookies)
    return reply.get("reward")


async def bench_episode(client: EpisodeClient, url: str) -> Any:
    """A new session (seed stores nothing), then its verify: the second request is routed to the owner."""
    cookies: dict[str, str] = {}
    await client.post(f"{url}/seed_session", {}, cookies)
    reply = await client.post(f"{url}/verify", VERIFY_BODY, cookies)
    return reply.get("reward")
