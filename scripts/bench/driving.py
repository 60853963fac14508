"""Driving episodes: one run at a given concurrency and client pattern, and alternating runs over targets."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from scripts.bench.client import Episode, EpisodeClient, GymEpisodeClient, RequestFailed
from scripts.bench.figures import log, percentile
from scripts.bench.proc import cpu_seconds
from scripts.bench.servers import session_owner

RUN_TIMEOUT_SECONDS = 900


@dataclass
class Run:
    total: int
    good: int
    errors: int
    seconds: float
    latencies: list[float] = field(repr=False)
    first_error: str | None = None
    owners: Counter = field(default_factory=Counter, repr=False)
    # Gym client only: the share of requests with a session that went straight to its owner.
    direct_share: float | None = None
    # CPU seconds the run cost the benchmark's own process (the client) and the server's processes.
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None

    @property
    def spread(self) -> float | None:
        """How far the busiest or idlest owner strays from the mean sessions per owner (0.1 = ±10%)."""
        if len(self.owners) < 2:
            return None
        mean = sum(self.owners.values()) / len(self.owners)
        return max(abs(count - mean) for count in self.owners.values()) / mean

    @property
    def per_second(self) -> float:
        return self.total / self.seconds

    @property
    def client_cpu_ms(self) -> float:
        return self.client_cpu_s / self.total * 1000

    @property
    def server_cpu_ms(self) -> float | None:
        return None if self.server_cpu_s is None else self.server_cpu_s / self.total * 1000

    @property
    def server_cpu_request_ms(self) -> float | None:
        """Per request answered: an episode that fails stops early, so per episode would flatter a failing server."""
        return None if self.server_cpu_s is None or not self.latencies else self.server_cpu_s / len(self.latencies) * 1000

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 50) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies, 99) * 1000


# The two ways callers drive episodes. "loops": as many long-lived loops as the concurrency, each playing
# one episode after another on a pool of as many connections, so a loop mostly reuses its own
# connection. "tasks": every episode a task, the concurrency a semaphore, one aiohttp session with its
# default pool (100 connections, idle ones handed out oldest first), so an episode's requests hop
# between connections, and so between workers: what rollout drivers usually do.
PATTERNS = ("loops", "tasks")


async def drive(
    episode: Episode,
    url: str,
    episodes: int,
    concurrency: int,
    pattern: str = "loops",
    gym: GymEpisodeClient | None = None,
    server_pids: list[int] | None = None,
) -> Run:
    """``episodes`` episodes, ``concurrency`` at a time, over one pooled client made for this run (or ``gym``'s);
    the CPU the server spends is summed over ``server_pids``."""
    if gym is not None:
        client: EpisodeClient = gym
    elif pattern == "loops":
        client = EpisodeClient(connections=concurrency)
    else:
        client = EpisodeClient(connector=aiohttp.TCPConnector())
    rewards: list[Any] = []
    errors: list[str] = []

    async def play_one() -> None:
        try:
            rewards.append(await episode(client, url))
        except (RequestFailed, aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
            errors.append(repr(error))

    pending = iter(range(episodes))

    async def loop() -> None:
        for _ in pending:
            await play_one()

    gate = asyncio.Semaphore(concurrency)

    async def task() -> None:
        async with gate:
            await play_one()

    try:
        server_before = sum(map(cpu_seconds, server_pids)) if server_pids else None
        client_before = time.process_time()
        started = time.perf_counter()
        async with asyncio.timeout(RUN_TIMEOUT_SECONDS):
            if pattern == "loops":
                await asyncio.gather(*(loop() for _ in range(min(concurrency, episodes))))
            else:
                await asyncio.gather(*(task() for _ in range(episodes)))
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - client_before
        server_cpu = None if server_before is None else sum(map(cpu_seconds, server_pids)) - server_before
    finally:
        if gym is None:
            await client.close()
    latencies, seeded, direct_share = gym.take_counts() if gym is not None else (client.latencies, client.seeded, None)
    good = sum(reward == 1.0 for reward in rewards)
    owners = Counter(owner for owner in map(session_owner, seeded) if owner is not None)
    return Run(episodes, good, len(errors), seconds, latencies, errors[0] if errors else None, owners, direct_share, client_cpu, server_cpu)


async def alternate(
    targets: dict[str, str],
    episode: Episode,
    args: argparse.Namespace,
    episodes: int,
    concurrency: int,
    pattern: str = "loops",
    gym_clients: dict[str, Callable[[], GymEpisodeClient]] | None = None,
    server_pids: dict[str, list[int]] | None = None,
) -> dict[str, list[Run]]:
    """A warm-up per target, then ``args.runs`` rounds; each round visits every target, in a rotated order.

    A target in ``gym_clients`` is driven by one Gym client made for the whole of it, warm-up included;
    one in ``server_pids`` has its server's CPU measured.
    """
    gyms = {name: make() for name, make in (gym_clients or {}).items()}
    try:
        return await alternate_runs(targets, episode, args, episodes, concurrency, pattern, gyms, server_pids or {})
    finally:
        for gym in gyms.values():
            await gym.close()


async def alternate_runs(
    targets: dict[str, str],
    episode: Episode,
    args: argparse.Namespace,
    episodes: int,
    concurrency: int,
    pattern: str,
    gyms: dict[str, GymEpisodeClient],
    server_pids: dict[str, list[int]],
) -> dict[str, list[Run]]:
    if args.warmup > 0:
        for name, url in targets.items():
            await drive(episode, url, min(args.warmup, episodes), concurrency, pattern, gyms.get(name))
    runs: dict[str, list[Run]] = {name: [] for name in targets}
    names = list(targets)
    for round_ in range(args.runs):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            run = await drive(episode, targets[name], episodes, concurrency, pattern, gyms.get(name), server_pids.get(name))
            runs[name].append(run)
            note = f", first error: {run.first_error}" if run.first_error else ""
            log(f"  {pattern} run {round_ + 1}/{args.runs} {name}: {run.good}/{run.total}, {run.per_second:.0f}/s{note}")
    return runs
