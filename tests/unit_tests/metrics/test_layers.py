"""``GET /metrics`` on in-process workers: what it answers, and what the requests around it count."""

from __future__ import annotations

import os
import uuid

import pytest

from nemo_gym import SESSION_ID_KEY
from nemo_gym.sessions.worker import OWNER_KEY
from tests.session_cookies import signed_session
from tests.unit_tests.metrics.scrape import value
from tests.unit_tests.routing_workers import Caller, Worker, new_session

pytestmark = pytest.mark.anyio


async def scrape(caller: Caller, worker: Worker) -> str:
    response = await caller.http.get(worker.url + "/metrics")
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "Set-Cookie" not in response.headers
    return await response.text()


async def test_metrics_of_a_single_worker_server_answer_without_making_a_session_or_setting_a_cookie():
    worker = await Worker(f"echo_{uuid.uuid4().hex[:8]}", 1, None).start()
    caller = Caller()
    try:
        first = await scrape(caller, worker)
        await new_session(caller, worker)
        second = await scrape(caller, worker)
        assert value(first, "nemo_gym_sessions_started_total") == 0
        assert value(second, "nemo_gym_sessions_started_total") == 1
        assert value(second, "nemo_gym_requests_served_here_total") == 1
        assert value(second, "nemo_gym_responses_total", status="200") == 1  # the scrapes are not counted
        assert value(second, "nemo_gym_live_sessions", worker=str(os.getpid())) == 1  # no worker ID: the process's
    finally:
        await caller.close()
        await worker.stop()


async def test_metrics_are_answered_by_the_receiving_worker_even_with_another_owners_cookie(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    response = await caller.http.get(b.url + "/metrics", headers={"Cookie": f"{a.server.session_cookie}={cookies[a.server.session_cookie]}"})
    assert response.status == 200 and "Set-Cookie" not in response.headers
    assert response.headers["X-NeMo-Gym-Worker"] == b.server.worker_id
    assert value(await response.text(), "nemo_gym_requests_forwarded_total", hop="worker") == 0


async def test_a_forward_is_counted_once_under_its_hop_with_its_duration(pair):
    a, b, caller = pair
    cookies = await new_session(caller, a)
    response = await caller.post(b, "/increment", cookies)
    assert response.status == 200 and (await response.json())["worker"] == a.server.worker_id
    text = await scrape(caller, a)
    assert value(text, "nemo_gym_requests_forwarded_total", hop="worker") == 1
    assert value(text, "nemo_gym_forward_duration_seconds_count", hop="worker") == 1
    assert value(text, "nemo_gym_forward_duration_seconds_sum", hop="worker") > 0
    assert value(text, "nemo_gym_requests_served_here_total") == 1  # the new session, on A; B's request was forwarded


async def test_replies_are_counted_by_status_on_the_receiving_worker(pair):
    a, b, caller = pair
    gone = signed_session(a.server.signing_key, {SESSION_ID_KEY: "of-a-dead-worker", OWNER_KEY: "0123456789abcdef"})
    response = await caller.post(b, "/increment", {a.server.session_cookie: gone})
    assert response.status == 410
    missing = await caller.post(b, "/no_such_tool")
    assert missing.status == 404
    text = await scrape(caller, a)
    assert value(text, "nemo_gym_responses_total", status="410") == 1
    assert value(text, "nemo_gym_responses_total", status="404") == 1
    assert value(text, "nemo_gym_requests_forwarded_total", hop="worker") == 0


async def test_metrics_take_only_get_and_head(pair):
    a, b, caller = pair
    response = await caller.post(a, "/metrics")
    assert response.status == 405 and response.headers["Allow"] == "GET, HEAD" and "Set-Cookie" not in response.headers
