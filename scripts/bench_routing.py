"""Routing benchmark: our multi-worker routing side by side with HAProxy, hop cost, memory, CPU scale.

    python scripts/bench_routing.py                      # everything, default sizes (several minutes)
    python scripts/bench_routing.py --episodes 200 --runs 3 --hop-requests 300 --sessions 5000 --cpu-episodes 200

It starts every server it measures as a real process on loopback, stops each by its PID, and prints
medians of ``--runs`` alternating runs per configuration:

1. counter episodes (seed 0, +1, +2, verify 3) from a generic pooled aiohttp client (one session, no
   cookie jar, each episode's cookies threaded by hand from Set-Cookie) against the counter server at
   1 worker, at 4 workers routed, at 4 workers with routing off, and HAProxy (round robin, inserted
   cookie) in front of 4 single-worker instances; driven twice (``--patterns``): by long-lived loops
   that mostly keep their own connection, and by one task per episode behind a semaphore on one
   session with aiohttp's default pool, whose requests hop between connections; with the sessions per
   worker (placement spread) as well as throughput and latency;
2. hop cost: one request at a time, to the worker that owns the session (local) or to the other one
   (forwarded), plus straight to the owner's private socket, which is the owner's share of a forward;
3. memory: each worker's RSS before and after ``--sessions`` new sessions on routes that store nothing;
4. CPU-bound scale: a verify that burns 5 ms of CPU, throughput at 2 workers over 1.

Then each target of issue 6, met or not met. Timings are only printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from base64 import b64decode
from collections import Counter
from http.cookies import SimpleCookie
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from itsdangerous import TimestampSigner

from nemo_gym import config as gym_config
from nemo_gym.client import ServerClient, cookie_header
from nemo_gym.config import REPO_ROOT
from nemo_gym.global_config import CONFIG_PATH_ENV, INSTANCE_ENV
from nemo_gym.launcher import Launcher
from nemo_gym.openai_utils import new_response
from nemo_gym.owner_pool import OwnerPool
from nemo_gym.routing.transport.unix import life_sockets, make_socket_dir, remove_socket_dir, socket_address
from nemo_gym.routing.worker import OWNER_KEY, SOCKET_DIR_ENV, WORKER_HEADER

COUNTER = "example_session_state_mgmt"
COUNTER_MODULE = f"resources_servers.{COUNTER}.app"
BENCH_MODULE = "scripts.bench_servers"
# Every instance signs with this, so the benchmark can read a cookie's owner for its own bookkeeping.
SECRET = "bench-routing-secret-of-at-least-32-bytes"
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)
RUN_TIMEOUT_SECONDS = 900
STOP_GRACE_SECONDS = 15
HAPROXY_INSTALL = "apt-get update && apt-get install -y haproxy   (Debian/Ubuntu; the package is 'haproxy' elsewhere too)"

TARGET_HAPROXY_RATIO = 1.0
TARGET_TASKS_HAPROXY_RATIO = 1.2
TARGET_HOP_RATIO = 1.3
TARGET_RSS_MB = 5.0
TARGET_CPU_SCALE = 1.7


# --- numbers and tables -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between the two nearest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None or value != value else f"{value:{spec}}{suffix}"


def render_table(header: list[str], rows: list[list[str]]) -> str:
    """First column left-aligned, the others right-aligned, two spaces between columns."""
    widths = [max(len(row[i]) if i < len(row) else 0 for row in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])


# --- processes ----------------------------------------------------------------------------------------


class Spawned:
    """A process this script started in its own process group, stopped by its PID."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, url: str, timeout: float = 60) -> None:
        """Until ``GET url`` answers 200; a process that exits first is an error with its log."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not answer {url} within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # whatever is left of its group (uvicorn's workers)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def current_workers(pid: int) -> list[int]:
    """The uvicorn worker processes of a multi-worker server: its children, less multiprocessing's resource_tracker."""
    workers = []
    for child in child_pids(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmdline:
            workers.append(child)
    return sorted(workers)


def worker_pids(pid: int, count: int, timeout: float = 60) -> list[int]:
    """The ``count`` workers of the server process ``pid``; a single-worker server is its own one worker."""
    if count == 1:
        return [pid]
    deadline = time.monotonic() + timeout
    while True:
        workers = current_workers(pid)
        if len(workers) == count:
            return workers
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} has {len(workers)} workers, expected {count}")
        time.sleep(0.1)


