"""Sessions end once, through the hook, however they end; their later requests get 410 saying why; /close_session
is idempotent; new sessions over max_sessions get 503 (two workers of one server in this process, a real socket directory)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, ClassVar

import pytest
from fastapi import Request

from nemo_gym import SESSION_ID_KEY
from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym.lifecycle.cap import LIVE_SUFFIX
from nemo_gym.lifecycle.registry import EndReason
from nemo_gym.sessions.worker import OWNER_KEY
from tests.session_cookies import signed_session
from tests.unit_tests.routing_workers import EchoServer, new_session, two_workers

pytestmark = pytest.mark.anyio


class HookedServer(EchoServer):
    """Records every ``on_session_end`` call, by session id."""

    ends: ClassVar[list[tuple[str, str, str | None]]] = []

    async def on_session_end(self, session_id: str, reason: EndReason) -> None:
        HookedServer.ends.append((session_id, str(reason), self.worker_id))

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


@pytest.fixture(autouse=True)
def fresh_record():
    HookedServer.ends.clear()


def session_id(reply_body: dict[str, Any]) -> str:
    return reply_body["session_id"]


async def echo(caller, worker, cookies) -> tuple[int, dict]:
    reply = await caller.post(worker, "/echo/x", cookies)
    return reply.status, await reply.json()


async def test_close_twice_answers_200_both_times_and_calls_the_hook_once_on_the_owner():
    async with two_workers(HookedServer) as (a, b, caller):
        cookies = await new_session(caller, a)
        _, body = await echo(caller, a, cookies)
        first = await caller.post(b, "/close_session", cookies)  # lands on B: forwarded to A, the owner
        second = await caller.post(a, "/close_session", cookies)
        assert (first.status, (await first.json())["status"]) == (200, "closed")
        assert (second.status, (await second.json())["status"]) == (200, "already closed")
        assert "ended by /close_session" in (await second.json())["detail"]
        assert HookedServer.ends == [(session_id(body), "close", a.server.worker_id)]


async def test_a_request_of_a_closed_session_gets_410_saying_it_was_closed():
    async with two_workers(HookedServer) as (a, b, caller):
        cookies = await new_session(caller, a)
        await caller.post(a, "/close_session", cookies)
        for worker in (a, b):
            status, body = await echo(caller, worker, cookies)
            assert status == 410 and "ended by /close_session" in body["detail"]


async def test_a_close_without_a_session_or_with_a_forged_cookie_is_400_and_ends_nothing():
    async with two_workers(HookedServer) as (a, b, caller):
        live = await new_session(caller, a)
        forged = {a.server.session_cookie: signed_session("not-the-secret-of-this-server-at-all", {SESSION_ID_KEY: "x"})}
        for cookies in (None, forged, {a.server.session_cookie: "garbage"}):
            reply = await caller.post(a, "/close_session", cookies)
            assert reply.status == 400 and "names no session" in (await reply.json())["detail"]
        assert HookedServer.ends == []
        assert (await echo(caller, a, live))[0] == 200


async def test_verify_ends_the_session_through_the_hook_and_a_seed_with_its_cookie_starts_a_new_one():
    async with two_workers(HookedServer) as (a, b, caller):
        cookies = await new_session(caller, a)
        _, body = await echo(caller, a, cookies)
        row = {"responses_create_params": {"input": "x"}, "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [], "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}}
        verified = await caller.post(b, "/verify", cookies, json=row)
        assert verified.status == 200, await verified.text()
        assert HookedServer.ends == [(session_id(body), "verify", a.server.worker_id)]
        status, gone = await echo(caller, a, cookies)
        assert status == 410 and "ended with its /verify" in gone["detail"]
        seeded = await caller.post(a, "/seed_session", cookies, json={})
        assert seeded.status == 200
        renewed = {key: morsel.value for key, morsel in seeded.cookies.items()}
        status, fresh = await echo(caller, a, renewed)
        assert status == 200 and session_id(fresh) != session_id(body)


async def test_a_seed_starts_a_new_session_whatever_its_cookie_names_and_leaves_a_live_one_as_it_is():
    async with two_workers(HookedServer) as (a, b, caller):
        live = await new_session(caller, a)
        _, before = await echo(caller, a, live)
        not_a_worker = {a.server.session_cookie: signed_session(a.server.signing_key, {SESSION_ID_KEY: "s", OWNER_KEY: "not a worker"})}
        for cookies in (live, not_a_worker):
            for worker in (a, b):
                seeded = await caller.post(worker, "/seed_session", cookies, json={})
                assert seeded.status == 200, await seeded.text()
                status, body = await echo(caller, worker, {key: morsel.value for key, morsel in seeded.cookies.items()})
                assert status == 200 and session_id(body) not in (session_id(before), "s")
        assert (await echo(caller, b, live))[0] == 200


async def test_an_idle_session_ends_once_as_idle_and_a_busy_one_does_not():
    async with two_workers(HookedServer, session_idle_timeout_seconds=0.6) as (a, b, caller):
        idle, busy = await new_session(caller, a), await new_session(caller, b)
        _, idle_body = await echo(caller, a, idle)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # kept busy through both workers: each request reaches B, its owner
            for worker in (a, b):
                assert (await echo(caller, worker, busy))[0] == 200
            await asyncio.sleep(0.1)
        status, body = await echo(caller, b, idle)
        assert status == 410 and "idle for" in body["detail"] and "session_idle_timeout_seconds: 0.6" in body["detail"]
        assert HookedServer.ends == [(session_id(idle_body), "idle", a.server.worker_id)]
        assert (await (await caller.post(a, "/close_session", idle)).json())["status"] == "already closed"


async def test_new_sessions_over_max_sessions_get_503_with_retry_after_and_live_ones_are_untouched():
    async with two_workers(HookedServer, max_sessions=3) as (a, b, caller):
        live = [await new_session(caller, worker) for worker in (a, b, a)]
        for worker in (a, b):
            refused = await caller.post(worker, "/increment")
            assert refused.status == 503 and refused.headers["Retry-After"]
            assert "max_sessions (3)" in (await refused.json())["detail"]
        for cookies in live:
            assert (await caller.post(b, "/increment", cookies)).status == 200
        await caller.post(a, "/close_session", live[0])
        assert (await caller.post(b, "/increment")).status == 200


async def test_live_counters_are_shared_on_the_host_only_where_a_cap_reads_them():
    """The workers' shared live counters (``lifecycle.cap``) are read only to enforce a cap: without one, a session's
    start and end write no file (two system calls and a lock each saved); with one, each worker publishes its counter."""
    for settings, kept in (({}, set()), ({"max_sessions": 3}, {"a", "b"})):
        async with two_workers(HookedServer, **settings) as (a, b, caller):
            for worker in (a, b):
                await caller.post(worker, "/close_session", await new_session(caller, worker))
            socket_dir = a.server._assembly.socket_dir
            published = {name for name, worker in (("a", a), ("b", b)) if os.path.exists(os.path.join(socket_dir, worker.server.worker_id + LIVE_SUFFIX))}
            assert published == kept, settings


async def test_liveness_and_metrics_paths_start_no_session_and_count_toward_no_cap():
    async with two_workers(HookedServer, max_sessions=1) as (a, b, caller):
        for _ in range(3):
            assert (await caller.http.get(a.url + "/")).status == 200
        assert (await caller.post(a, "/increment")).status == 200
        assert len(a.server.lifecycle.registry) == 1


STRAY_PATHS = ("/healthz", "/favicon.ico", "/robots.txt", "/metrics/")


async def test_stray_requests_to_routes_that_do_not_exist_start_no_session_so_max_sessions_seeds_all_get_200():
    """20 cookieless requests that 404 and one that 405, over both workers, leave the cap whole for real seeds."""
    async with two_workers(HookedServer, max_sessions=8) as (a, b, caller):
        for number in range(20):
            stray = await caller.http.get((a, b)[number % 2].url + STRAY_PATHS[number % len(STRAY_PATHS)])
            assert stray.status == 404, await stray.text()
        wrong_method = await caller.http.get(b.url + "/seed_session")
        assert wrong_method.status == 405, await wrong_method.text()
        seeds = [await caller.post((a, b)[number % 2], "/seed_session", json={}) for number in range(8)]
        assert [seed.status for seed in seeds] == [200] * 8, [await seed.text() for seed in seeds]
        over = await caller.post(a, "/seed_session", json={})
        assert over.status == 503 and "max_sessions (8)" in (await over.json())["detail"]
