"""In-process CPU per request: the counter's app built routed (every request a direct hit) against routing off.

    python -m scripts.bench.in_process [--episodes 2000] [--rounds 5] [--profile routed|off]

Both apps are built as a 4-worker server's worker builds them (in memory, no placement), and driven
straight through ASGI with the same counter episodes (seed 0, +1, +2, verify 3), each episode's cookie
threaded from the replies, no sockets: what is measured is the server's own work per request, with
``time.process_time``, in alternating rounds. It prints the median CPU per request of each build and
their ratio, routed over off. Timings are only printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
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


def build(routed: bool, socket_dir: str) -> Any:
    settings = {"num_workers": 4, "durable_sessions": False, "route_sessions": routed, "session_secret": SECRET, "port": gym_config.free_port()}
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


async def episodes(app: Any, count: int) -> float:
    """CPU seconds per request over ``count`` episodes."""
    started = time.process_time()
    for _ in range(count):
        cookie = None
        for path, body in BODIES:
            cookie = await request(app, path, body, cookie)
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


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as socket_dir:
        apps = {"routed, direct hits": build(True, socket_dir), "routing off": build(False, socket_dir)}
        async with lifespan(apps["routed, direct hits"]), lifespan(apps["routing off"]):
            await measure(apps, args)


async def measure(apps: dict[str, Any], args: argparse.Namespace) -> None:
    for app in apps.values():
        await episodes(app, 50)  # warm: validators built, caches filled
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
        for name, app in apps.items():
            figures[name].append(await episodes(app, args.episodes))
    medians = {name: statistics.median(values) * 1000 for name, values in figures.items()}
    for name, value in medians.items():
        print(f"{name:>22}: {value:.4f} ms CPU per request (median of {args.rounds} rounds of {args.episodes} episodes)")
    print(f"{'ratio':>22}: {medians['routed, direct hits'] / medians['routing off']:.3f}x routed over off")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", choices=("routed", "off"))
    asyncio.run(main(parser.parse_args()))
