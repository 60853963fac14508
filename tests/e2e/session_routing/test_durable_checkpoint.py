"""``gym sessions checkpoint`` of a live run: the durable counter at 4 workers, 200 sessions adding 1 on and on.

Mid-run the checkpoint pauses the server (every worker refuses new requests with 503 and Retry-After,
those in flight finish), exports, writes the file and resumes. Each session's count in the file holds
every increment acknowledged before the checkpoint began and none sent after it ended; the run goes on
to the end with every acknowledged increment counted. The file restored into a fresh server (a new state
directory, the same secret) continues every session from its count in the file. A client trickling a
body beside the checkpoint does not hold it up, nor hold the host in 503.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from nemo_gym.cli.main import build_parser
from nemo_gym.client.reading import cookie_header
from nemo_gym.durable.applied import unwrap
from nemo_gym.process.launcher import Launcher
from tests.e2e.session_routing.test_counter_routing import seed_all
from tests.e2e.session_routing.test_durable_sessions import COUNTER, EPISODES, SECRET, counter_config, gym_sessions, launch, session_id_of

RUN_SECONDS = 8
CHECKPOINT_AFTER_SECONDS = 3
THINK_SECONDS = 0.05
TRICKLE_BYTES = 200 * 1024
TRICKLE_BYTES_PER_SECOND = 2 * 1024
LONG_DRAIN_SECONDS = 30


async def post(http: aiohttp.ClientSession, url: str, path: str, body: dict, jar: dict[str, str]) -> tuple[int, str | None, dict]:
    async with http.post(url + path, json=body, headers={"Cookie": cookie_header(jar)} if jar else None) as reply:
        jar.update({key: morsel.value for key, morsel in reply.cookies.items()})
        return reply.status, reply.headers.get("Retry-After"), await reply.json(content_type=None)


async def run_with_checkpoint(url: str, jars: list[dict[str, str]], checkpoint) -> tuple[list[list[tuple]], tuple[float, float, subprocess.CompletedProcess], list]:
    """Every session adds 1 every THINK_SECONDS for RUN_SECONDS, each on a new connection; ``checkpoint()`` runs
    CHECKPOINT_AFTER_SECONDS in. Per session its steps (sent, received, status, Retry-After); the checkpoint's
    start, end and outcome; then each session's count read back."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0), cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def one(jar: dict[str, str]) -> list[tuple]:
            steps = []
            began = time.monotonic()
            while time.monotonic() - began < RUN_SECONDS:
                sent = time.monotonic()
                status, retry_after, _ = await post(http, url, "/increment_counter", {"count": 1}, jar)
                steps.append((sent, time.monotonic(), status, retry_after))
                await asyncio.sleep(float(retry_after) / 10 if status == 503 else THINK_SECONDS)
            return steps

        async def timed_checkpoint() -> tuple[float, float, subprocess.CompletedProcess]:
            await asyncio.sleep(CHECKPOINT_AFTER_SECONDS)
            start = time.monotonic()
            done = await asyncio.to_thread(checkpoint)
            return start, time.monotonic(), done

        *steps, checkpointed = await asyncio.gather(*(one(jar) for jar in jars), timed_checkpoint())
        counts = await asyncio.gather(*(post(http, url, "/get_counter_value", {}, jar) for jar in jars))
        return steps, checkpointed, counts


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("checkpoint_secret") / "secret"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