def settled_workers(pid: int, count: int, routed: bool, timeout: float = 180) -> list[int]:
    """The worker PIDs once every worker has finished starting: the same PIDs, and no CPU used, for a whole
    second, and for a routed server each one serving its private socket (a single worker has none).

    GET / answering is not enough: it answers as soon as one worker is up. Under heavy load uvicorn's
    supervisor may also replace a worker that misses its health check while it is still importing.
    """
    deadline = time.monotonic() + timeout
    while True:
        pids = worker_pids(pid, count, max(1.0, deadline - time.monotonic()))
        try:
            before = {worker: cpu_seconds(worker) for worker in pids}
            time.sleep(1)
            idle = all(cpu_seconds(worker) - before[worker] < 0.05 for worker in pids)
            serving = not routed or count == 1 or all(private_socket(worker) for worker in pids)
        except OSError:
            idle = serving = False
        if idle and serving and worker_pids(pid, count) == pids:
            return pids
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers of process {pid} did not settle within {timeout} s")


def private_socket(pid: int) -> str | None:
    """The private socket a routed worker serves (its abstract name, as /proc/net/unix shows it), or None."""
    for path in listening_sockets(pid):
        if Path(path).parent.name.startswith("ngw-") and path.endswith(".sock"):
            return path
    return None


def replaced(pid: int, workers: list[int]) -> bool:
    """Whether the server's workers are no longer the ones measured (uvicorn replaced one)."""
    return len(workers) > 1 and current_workers(pid) != workers


REPLACED_WARNING = "WARNING: uvicorn replaced a worker of {} during the runs; its figures are not reliable"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of one process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def listening_sockets(pid: int) -> set[str]:
    """Paths of the Unix sockets a process holds open (its private socket, for a routed worker)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    paths = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[6] in inodes:
            paths.add(parts[7])
    return paths


def wait_for_sockets(socket_dir: str, count: int, timeout: float = 60) -> list[str]:
    """The IDs of the server's live workers, once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        workers = sorted(life_sockets(socket_dir))
        if len(workers) >= count:
            return workers
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(workers)} of {count} workers of {socket_dir} alive after {timeout} s")
        time.sleep(0.1)


def write_config(log_dir: Path, name: str, config: dict) -> tuple[dict[str, gym_config.Instance], Path]:
    instances = gym_config.parse(config)
    path = log_dir / f"{name}.json"
    path.write_text(json.dumps({k: v for i in instances.values() for k, v in i.to_dict().items()}))
    return instances, path


def server_env(config_path: Path, instance: str, socket_dir: str | None = None) -> dict[str, str]:
    env = {**os.environ, CONFIG_PATH_ENV: str(config_path), INSTANCE_ENV: instance}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if socket_dir is not None:
        env[SOCKET_DIR_ENV] = socket_dir
    return env


def resource_server(implementation: str, **settings: Any) -> dict:
    return {"resources_servers": {implementation: {"session_secret": SECRET, **settings}}}


def bench_server(**settings: Any) -> dict:
    """An instance of scripts/bench_servers.py's BenchServer. The config names the counter's directory only
    because a config must name an existing server directory; the process runs BenchServer's module."""
    return resource_server(COUNTER, **settings)


def session_owner(cookies: dict[str, str]) -> str | None:
    """The owner named in whichever Gym session cookie these are (None for a server without owners)."""
    for name in cookies:
        if name.endswith("_session"):
            return owner_of(cookies, name.removesuffix("_session"))
    return None


def owner_of(cookies: dict[str, str], instance: str) -> str | None:
    """The owner worker named in an instance's session cookie (the benchmark knows the secret)."""
    cookie = cookies.get(f"{instance}_session")
    if cookie is None:
        return None
    return json.loads(b64decode(TimestampSigner(SECRET).unsign(cookie))).get(OWNER_KEY)


