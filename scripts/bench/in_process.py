"""In-process CPU per request: the counter's app built routed, its requests served where they land, forwarded to
a sibling, or forwarded to another replica, against routing off.

    python -m scripts.bench.in_process [--episodes 2000] [--rounds 5] [--profile routed|off] [--files]

The apps are built as a 4-worker server's workers build them (in memory, no placement), all in this
process, and driven straight through ASGI with the same counter episodes (seed 0, +1, +2, verify 3), each
episode's cookie threaded from the replies. Rows: "routed, direct hits" (every request to the worker that
owns its session, no sockets); "forwarded to a sibling" (seeded at one worker, the rest sent to another
of its host, over the private Unix socket); "forwarded across replicas" (seeded at a worker of one
replica, the rest sent to a worker of another, over the forwarding port on loopback); "routing off".
What is measured is the whole process's work per request, both ends of a hop included, with
``time.process_time``, in alternating rounds. It prints the median CPU per request of each row and its
ratio to routing off. Timings are only printed, never asserted.

``--files`` prints instead, per row, what a request after the seed crosses: the project's files whose code
ran for it (both ends of a hop), and how many times a session cookie's signature was checked per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import statistics
import tempfile
import time
from http.cookies import SimpleCookie
from collections.abc import AsyncIterator
from typing import Any

from nemo_gym import config as gym_config
from resources_servers.example_session_state_mgmt.app import CounterServer
from scripts.bench.client import VERIFY_BODY
from scripts.bench.servers import SECRET

NAME = "counter"
EPISODE = [("/seed_session", {"initial_count": 0}), ("/increment_counter", {"count": 1}), ("/increment_counter", {"count": 2}), ("/verify", {**VERIFY_BODY, "expected_count": 3})]
BODIES = [(path, json.dumps(body).encode()) for path, body in EPISODE]


def build(routed: bool, socket_dir: str, port: int | None = None, forward_port: int | None = None) -> Any:
    """``port``: the replica's public port (its identity); ``forward_port``: its forwarding port (a replica set)."""
    settings = {"num_workers": 4, "durable_sessions": False, "route_sessions": routed, "session_secret": SECRET, "port": port or gym_config.free_port()}
    if forward_port is not None:
        settings["forward_port"] = forward_port
    instances = gym_config.parse({NAME: {"resources_servers": {"example_session_state_mgmt": settings}}}, check_ports=False)
    return CounterServer.for_instance(NAME, instances).build_app(socket_dir)


async def request(app: Any, path: str, body: bytes, cookie: str | None) -> str | None:
    """One POST through the app; the session cookie of its reply (or the one sent, if it sets none)."""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if cookie is not None:
        headers.append((b"cookie", cookie.encode("latin-1")))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    reply: dict = {}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            reply.update(message)

    await app(scope, receive, send)
    if reply["status"] != 200:
        raise RuntimeError(f"{path}: HTTP {reply['status']}")
    for name, value in reply["headers"]:
        if name == b"set-cookie" and value.startswith(f"{NAME}_session=".encode()):
            morsel = SimpleCookie(value.decode("latin-1"))[f"{NAME}_session"]
            return f"{NAME}_session={morsel.value}"
    return cookie


async def episodes(apps: tuple[Any, Any], count: int) -> float:
    """CPU seconds per request over ``count`` episodes, each seeded at ``apps[0]`` and continued at ``apps[1]``."""
    started = time.process_time()
    for _ in range(count):
        cookie = None
        for number, (path, body) in enumerate(BODIES):
            cookie = await request(apps[min(number, 1)], path, body, cookie)
    return (time.process_time() - started) / (count * len(BODIES))


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """The app's start-up and shut-down, as uvicorn runs them (a routed worker's private socket, its counter)."""
    inbox: asyncio.Queue = asyncio.Queue()
    outbox: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(started)
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task


@contextlib.asynccontextmanager
async def rows() -> AsyncIterator[dict[str, tuple[Any, Any]]]:
    """Each row's apps, started: where an episode is seeded, and where its other requests are sent."""
    with tempfile.TemporaryDirectory() as host, tempfile.TemporaryDirectory() as replica_host, tempfile.TemporaryDirectory() as other_host:
        local, sibling, off = build(True, host), build(True, host), build(False, host)
        # Two replicas of one set, each on its own host (socket directory), with its own forwarding port.
        there, here = (build(True, directory, forward_port=gym_config.free_port()) for directory in (other_host, replica_host))
        async with contextlib.AsyncExitStack() as running:
            for app in (local, sibling, off, there, here):
                await running.enter_async_context(lifespan(app))
            yield {"routed, direct hits": (local, local), "forwarded to a sibling": (local, sibling), "forwarded across replicas": (there, here), "routing off": (off, off)}


async def main(args: argparse.Namespace) -> None:
    async with rows() as pairs:
        await (crossed(pairs, args.episodes) if args.files else measure(pairs, args))


async def crossed(apps: dict[str, Any], count: int) -> None:
    """Per row, the project's files a request after the seed runs code of, and the cookie checks per request."""
    for pair in apps.values():
        await episodes(pair, 10)  # warm, as ``measure`` does
    root = str(gym_config.REPO_ROOT) + os.sep
    for name, (seeded, continued) in apps.items():
        profile = cProfile.Profile()
        for _ in range(count):
            cookie = await request(seeded, *BODIES[0], None)
            for path, body in BODIES[1:]:
                profile.enable()
                cookie = await request(continued, path, body, cookie)
                profile.disable()
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        files = sorted({file.removeprefix(root) for file, _, _ in stats if file.startswith(root) and not file.startswith(__file__)})
        # TimestampSigner.unsign (timed.py) checks a signature once, calling its base class's unsign within.
        checks = sum(calls for (file, _, function), (_, calls, *_rest) in stats.items() if function == "unsign" and file.endswith("itsdangerous/timed.py"))
        print(f"{name}: {len(files)} files, {checks / (count * (len(BODIES) - 1)):g} cookie signature checks per request")
        for file in files:
            print(f"    {file}")


async def measure(apps: dict[str, Any], args: argparse.Namespace) -> None:
    for pair in apps.values():
        await episodes(pair, 50)  # warm: validators built, caches filled
    if args.profile:
        app = apps["routed, direct hits" if args.profile == "routed" else "routing off"]
        profile = cProfile.Profile()
        profile.enable()
        await episodes(app, args.episodes)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
        return
    figures: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(args.rounds):
        for name, pair in apps.items():
            figures[name].append(await episodes(pair, args.episodes))
    medians = {name: statistics.median(values) * 1000 for name, values in figures.items()}
    for name, value in medians.items():
        ratio = value / medians["routing off"]
        print(f"{name:>26}: {value:.4f} ms CPU per request, {ratio:.3f}x routing off (median of {args.rounds} rounds of {args.episodes} episodes)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", choices=("routed", "off"))
    parser.add_argument("--files", action="store_true", help="print the files a request crosses per row, not its CPU")
    asyncio.run(main(parser.parse_args()))
