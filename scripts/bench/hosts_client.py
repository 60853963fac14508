"""The client of the benchmark's replicas on several hosts (scripts/bench/hosts.py), run inside a host of its own.

``python -m scripts.bench.hosts_client INSTANCE`` reads one JSON command a line from stdin and answers each
with one JSON line on stdout, until stdin ends:

- ``{"episodes": URL, "count", "concurrency", "gym"}``: ``count`` counter episodes (scripts/bench/client.py)
  through ``URL`` by long-lived loops ("loops" of scripts/bench/driving.py), from the generic pooled
  client or, ``gym``, from Gym's own client (one for the whole process, as an agent's lives as long as
  the agent). Answers the run's figures (with this process's CPU per episode); for Gym's client also its non-first requests and how many
  of them a worker of their owner replica answered (``owner_host``), and the owner worker itself.
- ``{"hop": [replica URLs], "requests", "block", "runs"}``: sessions seeded at each replica, then
  ``POST /increment_counter`` one at a time, to the session's owner replica (local) or to the next
  replica (cross-host, forwarded over TCP), the two kinds alternating block by block. Answers each
  kind's p50 and p99 (medians over the runs) and whether every increment reached its session's state.

The session cookies are read with the benchmark's secret (scripts/bench/servers.py), which every replica signs with.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from http.cookies import SimpleCookie
from typing import Any

from nemo_gym import config as gym_config
from nemo_gym.routing.replica import REPLICA_KEY
from nemo_gym.sessions.worker import OWNER_KEY
from nemo_gym.sessions.cookie import session_cookie_name
from nemo_gym.sessions.secret import instance_key
from scripts.bench.client import EpisodeClient, GymEpisodeClient, counter_episode
from scripts.bench.driving import drive
from scripts.bench.figures import median, percentile
from scripts.bench.servers import COUNTER, SECRET, resource_server
from tests.session_cookies import session_of

LOCAL = "local"
CROSS_HOST = "cross-host"
HOP_SESSIONS_PER_REPLICA = 4


def owner(cookie: str | None, instance: str) -> tuple[str | None, str | None]:
    """The owner worker and owner replica a session cookie of ``instance`` names."""
    if not cookie:
        return None, None
    session = session_of(instance_key(SECRET, instance), cookie)
    return session.get(OWNER_KEY), session.get(REPLICA_KEY)


def direct_hits(answered: list[tuple[str | None, str | None, str | None]], replica_of_worker: dict[str, str]) -> dict[str, int]:
    """Of requests ``(owner worker, owner replica, worker that answered)``: how many, how many a worker of the
    owner replica answered (no cross-host hop) and how many the owner worker itself (no hop at all)."""
    return {
        "requests": len(answered),
        "owner_host": sum(replica_of_worker.get(worker) == replica for _, replica, worker in answered if replica is not None),
        "owner_worker": sum(worker == owner_worker for owner_worker, _, worker in answered if owner_worker is not None),
    }


class ReplicaGymClient(GymEpisodeClient):
    """Gym's own client, which also tells apart, per non-first request, the owner replica and the owner worker."""

    def __init__(self, instance: str, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        instances = gym_config.parse({instance: resource_server(COUNTER, host=host, port=int(port))}, check_ports=False)
        super().__init__(instances, instance)
        # Which replica each worker belongs to, from the seeds' cookies: a worker's reply names only the worker.
        self.replica_of_worker: dict[str, str] = {}
        self.hits: dict[str, int] = {}

    def take_counts(self) -> tuple[list[float], list[dict[str, str]], float | None]:
        for seeded in self.seeded:
            worker, replica = owner(seeded.get(self.cookie), self.name)
            if worker is not None and replica is not None:
                self.replica_of_worker[worker] = replica
        answered = []
        for sent, worker in self.answered:
            cookie = SimpleCookie(sent).get(self.cookie)
            if cookie is not None:
                answered.append((*owner(cookie.value, self.name), worker))
        self.hits = direct_hits(answered, self.replica_of_worker)
        return super().take_counts()


async def episodes(url: str, count: int, concurrency: int, gym: ReplicaGymClient | None) -> dict[str, Any]:
    run = await drive(counter_episode, url, count, concurrency, "loops", gym)
    figures = {
        "total": run.total, "good": run.good, "errors": run.errors, "seconds": run.seconds, "first_error": run.first_error,
        "per_second": run.per_second, "p50_ms": run.p50_ms, "p99_ms": run.p99_ms, "client_cpu_ms": run.client_cpu_ms,
    }
    return {**figures, **(gym.hits if gym is not None else {})}


async def hop(replicas: list[str], requests: int, block: int, runs: int, instance: str) -> dict[str, Any]:
    client = EpisodeClient()
    try:
        sessions: list[tuple[str, dict[str, str]]] = []
        for url in replicas:
            for _ in range(HOP_SESSIONS_PER_REPLICA):
                cookies: dict[str, str] = {}
                await client.post(f"{url}/seed_session", {"initial_count": 0}, cookies)
                _, replica = owner(cookies.get(session_cookie_name(instance)), instance)
                sessions.append((f"http://{replica}", cookies))
        others = {url: replicas[(replicas.index(url) + 1) % len(replicas)] for url in replicas}
        kinds = {LOCAL: lambda url: url, CROSS_HOST: lambda url: others[url]}
        increments = [0] * len(sessions)
        per_run: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for round_ in range(runs + 1):  # the first round warms every path and connection up, and is not counted
            latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
            for number in range(max(1, requests // block)):
                for kind in (list(kinds) if (round_ + number) % 2 == 0 else list(kinds)[::-1]):
                    for i in range(block):
                        index = (number * block + i) % len(sessions)
                        home, cookies = sessions[index]
                        started = time.perf_counter()
                        await client.post(f"{kinds[kind](home)}/increment_counter", {"count": 1}, cookies)
                        latencies[kind].append(time.perf_counter() - started)
                        increments[index] += 1
            if round_:
                for kind, values in latencies.items():
                    per_run[kind].append({"p50_ms": percentile(values, 50) * 1000, "p99_ms": percentile(values, 99) * 1000})
        counts = [(await client.post(f"{home}/get_counter_value", {}, cookies))["count"] for home, cookies in sessions]
    finally:
        await client.close()
    result: dict[str, Any] = {kind: {key: median([run[key] for run in values]) for key in ("p50_ms", "p99_ms")} for kind, values in per_run.items()}
    result["state_intact"] = counts == increments
    result["requests_per_run"] = max(1, requests // block) * block
    return result


async def serve(instance: str) -> None:
    gyms: dict[str, ReplicaGymClient] = {}
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            if "hop" in command:
                answer = await hop(command["hop"], command["requests"], command["block"], command["runs"], instance)
            else:
                url = command["episodes"]
                gym = gyms.setdefault(url, ReplicaGymClient(instance, url)) if command["gym"] else None
                answer = await episodes(url, command["count"], command["concurrency"], gym)
            print(json.dumps(answer), flush=True)
    finally:
        for gym in gyms.values():
            await gym.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
