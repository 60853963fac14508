"""The durable counter at 4 workers on a state file system that fills up, then has room again.

The state directory is a small tmpfs of its own (so root only), filled with a file while standard
clients (each keeping its cookies its own way, one replacing them with each reply's) drive the
counter, then emptied. Increments the store cannot commit are refused with 503, Retry-After and the
session's cookie, and undone; reads answer 200 all along; once there is room the sessions go on, and
every count, in the replies and in the store, is the sum of the increments acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym.openai_utils import new_response
from nemo_gym.process.launcher import Launcher
from resources_servers.example_session_state_mgmt.standard_clients import CLIENTS, Post, Reply
from tests.e2e.session_routing.test_durable_sessions import COUNTER, counter_config, rows
from tests.e2e.session_routing.test_durable_standard_clients import sent_session, set_session
from tests.full_filesystem import full, mounted_tmpfs, needs_mount

pytestmark = needs_mount

SESSIONS = 8
TMPFS_SIZE = "8m"
# Bounds on the rounds (one increment and one read per session each), never expectations.
MAX_FULL_ROUNDS = 300
ENOUGH_REFUSED = 2 * SESSIONS
MAX_RECOVERY_ROUNDS = 50
STANDARD = ["aiohttp_jar", "httpx_jar", "requests_session", "replacing"]


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path_factory.mktemp("full_disk_state"), TMPFS_SIZE) as path:
        yield path


@pytest.fixture(scope="module")
def counter(start_module_servers, state_dir: Path) -> Launcher:
    return start_module_servers(counter_config(4), {"NEMO_GYM_STATE_DIR": str(state_dir)}, timeout=120)


def verify_body(count: int) -> dict:
    return {"responses_create_params": {"input": "x"}, "response": new_response().model_dump(mode="json"), "expected_count": count}


async def round_of(posts: list[Post], path: str, body: dict) -> list[Reply]:
    return await asyncio.gather(*(post(path, body) for post in posts))


@pytest.mark.parametrize("client", STANDARD)
def test_increments_the_full_store_cannot_keep_get_503_with_retry_after_and_the_cookie_reads_go_on_and_no_count_is_wrong(counter, state_dir, client):
    async def scenario() -> tuple[list[Reply], list[tuple[dict, dict | None]], list[Reply], list[int], list[Reply], list[dict]]:
        async with CLIENTS[client](counter.instances[COUNTER].url, False) as episode_post, contextlib.AsyncExitStack() as stack:
            posts = [await stack.enter_async_context(episode_post()) for _ in range(SESSIONS)]
            seeded = [await post("/seed_session", {"initial_count": number}) for number, post in enumerate(posts)]
            assert [reply.status for reply in seeded] == [200] * SESSIONS, [reply.body for reply in seeded]
            expected = list(range(SESSIONS))
            refused: list[Reply] = []
            reads: list[Reply] = []
            with full(state_dir):
                for _ in range(MAX_FULL_ROUNDS):
                    for number, reply in enumerate(await round_of(posts, "/increment_counter", {"count": 1})):
                        expected[number] += reply.status == 200
                        refused += [reply] if reply.status != 200 else []
                    read = await round_of(posts, "/get_counter_value", {})
                    reads += read
                    assert [(reply.status, reply.body) for reply in read] == [(200, {"count": count}) for count in expected]
                    if len(refused) >= ENOUGH_REFUSED:
                        break
            recovered: list[Reply] = []
            for _ in range(MAX_RECOVERY_ROUNDS):
                recovered = await round_of(posts, "/increment_counter", {"count": 1})
                expected = [count + (reply.status == 200) for count, reply in zip(expected, recovered)]
                if all(reply.status == 200 for reply in recovered):
                    break
            final = await round_of(posts, "/get_counter_value", {})
            sessions = [await sent_session(reply) for reply in final]
            refused_cookies = [(await sent_session(reply), set_session(reply)) for reply in refused]
        return refused, refused_cookies, recovered, expected, final, sessions

    refused, refused_cookies, recovered, expected, final, sessions = asyncio.run(scenario())
    assert len(refused) >= ENOUGH_REFUSED, "the full file system refused too few increments to show anything"
    assert {reply.status for reply in refused} == {503}, [reply.body for reply in refused if reply.status != 503][:3]
    assert all(reply.retry_after == "1" for reply in refused)
    assert all(given == sent for sent, given in refused_cookies)  # the session the request named, signed again
    assert all("could not be stored" in reply.body["detail"] for reply in refused)
    assert [reply.status for reply in recovered] == [200] * SESSIONS
    assert [(reply.status, reply.body) for reply in final] == [(200, {"count": count}) for count in expected]
    stored = rows(state_dir)
    assert [int(stored[session["session_id"]][2]) for session in sessions] == expected


@pytest.mark.parametrize("client", STANDARD)
def test_a_verify_the_full_store_refused_ends_nothing_so_its_retry_scores_and_one_it_stored_ended_its_session(counter, state_dir, client):
    """Sessions verify while the state file system is full (an increment refused first, so the store refuses writes
    now), each client as its users send it, with no Idempotency-Key. A verify answered 503 "did not take effect"
    ended nothing: sent again once there is room, it scores 1.0. One answered 200 ended its session: sent again,
    410 saying so. Afterwards every session has ended once."""

    async def scenario() -> tuple[int, list[Reply], list[Reply], list[Reply]]:
        async with CLIENTS[client](counter.instances[COUNTER].url, False) as episode_post, contextlib.AsyncExitStack() as stack:
            posts = [await stack.enter_async_context(episode_post()) for _ in range(SESSIONS)]
            seeded = [await post("/seed_session", {"initial_count": number}) for number, post in enumerate(posts)]
            assert [reply.status for reply in seeded] == [200] * SESSIONS, [reply.body for reply in seeded]
            expected = list(range(SESSIONS))
            increments_refused = 0
            with full(state_dir):
                for _ in range(MAX_FULL_ROUNDS):
                    for number, reply in enumerate(await round_of(posts, "/increment_counter", {"count": 1})):
                        expected[number] += reply.status == 200
                        increments_refused += reply.status != 200
                    if increments_refused:
                        break
                bodies = [verify_body(count) for count in expected]
                first = await asyncio.gather(*(post("/verify", body) for post, body in zip(posts, bodies)))
            again = await asyncio.gather(*(post("/verify", body) for post, body in zip(posts, bodies)))
            after = await round_of(posts, "/get_counter_value", {})
        return increments_refused, first, again, after

    increments_refused, first, again, after = asyncio.run(scenario())
    refused = [number for number, reply in enumerate(first) if reply.status != 200]
    assert increments_refused and refused, "the full file system refused no verify: nothing shown"
    assert all(first[number].status == 503 and "did not take effect" in first[number].body["detail"] for number in refused), [first[number].body for number in refused][:3]
    assert [(again[number].status, again[number].body.get("reward")) for number in refused] == [(200, 1.0)] * len(refused), [again[number].body for number in refused][:3]
    stored = [number for number in range(SESSIONS) if number not in refused]
    assert all(first[number].body["reward"] == 1.0 for number in stored)
    assert all(again[number].status == 410 and "ended with its /verify" in again[number].body["detail"] for number in stored)
    assert [reply.status for reply in after] == [410] * SESSIONS