# --- the client ---------------------------------------------------------------------------------------


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
    """Gym's own ``ServerClient``, whose owner pool sends a session's requests on a connection to its owner.

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
        self.gym = ServerClient(instances)
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
        for cookie_header, worker in self.answered:
            cookies = {name: morsel.value for name, morsel in SimpleCookie(cookie_header).items()}
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


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- 1. counter episodes ------------------------------------------------------------------------------

ONE_WORKER = "1 worker"
ROUTED = "4 workers, routed"
ROUTED_GYM = "4 workers, routed, Gym client"
ROUTED_DURABLE = "4 workers, routed, durable"
ROUTED_PLACED = "4 workers, routed, placed"
UNROUTED = "4 workers, routing off"
UNROUTED_GYM = "4 workers, routing off, Gym client"
HAPROXY = "HAProxy + 4 x 1 worker"


class HAProxy:
    """HAProxy in the foreground, round robin with an inserted cookie, in front of the given backends."""

    def __init__(self, binary: str, backends: list[str], port: int, log_dir: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        lines = [
            "global",
            "    maxconn 4096",
            "defaults",
            "    mode http",
            "    maxconn 4096",
            "    timeout connect 5s",
            "    timeout client 60s",
            "    timeout server 60s",
            "    timeout http-keep-alive 60s",
            "frontend bench",
            f"    bind 127.0.0.1:{port}",
            "    default_backend counters",
            "backend counters",
            "    balance roundrobin",
            "    cookie SRV insert indirect nocache",
        ]
        lines += [f"    server s{i} {backend.removeprefix('http://')} cookie s{i}" for i, backend in enumerate(backends)]
        config = log_dir / "haproxy.cfg"
        config.write_text("\n".join(lines) + "\n")
        check = subprocess.run([binary, "-c", "-q", "-f", str(config)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected {config}: {check.stdout}{check.stderr}")
        self.process = Spawned("haproxy", [binary, "-db", "-f", str(config)], log_dir)
        try:
            self.process.wait_ready(f"{self.url}/")
        except BaseException:
            self.process.stop()
            raise

    def stop(self) -> None:
        self.process.stop()


def episodes_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log("1. counter episodes: starting servers")
    config = {
        "counter_1w": resource_server(COUNTER, num_workers=1),
        # In memory, as the 1-worker and HAProxy rows are; the durable row pays the store's writes too.
        "counter_4w": resource_server(COUNTER, num_workers=4, durable_sessions=False),
        "counter_4w_placed": resource_server(COUNTER, num_workers=4, durable_sessions=False, place_sessions=True),
        "counter_4w_durable": resource_server(COUNTER, num_workers=4),
        "counter_4w_off": resource_server(COUNTER, num_workers=4, route_sessions=False),
    }
    haproxy_binary = None if args.no_haproxy else shutil.which("haproxy")
    if haproxy_binary:
        config |= {f"counter_b{i}": resource_server(COUNTER, num_workers=1) for i in range(4)}
    instances = gym_config.parse(config)
    targets = {
        ONE_WORKER: instances["counter_1w"].url,
        ROUTED: instances["counter_4w"].url,
        ROUTED_PLACED: instances["counter_4w_placed"].url,
        ROUTED_DURABLE: instances["counter_4w_durable"].url,
        UNROUTED: instances["counter_4w_off"].url,
    }
    launcher = Launcher(instances, gym_config.free_port())
    launcher.start(timeout=180)
    haproxy = None
    try:
        workers = {
            name: settled_workers(launcher.processes[name].pid, 4, routed=name != "counter_4w_off")
            for name in ("counter_4w", "counter_4w_placed", "counter_4w_durable", "counter_4w_off")
        }
        # Each server's supervisor and workers, HAProxy's backends and HAProxy itself.
        processes = {name: [launcher.processes[name].pid, *pids] for name, pids in workers.items()}
        processes["counter_1w"] = [launcher.processes["counter_1w"].pid]
        server_pids = {row: processes[instance] for row, instance in ROW_INSTANCES.items() if row in targets}
        if haproxy_binary:
            backends = [instances[f"counter_b{i}"].url for i in range(4)]
            haproxy = HAProxy(haproxy_binary, backends, gym_config.free_port(), log_dir)
            targets[HAPROXY] = haproxy.url
            server_pids[HAPROXY] = [haproxy.process.pid, *(launcher.processes[f"counter_b{i}"].pid for i in range(4))]
        targets[ROUTED_GYM] = instances["counter_4w"].url
        targets[UNROUTED_GYM] = instances["counter_4w_off"].url
        server_pids[ROUTED_GYM] = processes["counter_4w"]
        server_pids[UNROUTED_GYM] = processes["counter_4w_off"]
        gym_clients = {
            ROUTED_GYM: lambda: GymEpisodeClient(instances, "counter_4w"),
            UNROUTED_GYM: lambda: GymEpisodeClient(instances, "counter_4w_off"),
        }
        runs = {
            pattern: asyncio.run(alternate(targets, counter_episode, args, args.episodes, args.concurrency, pattern, gym_clients, server_pids))
            for pattern in args.patterns
        }
        warnings = [REPLACED_WARNING.format(name) for name, pids in workers.items() if replaced(launcher.processes[name].pid, pids)]
    finally:
        if haproxy is not None:
            haproxy.stop()
        launcher.stop()
    return {"patterns": {pattern: episode_rows(pattern_runs, args) for pattern, pattern_runs in runs.items()}, "warnings": warnings}


# The instance each row's server is, for its CPU.
ROW_INSTANCES = {
    ONE_WORKER: "counter_1w",
    ROUTED: "counter_4w",
    ROUTED_PLACED: "counter_4w_placed",
    ROUTED_DURABLE: "counter_4w_durable",
    UNROUTED: "counter_4w_off",
}


def episode_rows(runs: dict[str, list[Run]], args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name in (ONE_WORKER, ROUTED, ROUTED_PLACED, ROUTED_GYM, ROUTED_DURABLE, UNROUTED, UNROUTED_GYM, HAPROXY):
        if name not in runs:
            rows[name] = {"skipped": "haproxy not installed" if not args.no_haproxy else "--no-haproxy"}
            continue
        spreads = [run.spread for run in runs[name] if run.spread is not None]
        rows[name] = {
            "total": args.episodes,
            "good": median([run.good for run in runs[name]]),
            "good_all_runs": [run.good for run in runs[name]],
            "errors": median([run.errors for run in runs[name]]),
            "per_second": median([run.per_second for run in runs[name]]),
            "p50_ms": median([run.p50_ms for run in runs[name]]),
            "p99_ms": median([run.p99_ms for run in runs[name]]),
            "spread": max(spreads) if spreads else None,
            "direct_share": median(shares) if (shares := [run.direct_share for run in runs[name] if run.direct_share is not None]) else None,
            "client_cpu_ms": median([run.client_cpu_ms for run in runs[name]]),
            "server_cpu_ms": median(server) if (server := [run.server_cpu_ms for run in runs[name] if run.server_cpu_ms is not None]) else None,
        }
    return rows


def episodes_table(result: dict, args: argparse.Namespace) -> str:
    tables = []
    for pattern, rows_by_name in result["patterns"].items():
        haproxy = rows_by_name[HAPROXY].get("per_second")
        one = rows_by_name[ONE_WORKER]["per_second"]
        rows = []
        for name, row in rows_by_name.items():
            if "skipped" in row:
                reason = row["skipped"]
                hint = f"; install: {HAPROXY_INSTALL}" if reason == "haproxy not installed" else ""
                rows.append([name, f"skipped ({reason}{hint})", "", "", "", "", "", "", "", "", "", ""])
                continue
            rows.append([
                name,
                f"{row['good']:.0f}/{row['total']}",
                f"{row['errors']:.0f}",
                fmt(row["per_second"], ".0f"),
                fmt(row["p50_ms"], ".1f"),
                fmt(row["p99_ms"], ".1f"),
                "-" if row["spread"] is None else f"±{row['spread']:.0%}",
                "-" if row["direct_share"] is None else f"{row['direct_share']:.1%}",
                fmt(row["server_cpu_ms"], ".2f"),
                fmt(row["client_cpu_ms"], ".2f"),
                fmt(ratio(row["per_second"], haproxy), ".2f", "x"),
                fmt(ratio(row["per_second"], one), ".2f", "x"),
            ])
        header = [
            "configuration", "reward 1.0 / total", "errors", "episodes/s", "p50 ms", "p99 ms", "sessions/worker", "direct",
            "server CPU ms/ep", "client CPU ms/ep", "vs HAProxy", "vs 1 worker",
        ]
        title = (
            f"1{'ab'[PATTERNS.index(pattern)]}. Counter episodes, {pattern} client: {args.episodes} per run at concurrency "
            f"{args.concurrency}, medians of {args.runs} runs (sessions/worker: the owner furthest from the mean, worst run; "
            "direct: the Gym client's requests with a session that reached the owner's worker with no hop; "
            "CPU per episode, user and system: the server's processes (HAProxy's included), and the benchmark's own, "
            "the client; on a machine with few cores the two compete)"
        )
        tables.append(f"{title}\n{render_table(header, rows)}")
    return "\n\n".join(tables)


# --- 2. hop cost ----------------------------------------------------------------------------------------

LOCAL = "local"
FORWARDED = "forwarded"
DIRECT = "owner's private socket"


async def measure_hops(args: argparse.Namespace, urls: list[str], socket_dir: str, pids: list[int]) -> dict:
    """One request at a time. Sessions a (owned by worker 0) and b (owned by worker 1)."""
    client = EpisodeClient()
    sessions: list[dict[str, str]] = []
    for url in urls:
        cookies: dict[str, str] = {}
        await client.post(f"{url}/seed_session", {"initial_count": 0}, cookies)
        sessions.append(cookies)
    owners = [owner_of(cookies, "hop") for cookies in sessions]
    if owners[0] == owners[1] or None in owners:
        raise RuntimeError(f"the two hop sessions should have different owners, got {owners}")
    # Straight to each owner's private socket: what the owner itself spends on a forwarded request.
    direct = [EpisodeClient(connector=aiohttp.UnixConnector(socket_address(socket_dir, owner))) for owner in owners]
    # Each kind alternates between the two sessions: (client, url, session index).
    kinds = {
        LOCAL: [(client, urls[0], 0), (client, urls[1], 1)],
        FORWARDED: [(client, urls[1], 0), (client, urls[0], 1)],
        DIRECT: [(direct[0], "http://owner", 0), (direct[1], "http://owner", 1)],
    }
    increments = [0, 0]
    per_run: dict[str, list[dict]] = {kind: [] for kind in kinds}
    blocks = max(1, args.hop_requests // args.hop_block)
    try:
        for _ in range(min(200, args.hop_requests) // 2):  # warm-up: every path, every connection
            for targets in kinds.values():
                for target_client, url, index in targets:
                    await target_client.post(f"{url}/increment_counter", {"count": 1}, sessions[index])
                    increments[index] += 1
        for round_ in range(args.runs):
            latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
            user: dict[str, float] = dict.fromkeys(kinds, 0.0)
            system: dict[str, float] = dict.fromkeys(kinds, 0.0)
            names = list(kinds)
            for block in range(blocks):
                shift = (round_ + block) % len(names)
                for kind in names[shift:] + names[:shift]:
                    user_before, system_before = map(sum, zip(*(cpu_times(pid) for pid in pids)))
                    for i in range(args.hop_block):
                        target_client, url, index = kinds[kind][i % 2]
                        started = time.perf_counter()
                        await target_client.post(f"{url}/increment_counter", {"count": 1}, sessions[index])
                        latencies[kind].append(time.perf_counter() - started)
                        increments[index] += 1
                    user_after, system_after = map(sum, zip(*(cpu_times(pid) for pid in pids)))
                    user[kind] += user_after - user_before
                    system[kind] += system_after - system_before
            for kind in kinds:
                per_run[kind].append({
                    "p50_ms": percentile(latencies[kind], 50) * 1000,
                    "p99_ms": percentile(latencies[kind], 99) * 1000,
                    "user_ms": user[kind] / len(latencies[kind]) * 1000,
                    "system_ms": system[kind] / len(latencies[kind]) * 1000,
                })
            log(f"  run {round_ + 1}/{args.runs}: " + ", ".join(f"{k} p50 {per_run[k][-1]['p50_ms']:.3f} ms" for k in kinds))
        # Every increment, local or forwarded, reached its session's state on its owner.
        counts = []
        for url, cookies in zip(urls, sessions):
            counts.append((await client.post(f"{url}/get_counter_value", {}, cookies))["count"])
    finally:
        await client.close()
        for each in direct:
            await each.close()
    result = {kind: {key: median([run[key] for run in runs]) for key in ("p50_ms", "p99_ms", "user_ms", "system_ms")} for kind, runs in per_run.items()}
    result["state_intact"] = counts == increments
    result["requests_per_run"] = blocks * args.hop_block
    return result


def hop_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log("2. hop cost: starting two workers of one server, each in its own process")
    _, config_path = write_config(log_dir, "hop", {"hop": resource_server(COUNTER, num_workers=2, durable_sessions=False)})
    socket_dir = make_socket_dir()
    ports = [gym_config.free_port(), gym_config.free_port()]
    workers: list[Spawned] = []
    try:
        for i, port in enumerate(ports):
            argv = [sys.executable, "-m", BENCH_MODULE, "worker", "--module", COUNTER_MODULE, "--port", str(port)]
            workers.append(Spawned(f"hop_worker_{i}", argv, log_dir, server_env(config_path, "hop", socket_dir)))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for worker, url in zip(workers, urls):
            worker.wait_ready(f"{url}/")
        wait_for_sockets(socket_dir, 2)
        return asyncio.run(measure_hops(args, urls, socket_dir, [worker.pid for worker in workers]))
    finally:
        for worker in workers:
            worker.stop()
        remove_socket_dir(socket_dir)


def hop_table(result: dict, args: argparse.Namespace) -> str:
    local = result[LOCAL]
    rows = []
    for kind in (LOCAL, FORWARDED, DIRECT):
        row = result[kind]
        rows.append([
            kind,
            fmt(row["p50_ms"], ".3f"),
            fmt(row["p99_ms"], ".3f"),
            fmt(ratio(row["p50_ms"], local["p50_ms"]), ".2f", "x"),
            fmt(ratio(row["p99_ms"], local["p99_ms"]), ".2f", "x"),
            fmt(row["user_ms"], ".3f"),
            fmt(row["system_ms"], ".3f"),
        ])
    header = ["request", "p50 ms", "p99 ms", "p50 / local", "p99 / local", "user CPU ms", "system CPU ms"]
    title = (
        f"2. Hop cost: POST /increment_counter one at a time, {result['requests_per_run']} of each kind per run, "
        f"medians of {args.runs} runs"
    )
    notes = [
        "   local: to the worker that owns the session; forwarded: to the other worker, which forwards it;",
        "   owner's private socket: straight to the owner's Unix socket, the owner's share of a forward.",
        "   CPU: both workers' user and system (kernel) time per request, from /proc (10 ms ticks, summed over blocks).",
        f"   every increment reached its session's state: {'yes' if result['state_intact'] else 'NO'}",
    ]
    return "\n".join([title, render_table(header, rows), *notes])


# --- 3. memory ------------------------------------------------------------------------------------------


async def measure_memory(args: argparse.Namespace, url: str, pids: list[int], socket_of: dict[int, str]) -> dict:
    await drive(bench_episode, url, args.memory_warmup, args.concurrency)
    before = {pid: rss_bytes(pid) for pid in pids}
    cpu_before = {pid: cpu_seconds(pid) for pid in pids}
    owned: Counter[str] = Counter()

    async def counted_episode(client: EpisodeClient, url: str) -> Any:
        cookies: dict[str, str] = {}
        await client.post(f"{url}/seed_session", {}, cookies)
        owned[owner_of(cookies, "bench_mem")] += 1
        reply = await client.post(f"{url}/verify", VERIFY_BODY, cookies)
        return reply.get("reward")

    started = time.perf_counter()
    run = await drive(counted_episode, url, args.sessions, args.concurrency)
    seconds = time.perf_counter() - started
    after = {pid: rss_bytes(pid) for pid in pids}
    workers = []
    for pid in pids:
        worker_id = Path(socket_of[pid]).stem
        workers.append({
            "pid": pid,
            "sessions": owned.get(worker_id, 0),
            "cpu_s": cpu_seconds(pid) - cpu_before[pid],
            "rss_before_mb": before[pid] / 2**20,
            "rss_after_mb": after[pid] / 2**20,
            "growth_mb": (after[pid] - before[pid]) / 2**20,
        })
    return {"sessions": args.sessions, "good": run.good, "errors": run.errors, "seconds": seconds, "workers": workers}


def memory_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log(f"3. memory: {args.sessions} sessions over {args.memory_workers} routed workers")
    instances, config_path = write_config(log_dir, "memory", {"bench_mem": bench_server(num_workers=args.memory_workers)})
    url = instances["bench_mem"].url
    socket_dir = make_socket_dir()
    argv = [sys.executable, "-m", BENCH_MODULE, "serve", "--module", BENCH_MODULE]
    server = Spawned("bench_mem", argv, log_dir, server_env(config_path, "bench_mem", socket_dir))
    try:
        server.wait_ready(f"{url}/")
        pids = settled_workers(server.pid, args.memory_workers, routed=True)
        socket_of = {pid: private_socket(pid) or "?" for pid in pids}
        result = asyncio.run(measure_memory(args, url, pids, socket_of))
        result["warnings"] = [REPLACED_WARNING.format("the server")] if replaced(server.pid, pids) else []
        return result
    finally:
        server.stop()
        remove_socket_dir(socket_dir)


def memory_table(result: dict, args: argparse.Namespace) -> str:
    rows = [
        [
            str(w["pid"]),
            str(w["sessions"]),
            fmt(w["cpu_s"], ".1f"),
            fmt(w["rss_before_mb"], ".1f"),
            fmt(w["rss_after_mb"], ".1f"),
            fmt(w["growth_mb"], "+.2f"),
        ]
        for w in result["workers"]
    ]
    header = ["worker pid", "sessions owned", "CPU s", "RSS before MB", "RSS after MB", "growth MB"]
    title = (
        f"3. Memory: {result['sessions']} new sessions (POST /seed_session storing nothing, then /verify with the cookie, "
        f"routed to the owner) over {args.memory_workers} workers in {result['seconds']:.0f} s; "
        f"{result['good']}/{result['sessions']} verified, {result['errors']} errors"
    )
    return f"{title}\n{render_table(header, rows)}"


# --- 4. CPU-bound scale ---------------------------------------------------------------------------------


def cpu_section(args: argparse.Namespace, log_dir: Path) -> dict:
    log(f"4. CPU-bound scale: verify burns {args.verify_cpu_ms} ms of CPU")
    settings = {"verify_cpu_ms": args.verify_cpu_ms}
    config = {
        "bench_cpu_1w": bench_server(num_workers=1, **settings),
        "bench_cpu_2w": bench_server(num_workers=2, **settings),
    }
    instances, config_path = write_config(log_dir, "cpu", config)
    servers: list[Spawned] = []
    socket_dir = make_socket_dir()
    try:
        argv = [sys.executable, "-m", BENCH_MODULE, "serve", "--module", BENCH_MODULE]
        for name in config:
            servers.append(Spawned(name, argv, log_dir, server_env(config_path, name, socket_dir)))
        workers = []
        for server, name in zip(servers, config):
            server.wait_ready(f"{instances[name].url}/")
            workers.append(settled_workers(server.pid, instances[name].num_workers, routed=True))
        targets = {"1 worker": instances["bench_cpu_1w"].url, "2 workers": instances["bench_cpu_2w"].url}
        runs = asyncio.run(alternate(targets, bench_episode, args, args.cpu_episodes, args.cpu_concurrency))
        warnings = [REPLACED_WARNING.format(name) for server, name, pids in zip(servers, config, workers) if replaced(server.pid, pids)]
    finally:
        for server in servers:
            server.stop()
        remove_socket_dir(socket_dir)
    result = {name: {"per_second": median([r.per_second for r in rs]), "good": median([r.good for r in rs])} for name, rs in runs.items()}
    result["scale"] = ratio(result["2 workers"]["per_second"], result["1 worker"]["per_second"])
    result["warnings"] = warnings
    return result


def cpu_table(result: dict, args: argparse.Namespace) -> str:
    rows = [[name, fmt(result[name]["per_second"], ".1f"), f"{result[name]['good']:.0f}/{args.cpu_episodes}"] for name in ("1 worker", "2 workers")]
    rows.append(["2 workers / 1 worker", fmt(result["scale"], ".2f", "x"), ""])
    title = (
        f"4. CPU-bound scale: seed + verify burning {args.verify_cpu_ms:g} ms CPU, {args.cpu_episodes} episodes per run "
        f"at concurrency {args.cpu_concurrency}, medians of {args.runs} runs"
    )
    return f"{title}\n{render_table(['configuration', 'episodes/s', 'verified'], rows)}"


# --- targets and main -----------------------------------------------------------------------------------


def targets(results: dict) -> list[tuple[str, str, str]]:
    """(target, 'met' / 'not met' / 'not measured', measured figure) for each target of issues 6, 9 and 13."""
    checks = []
    episodes = results.get("episodes")
    for pattern, needed in (("loops", TARGET_HAPROXY_RATIO), ("tasks", TARGET_TASKS_HAPROXY_RATIO)):
        name = f"{pattern} client, 4 workers routed: 100% correct and throughput >= {needed:.1f}x HAProxy"
        if episodes is None or pattern not in episodes["patterns"]:
            checks.append((name, "not measured", "not run"))
            continue
        rows = episodes["patterns"][pattern]
        routed = rows[ROUTED]
        correct = all(good == routed["total"] for good in routed["good_all_runs"])
        against = ratio(routed["per_second"], rows[HAPROXY].get("per_second"))
        figure = f"{min(routed['good_all_runs'])}/{routed['total']} in the worst run, {fmt(against, '.2f', 'x')} HAProxy"
        if against is None:
            checks.append((name, "not measured", f"HAProxy skipped; {figure}"))
            continue
        checks.append((name, "met" if correct and against >= needed else "not met", figure))
        if pattern == "tasks":
            p99 = f"p99 {routed['p99_ms']:.1f} ms against HAProxy's {rows[HAPROXY]['p99_ms']:.1f} ms"
            checks.append(("tasks client, 4 workers routed: p99 <= HAProxy's", "met" if routed["p99_ms"] <= rows[HAPROXY]["p99_ms"] else "not met", p99))
            one = ratio(routed["per_second"], rows[ONE_WORKER]["per_second"])
            checks.append(("tasks client, 4 workers routed: throughput >= 1.0x one worker", "met" if one >= 1.0 else "not met", fmt(one, ".2f", "x")))
        durable = rows.get(ROUTED_DURABLE, {})
        if "per_second" in durable:
            kept = ratio(durable["per_second"], routed["per_second"])
            checks.append((f"{pattern} client: durable >= 0.85x in memory, routed", "met" if kept >= 0.85 else "not met", fmt(kept, ".2f", "x")))
        gym = rows.get(ROUTED_GYM, {})
        if gym.get("direct_share") is not None:
            checks.append((f"{pattern} client: Gym client's direct hits >= 95%", "met" if gym["direct_share"] >= 0.95 else "not met", f"{gym['direct_share']:.1%}"))
            for other, client in ((UNROUTED_GYM, "the Gym client"), (UNROUTED, "the plain pooled client")):
                unrouted = ratio(gym["per_second"], rows[other]["per_second"])
                checks.append((f"{pattern} client: Gym client throughput >= 1.0x routing off with {client}", "met" if unrouted >= 1.0 else "not met", fmt(unrouted, ".2f", "x")))
        placed = rows.get(ROUTED_PLACED, routed)
        if placed.get("spread") is not None:
            spread = f"±{placed['spread']:.0%}"
            checks.append((f"{pattern} client, placement on: sessions per worker within ±10% of the mean", "met" if placed["spread"] <= 0.1 else "not met", spread))
    hop = results.get("hop")
    name = f"forwarded/local p50 <= {TARGET_HOP_RATIO}x"
    if hop is None:
        checks.append((name, "not measured", "section skipped"))
    else:
        hop_ratio = ratio(hop[FORWARDED]["p50_ms"], hop[LOCAL]["p50_ms"])
        checks.append((name, "met" if hop_ratio <= TARGET_HOP_RATIO else "not met", f"{hop_ratio:.2f}x"))
    memory = results.get("memory")
    name = f"RSS growth <= {TARGET_RSS_MB:g} MB per worker over {memory['sessions'] if memory else 100_000} sessions"
    if memory is None:
        checks.append((name, "not measured", "section skipped"))
    else:
        worst = max(w["growth_mb"] for w in memory["workers"])
        checks.append((name, "met" if worst <= TARGET_RSS_MB else "not met", f"worst worker {worst:+.2f} MB"))
    cpu = results.get("cpu")
    name = f"CPU-bound: 2 workers >= {TARGET_CPU_SCALE}x 1 worker"
    if cpu is None:
        checks.append((name, "not measured", "section skipped"))
    else:
        checks.append((name, "met" if cpu["scale"] >= TARGET_CPU_SCALE else "not met", f"{cpu['scale']:.2f}x"))
    return checks


def machine() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    extras = []
    for module in ("uvloop", "httptools"):
        try:
            __import__(module)
            extras.append(f"{module} yes")
        except ImportError:
            extras.append(f"{module} no")
    versions = []
    for package in ("uvicorn", "aiohttp", "starlette"):
        versions.append(f"{package} {__import__(package).__version__}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"Machine: {os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, {', '.join(versions)}, "
        f"{', '.join(extras)}; load average at start {load}"
    )


SECTIONS = ("episodes", "hop", "memory", "cpu")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per configuration (the median is shown)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up episodes per configuration, not counted")
    parser.add_argument("--episodes", type=int, default=2000, help="1: counter episodes per run")
    parser.add_argument("--concurrency", type=int, default=200, help="1 and 3: episodes in flight")
    parser.add_argument("--no-haproxy", action="store_true", help="1: leave out the HAProxy row")
    parser.add_argument("--patterns", default=",".join(PATTERNS), help=f"1: comma-separated subset of {','.join(PATTERNS)}")
    parser.add_argument("--hop-requests", type=int, default=2000, help="2: requests of each kind per run")
    parser.add_argument("--hop-block", type=int, default=100, help="2: requests per block; kinds alternate block by block")
    parser.add_argument("--sessions", type=int, default=100_000, help="3: new sessions between the two RSS readings")
    parser.add_argument("--memory-warmup", type=int, default=2000, help="3: sessions before the first RSS reading")
    parser.add_argument("--memory-workers", type=int, default=4, help="3: workers of the server measured")
    parser.add_argument("--cpu-episodes", type=int, default=1000, help="4: episodes per run")
    parser.add_argument("--cpu-concurrency", type=int, default=64, help="4: episodes in flight")
    parser.add_argument("--verify-cpu-ms", type=float, default=5.0, help="4: CPU each verify burns")
    parser.add_argument("--json", type=Path, help="also write the measured figures to this file")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (they are always kept on failure)")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.runs < 1 or args.episodes < 1 or args.hop_block < 2:
        parser.error("--runs and --episodes must be at least 1, --hop-block at least 2")
    args.hop_block = min(args.hop_block, args.hop_requests)
    args.patterns = [p.strip() for p in args.patterns.split(",") if p.strip()]
    if set(args.patterns) - set(PATTERNS):
        parser.error(f"unknown patterns {sorted(set(args.patterns) - set(PATTERNS))}; choose from {', '.join(PATTERNS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(machine(), flush=True)
    if "episodes" in args.sections and not args.no_haproxy and shutil.which("haproxy") is None:
        print(f"HAProxy is not installed, so its row is skipped. To include it: {HAPROXY_INSTALL}", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench_routing_"))
    results: dict[str, Any] = {}
    tables = {"episodes": episodes_table, "hop": hop_table, "memory": memory_table, "cpu": cpu_table}
    sections = {"episodes": episodes_section, "hop": hop_section, "memory": memory_section, "cpu": cpu_section}
    started = time.monotonic()
    try:
        for name in args.sections:
            results[name] = sections[name](args, log_dir)
            print(f"\n{tables[name](results[name], args)}", flush=True)
            for warning in results[name].get("warnings", []):
                print(warning, flush=True)
    except BaseException:
        log(f"logs of the servers are kept in {log_dir}")
        raise
    if args.keep_logs:
        log(f"logs of the servers are in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    print("\nTargets (issues 6, 9 and 13)")
    for target, verdict, figure in targets(results):
        print(f"  {'[' + verdict + ']':<15} {target}: {figure}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n(took {time.monotonic() - started:.0f} s; load average at the end {load})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
