"""/aggregate_metrics: upstream's statistics, a server's compute_metrics and get_key_metrics hooks, and the helpers."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_gym import config as gym_config
from nemo_gym.base_resources_server import SimpleResourcesServer
from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.client.reading import ReadingClient
from nemo_gym.reward_profile import add_avg_sample_std_dev, compute_aggregate_metrics, compute_pass_majority_metrics, compute_subset_metrics, highest_k_metrics
from tests.unit_tests.in_process_server import serving

ROWS = [
    {"reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0, "correct": True, "response": {"usage": {"output_tokens": 10}}},
    {"reward": 0.0, "_ng_task_index": 0, "_ng_rollout_index": 1, "correct": False, "response": {"usage": {"output_tokens": 30}}},
    {"reward": 1.0, "_ng_task_index": 1, "_ng_rollout_index": 0, "correct": True, "response": {"usage": {"output_tokens": 20}}},
]


class PassAtKServer(SimpleResourcesServer):
    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        return {"tasks_seen": len(tasks), **compute_pass_majority_metrics(tasks)[0]}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        return {"tasks_seen": agent_metrics["tasks_seen"], **highest_k_metrics(agent_metrics, "pass@{k}")}


async def aggregate(server_class: type, server_type: str, rows: list[dict], **settings: Any) -> dict:
    implementation = "example_session_state_mgmt" if server_type == "resources_servers" else "simple_agent"
    data = {"srv": {server_type: {implementation: {"port": gym_config.free_port(), **settings}}}}
    instances = gym_config.parse(data)
    client = ReadingClient(instances)
    try:
        async with serving(server_class.for_instance("srv", instances).build_app(), instances["srv"].port):
            reply = await client.post("srv", "/aggregate_metrics", json={"verify_responses": rows})
    finally:
        await client.close()
    assert reply.status == 200, reply.text
    return reply.body


@pytest.mark.anyio
async def test_aggregate_metrics_describes_every_numeric_field_per_task_and_overall():
    metrics = await aggregate(SimpleResourcesServer, "resources_servers", ROWS)
    agent = metrics["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(2 / 3)
    assert (agent["max/correct"], agent["min/correct"], agent["median/output_tokens"]) == (1.0, 0.0, 20.0)
    assert agent["std/reward"] == pytest.approx(0.57735, abs=1e-4)
    assert [group["_ng_task_index"] for group in metrics["group_level_metrics"]] == [0, 1]
    assert metrics["group_level_metrics"][0]["mean/output_tokens"] == 20.0
    assert metrics["group_level_metrics"][1]["std/reward"] == 0.0
    assert not any(key.endswith("_ng_task_index") or key.endswith("_ng_rollout_index") for key in agent)
    assert metrics["key_metrics"] == {key: value for key, value in agent.items() if key.startswith("mean/")}


@pytest.mark.anyio
async def test_compute_metrics_is_merged_into_agent_metrics_and_get_key_metrics_picks_the_headline():
    metrics = await aggregate(PassAtKServer, "resources_servers", ROWS)
    assert metrics["agent_metrics"]["tasks_seen"] == 2
    assert metrics["agent_metrics"]["pass@1/accuracy"] == pytest.approx(75.0)
    assert metrics["key_metrics"] == {"tasks_seen": 2, "pass@2/accuracy": 100.0}


@pytest.mark.anyio
async def test_an_agent_that_skips_verification_reports_no_metrics():
    metrics = await aggregate(SimpleResponsesAPIAgent, "responses_api_agents", ROWS, skip_verification=True)
    assert (metrics["agent_metrics"], metrics["key_metrics"], metrics["group_level_metrics"]) == ({}, {}, [])


def test_pass_at_k_of_binary_scores_is_the_chance_that_k_tries_include_a_success():
    tasks = [[{"reward": 1.0}, {"reward": 0.0}, {"reward": 0.0}], [{"reward": 0.0}, {"reward": 0.0}, {"reward": 0.0}]]
    metrics, scores, names, max_k = compute_pass_majority_metrics(tasks)
    assert (names, max_k, len(scores)) == (["accuracy"], 3, 2)
    assert metrics["pass@1/accuracy"] == pytest.approx(100 * (1 / 3) / 2)
    assert metrics["pass@2/accuracy"] == pytest.approx(100 * (2 / 3) / 2)
    assert metrics["pass@3/accuracy"] == pytest.approx(50.0)


def test_majority_at_k_votes_on_the_answer_and_counts_missing_answers():
    tasks = [[{"reward": 1.0, "answer": "4"}, {"reward": 1.0, "answer": "4"}, {"reward": 0.0, "answer": "5"}], [{"reward": 0.0, "answer": None}]]
    metrics = compute_pass_majority_metrics(tasks, answer_key="answer")[0]
    assert metrics["majority@3/accuracy"] == pytest.approx(50.0)
    assert metrics["pass@1/no_answer"] == pytest.approx(50.0)


def test_subset_metrics_prefix_each_subsets_metrics_with_its_name():
    tasks = [[{"reward": 1.0, "level": "easy"}], [{"reward": 0.0, "level": "hard"}]]
    metrics = compute_subset_metrics(tasks, "level")
    assert (metrics["easy/pass@1/accuracy"], metrics["hard/pass@1/accuracy"]) == (100.0, 0.0)
    assert not any("per_sample_aggregate" in key for key in metrics)


def test_highest_k_metrics_keeps_the_largest_k_and_leaves_out_spread_statistics():
    agent_metrics = {"pass@1/accuracy": 50.0, "pass@4/accuracy": 90.0, "pass@4/no_answer": 1.0, "pass@1[avg-of-4]/accuracy/std_dev_across_runs": 3.0}
    assert highest_k_metrics(agent_metrics, "pass@{k}") == {"pass@4/accuracy": 90.0, "pass@4/no_answer": 1.0}
    assert highest_k_metrics(agent_metrics, "pass@{k}", exclude_names=["no_answer"]) == {"pass@4/accuracy": 90.0}
    assert highest_k_metrics(agent_metrics, "pass@1[avg-of-{k}]") == {}


def test_avg_sample_std_dev_is_the_mean_within_task_spread_of_the_first_k_scores():
    tasks = [[{"reward": 1.0}, {"reward": 0.0}, {"reward": 1.0}], [{"reward": 1.0}, {"reward": 1.0}], [{"reward": 0.0}]]
    metrics, scores, names, max_k = compute_pass_majority_metrics(tasks)
    add_avg_sample_std_dev(metrics, scores, names, max_k)
    # k=2: task one's (1, 0) spreads by sqrt(0.5), task two's (1, 1) by 0; task three has one score.
    assert metrics["pass@1[avg-of-2]/accuracy/avg_sample_std_dev"] == pytest.approx((0.5**0.5 + 0.0) / 2)
    assert metrics["pass@1[avg-of-3]/accuracy/avg_sample_std_dev"] == pytest.approx((1 / 3) ** 0.5 / 2)
    assert "pass@1[avg-of-1]/accuracy/avg_sample_std_dev" not in metrics


def test_avg_sample_std_dev_adds_nothing_for_one_rollout_per_task():
    metrics: dict = {}
    add_avg_sample_std_dev(metrics, [[{"accuracy": 1.0}]], ["accuracy"], 1)
    assert metrics == {}


def test_per_task_metrics_of_compute_metrics_join_their_tasks_group_level_row_as_upstreams():
    rows = [{"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": float(task == rollout)} for task in (0, 1) for rollout in (0, 1)]

    def compute_metrics(tasks):
        per_task = [{"_ng_task_index": group[0]["_ng_task_index"], "instance_id": f"task-{group[0]['_ng_task_index']}"} for group in tasks]
        return {"solved": 2, "per_task_metrics": per_task}

    result = compute_aggregate_metrics(rows, compute_metrics)
    assert [(group["_ng_task_index"], group["instance_id"]) for group in result.group_level_metrics] == [(0, "task-0"), (1, "task-1")]
    assert result.agent_metrics["solved"] == 2 and "per_task_metrics" not in result.agent_metrics
