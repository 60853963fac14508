"""nemo_gym.evaluation.agent_metrics: rollouts grouped by the agent that ran them, each agent asked for its
aggregate metrics over its own (their heavy fields left out), written as upstream writes them."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request

from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import Instance, free_port
from nemo_gym.evaluation.agent_metrics import agent_of, metrics_by_agent, rollout_order, stripped, write_agent_metrics
from tests.unit_tests.in_process_server import serving


def test_rollouts_sort_by_task_then_rollout_and_those_without_indices_last():
    rows = [{"_ng_task_index": 1, "_ng_rollout_index": 0}, {}, {"_ng_task_index": 0, "_ng_rollout_index": 1}, {"_ng_task_index": 0}, {"_ng_task_index": 0, "_ng_rollout_index": 0}]
    assert sorted(rows, key=rollout_order) == [rows[4], rows[2], rows[3], rows[0], rows[1]]


def test_a_rollouts_agent_is_the_one_its_agent_ref_names_else_the_default():
    assert agent_of({"agent_ref": {"name": "a1"}}, "d") == "a1"
    assert agent_of({"agent_ref": "a1"}, "d") == "d"
    assert agent_of({}, None) is None


def test_a_row_sent_loses_its_heavy_fields_and_its_response_keeps_only_usage():
    row = {"reward": 1.0, "response": {"output": ["long"], "usage": {"total_tokens": 9}}, "responses_create_params": {}, "ng_trajectory": []}
    assert stripped(row) == {"reward": 1.0, "response": {"usage": {"total_tokens": 9}}}
    assert stripped({"reward": 0.0, "response": {"output": []}}) == {"reward": 0.0}


def metrics_agent(seen: list) -> FastAPI:
    app = FastAPI()

    @app.post("/aggregate_metrics")
    async def aggregate(request: Request) -> dict:
        rows = (await request.json())["verify_responses"]
        seen.append(rows)
        return {"agent_metrics": {"n": len(rows)}, "key_metrics": {"mean": sum(row["reward"] for row in rows) / len(rows)}, "group_level_metrics": []}

    return app


@pytest.mark.anyio
async def test_each_agent_is_asked_over_its_own_rollouts_and_rows_naming_none_count_under_the_only_one(capsys):
    port, seen = free_port(), []
    client = ReadingClient({"agent": Instance("agent", "responses_api_agents", "simple_agent", {"host": "127.0.0.1", "port": port})})
    results = [{"agent_ref": {"name": "agent"}, "reward": 1.0, "response": {"output": [1]}}, {"reward": 0.0}]
    async with serving(metrics_agent(seen), port):
        try:
            entries = await metrics_by_agent(client, results, ["agent"])
            with pytest.raises(ValueError, match=r"name agents \['other'\] that the servers do not have"):
                await metrics_by_agent(client, [{"agent_ref": {"name": "other"}, "reward": 1.0}], ["agent"])
        finally:
            await client.close()
    assert entries == [{"agent_ref": {"name": "agent"}, "agent_metrics": {"n": 2}, "key_metrics": {"mean": 0.5}, "group_level_metrics": []}]
    assert seen == [[{"agent_ref": {"name": "agent"}, "reward": 1.0}, {"reward": 0.0}]]
    assert "Key metrics for agent" in capsys.readouterr().out


@pytest.mark.anyio
async def test_with_several_agents_a_row_naming_none_is_left_out():
    port, seen = free_port(), []
    client = ReadingClient({"a": Instance("a", "responses_api_agents", "simple_agent", {"host": "127.0.0.1", "port": port})})
    async with serving(metrics_agent(seen), port):
        try:
            entries = await metrics_by_agent(client, [{"reward": 1.0}, {"agent_ref": {"name": "a"}, "reward": 0.0}], ["a", "b"])
        finally:
            await client.close()
    assert [entry["agent_metrics"] for entry in entries] == [{"n": 1}]


def test_the_entries_are_written_beside_the_output_as_its_aggregate_metrics(tmp_path):
    path = write_agent_metrics(tmp_path / "rollouts.jsonl", [{"agent_ref": {"name": "a"}}])
    assert path == tmp_path / "rollouts_aggregate_metrics.json"
    assert json.loads(path.read_text()) == [{"agent_ref": {"name": "a"}}]