def test_a_checkpoint_of_a_four_worker_run_loses_no_acknowledged_write_and_restores_into_a_fresh_server(tmp_path, secret_file):
    running = launch(counter_config(4), tmp_path / "running")
    output = tmp_path / "checkpoint.json"
    try:
        url = running.instances[COUNTER].url
        jars = asyncio.run(seed_all(url))
        arguments = ("checkpoint", "--url", url, "--output", str(output), "--secret-file", str(secret_file))
        steps, (start, end, done), counts = asyncio.run(run_with_checkpoint(url, jars, lambda: gym_sessions(tmp_path / "running", *arguments)))
    finally:
        running.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"checkpointed {EPISODES} sessions of {COUNTER}" in done.stdout
    statuses = {step[2] for session in steps for step in session}
    assert statuses <= {200, 503}, "a request the pause met was refused; nothing else went wrong"
    assert [step for session in steps for step in session if step[2] == 503 and step[3] is None] == []
    refused_outside = [step for session in steps for step in session if step[2] == 503 and not (start <= step[1] and step[0] <= end)]
    assert refused_outside == [], "only requests during the checkpoint were refused"
    saved = {row["session_id"]: json.loads(unwrap(row["state"])[0]) for row in json.loads(output.read_text())["sessions"]}
    wrong = []
    for number, (jar, session, (status, _, body)) in enumerate(zip(jars, steps, counts)):
        acked = [step for step in session if step[2] == 200]
        before, sent_by_end = sum(step[1] < start for step in acked), sum(step[0] < end for step in acked)
        in_file = saved[session_id_of(jar)] - number
        if not before <= in_file <= sent_by_end or (status, body) != (200, {"count": number + len(acked)}):
            wrong.append((number, before, in_file, sent_by_end, len(acked), status, body))
    assert wrong == []

    fresh_dir = tmp_path / "fresh"
    restored = gym_sessions(fresh_dir, "restore", "--input", str(output))
    assert restored.returncode == 0 and f"restored {EPISODES} sessions" in restored.stdout, restored.stdout + restored.stderr
    fresh = launch(counter_config(4), fresh_dir)
    try:
        continued = asyncio.run(read_then_add(fresh, jars))
    finally:
        fresh.stop()
    expected = [((200, {"count": saved[session_id_of(jar)]}), (200, {"count": saved[session_id_of(jar)] + 1})) for jar in jars]
    assert len(expected) == EPISODES
    assert continued == expected


async def read_then_add(launcher: Launcher, jars: list[dict[str, str]]) -> list[tuple]:
    url = launcher.instances[COUNTER].url
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0), cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def one(jar: dict[str, str]) -> tuple:
            read = await post(http, url, "/get_counter_value", {}, jar)
            await post(http, url, "/increment_counter", {"count": 1}, jar)
            again = await post(http, url, "/get_counter_value", {}, jar)
            return (read[0], read[2]), (again[0], again[2])

        return list(await asyncio.gather(*(one(jar) for jar in jars)))


async def trickle(url: str, finish: asyncio.Event) -> int:
    """A cookieless seed whose 200 KB body comes at 2 KiB/s until ``finish``, then the rest at once; its status."""
    address = urlsplit(url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    body = json.dumps({"initial_count": 0}).ljust(TRICKLE_BYTES).encode()
    writer.write(f"POST /seed_session HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    sent, piece = 0, TRICKLE_BYTES_PER_SECOND // 4
    while not finish.is_set() and sent + piece < len(body):
        writer.write(body[sent : sent + piece])
        sent += piece
        await asyncio.sleep(0.25)
    writer.write(body[sent:])
    status = int((await asyncio.wait_for(reader.readline(), 10)).split()[1])
    writer.close()
    return status


def test_a_checkpoint_beside_a_client_trickling_a_body_completes_and_refuses_requests_only_while_it_runs(tmp_path, secret_file):
    """A request counts as in flight only once its body has come whole: the checkpoint does not wait for the
    trickle, ends long before its drain time (30 s), and other clients are refused only while it runs."""
    running = launch(counter_config(2), tmp_path)
    try:
        url = running.instances[COUNTER].url
        jars = asyncio.run(seed_all(url))[:20]
        arguments = ["sessions", "checkpoint", "--instance", COUNTER, "--url", url, "--output", str(tmp_path / "checkpoint.json")]
        arguments += ["--secret-file", str(secret_file), "--drain-seconds", str(LONG_DRAIN_SECONDS)]
        command = build_parser().parse_args(arguments)

        async def scenario():
            finish = asyncio.Event()
            trickling = asyncio.create_task(trickle(url, finish))
            await asyncio.sleep(1)
            # In this process: a command's start-up, under this test's load, took as long as 9 s.
            steps, checkpointed, _ = await run_with_checkpoint(url, jars, lambda: command.handler(command))
            finish.set()
            return steps, checkpointed, await trickling

        steps, (start, end, done), trickled = asyncio.run(scenario())
    finally:
        running.stop()
    assert done == 0
    assert end - start < LONG_DRAIN_SECONDS / 3, "the checkpoint did not wait out its drain time"
    assert {step[2] for session in steps for step in session} <= {200, 503}
    refused = [step for session in steps for step in session if step[2] == 503]
    assert [step for step in refused if step[3] is None or not (start <= step[1] and step[0] <= end)] == []
    assert trickled == 200, "the trickled request, whole after the checkpoint, is served"
