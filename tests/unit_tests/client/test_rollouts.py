"""Rollout driving: task rows in, one result per episode out (failures recorded, never lost), files written."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from nemo_gym.client.reading import ReadingClient
from nemo_gym.client.rollouts import read_rows, run_episode, run_episodes, write_results
from nemo_gym.config import Instance, free_port
from tests.unit_tests.in_process_server import serving

ROW = {"responses_create_params": {"input": "hi"}, "task": 1}
AGENT = "agent"


def agent_instances(port: int) -> dict[str, Instance]:
    return {AGENT: Instance(AGENT, "responses_api_agents", "simple_agent", {"host": "127.0.0.1", "port": port})}


def fake_agent() -> FastAPI:
    """An agent's /run that scores task 1 and fails on anything else."""
    app = FastAPI()

    @app.post("/run")
    async def run(row: dict) -> JSONResponse:
        if row.get("task") == 1:
            return JSONResponse({**row, "reward": 1.0})
        return JSONResponse({"detail": "model backend is down"}, status_code=502)

    return app


def test_read_rows_repeats_each_row_and_applies_the_limit(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({**ROW, "task": n}) + "\n" for n in range(3)) + "\n")
    rows = read_rows(path, limit=2, num_repeats=3)
    assert [row["task"] for row in rows] == [0, 0, 0, 1, 1, 1]


def test_read_rows_error_names_the_line_that_is_not_json(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n{nope\n")
    with pytest.raises(ValueError, match=f"{path}:2: not valid JSON"):
        read_rows(path)


def test_read_rows_error_names_the_line_without_responses_create_params(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({"input": "hi"}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: a task row is a JSON object with responses_create_params"):
        read_rows(path)


@pytest.mark.anyio
async def test_a_failed_episode_is_recorded_with_reward_0_and_its_error():
    port = free_port()
    client = ReadingClient(agent_instances(port))
    try:
        async with serving(fake_agent(), port):
            results = await run_episodes(client, AGENT, [ROW, {**ROW, "task": 2}, ROW], concurrency=2, progress=False)
    finally:
        await client.close()
    assert [result["reward"] for result in results] == [1.0, 0.0, 1.0]
    assert results[1]["error"]["status"] == 502
    assert "model backend is down" in results[1]["error"]["detail"]


@pytest.mark.anyio
async def test_an_agent_that_cannot_be_reached_is_a_recorded_error_not_a_crash():
    client = ReadingClient(agent_instances(free_port()))
    try:
        result = await run_episode(client, AGENT, ROW)
    finally:
        await client.close()
    assert result["reward"] == 0.0
    assert result["task"] == 1
    assert result["error"]["status"] is None
    assert "Cannot connect" in result["error"]["detail"]


def test_write_results_writes_rollouts_and_metrics_beside_them(tmp_path):
    output = tmp_path / "out" / "rollouts.jsonl"
    metrics_path = write_results(output, [{"reward": 1.0}, {"reward": 0.0}], {"mean_reward": 0.5})
    assert metrics_path == tmp_path / "out" / "rollouts_aggregate_metrics.json"
    assert [json.loads(line) for line in output.read_text().splitlines()] == [{"reward": 1.0}, {"reward": 0.0}]
    assert json.loads(metrics_path.read_text()) == {"mean_reward": 0.5}
