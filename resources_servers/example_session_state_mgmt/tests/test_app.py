"""The counter environment, served as its own process, driven over HTTP with session cookies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from nemo_gym import config as gym_config
from nemo_gym.client.reading import ReadingClient
from nemo_gym.openai_utils import new_response
from nemo_gym.process import discovery
from nemo_gym.process.launcher import Launcher

COUNTER = "counter"
TASK = {"responses_create_params": {"input": "The counter starts at 2. Add 3, then get the count and tell me."}}
EMPTY_RESPONSE = new_response().model_dump(mode="json")


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    instances = gym_config.parse({COUNTER: {"resources_servers": {"example_session_state_mgmt": {}}}})
    discovery.check_settings(instances)
    launcher = Launcher(instances, gym_config.free_port()).start(timeout=60)
    try:
        yield launcher
    finally:
        launcher.stop()


@pytest.fixture
async def client(launcher: Launcher):
    client = ReadingClient(launcher.instances)
    try:
        yield client
    finally:
        await client.close()


async def call(client: ReadingClient, path: str, cookies: dict[str, str], body: dict) -> dict:
    """POST to the counter with a session's cookies; keeps any cookie the reply sets."""
    reply = await client.post(COUNTER, path, json=body, cookies=cookies)
    assert reply.status == 200, reply.text
    cookies.update(reply.cookies)
    return reply.body


async def verify(client: ReadingClient, cookies: dict[str, str], expected_count: int) -> dict:
    return await call(client, "/verify", cookies, {**TASK, "response": EMPTY_RESPONSE, "expected_count": expected_count})


@pytest.mark.anyio
async def test_seed_increment_and_get_track_one_sessions_count(client):
    cookies: dict[str, str] = {}
    await call(client, "/seed_session", cookies, {**TASK, "initial_count": 2})
    assert set(cookies) == {f"{COUNTER}_session"}
    assert await call(client, "/increment_counter", cookies, {"count": 3}) == {"success": True}
    assert await call(client, "/increment_counter", cookies, {"count": -1}) == {"success": True}
    assert await call(client, "/get_counter_value", cookies, {}) == {"count": 4}


@pytest.mark.anyio
async def test_verify_rewards_1_when_the_count_equals_the_expected_count(client):
    cookies: dict[str, str] = {}
    await call(client, "/seed_session", cookies, {**TASK, "initial_count": 2})
    await call(client, "/increment_counter", cookies, {"count": 3})
    verdict = await verify(client, cookies, 5)
    assert (verdict["reward"], verdict["count"], verdict["expected_count"]) == (1.0, 5, 5)


@pytest.mark.anyio
async def test_verify_rewards_0_when_the_count_differs(client):
    cookies: dict[str, str] = {}
    await call(client, "/seed_session", cookies, {**TASK, "initial_count": 2})
    await call(client, "/increment_counter", cookies, {"count": 3})
    verdict = await verify(client, cookies, 6)
    assert (verdict["reward"], verdict["count"]) == (0.0, 5)


@pytest.mark.anyio
async def test_verify_rewards_0_for_an_unknown_session(client):
    verdict = await verify(client, {}, 0)
    assert (verdict["reward"], verdict["count"]) == (0.0, None)


@pytest.mark.anyio
async def test_verify_grades_with_its_own_reward_and_count_whatever_the_caller_sent(client):
    cookies: dict[str, str] = {}
    await call(client, "/seed_session", cookies, {**TASK, "initial_count": 2})
    body = {**TASK, "response": EMPTY_RESPONSE, "expected_count": 5, "reward": 1.0, "count": 5}
    verdict = await call(client, "/verify", cookies, body)
    assert (verdict["reward"], verdict["count"]) == (0.0, 2)


def test_verify_grades_with_its_own_reward_and_count_for_a_requests_session_too(launcher):
    url = launcher.instances[COUNTER].url
    with requests.Session() as http:
        assert http.post(f"{url}/seed_session", json={**TASK, "initial_count": 2}, timeout=30).status_code == 200
        body = {**TASK, "response": EMPTY_RESPONSE, "expected_count": 5, "reward": 1.0, "count": 5}
        reply = http.post(f"{url}/verify", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert (reply.json()["reward"], reply.json()["count"]) == (0.0, 2)


@pytest.mark.anyio
async def test_sessions_keep_separate_counts(client):
    first: dict[str, str] = {}
    second: dict[str, str] = {}
    await call(client, "/seed_session", first, {**TASK, "initial_count": 10})
    await call(client, "/seed_session", second, {**TASK, "initial_count": 0})
    await call(client, "/increment_counter", first, {"count": 1})
    await call(client, "/increment_counter", second, {"count": 7})
    assert await call(client, "/get_counter_value", first, {}) == {"count": 11}
    assert await call(client, "/get_counter_value", second, {}) == {"count": 7}


@pytest.mark.anyio
async def test_a_tool_call_with_a_bad_argument_is_a_422_naming_it(client):
    reply = await client.post(COUNTER, "/increment_counter", json={"count": "three"})
    assert reply.status == 422
    assert reply.body["detail"][0]["loc"] == ["body", "count"]


@pytest.mark.anyio
async def test_aggregate_metrics_counts_each_reward(client):
    body = {"verify_responses": [{"reward": 1.0}, {"reward": 0.0}, {"reward": 1.0}]}
    metrics = await call(client, "/aggregate_metrics", {}, body)
    summary = {key: metrics[key] for key in ("num_episodes", "mean_reward", "reward_counts")}
    assert summary == {"num_episodes": 3, "mean_reward": pytest.approx(2 / 3), "reward_counts": {"0.0": 1, "1.0": 2}}
    assert metrics["key_metrics"] == {"mean/reward": pytest.approx(2 / 3)}


@pytest.mark.anyio
async def test_tools_refuse_a_session_that_was_never_seeded(client):
    for path, body in (("/increment_counter", {"count": 1}), ("/get_counter_value", {})):
        reply = await client.post(COUNTER, path, json=body)
        assert reply.status == 404
        assert "seed_session" in reply.body["detail"]
