"""nemo_gym.evaluation.reward_profiling: rollouts joined to their materialized input rows by (task, rollout), a
partial collection refused unless allowed, and statistics per task (with its sample row) and per agent."""

from __future__ import annotations

import json

import pytest

from nemo_gym.evaluation.reward_profiling import aligned, completion, profile, write_profile
from nemo_gym.reward_profile import describe


def row(task: int, rollout: int, agent: str = "a") -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": {"name": agent}, "question": f"q{task}"}


def result(task: int, rollout: int, reward: float) -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward}


ROWS = [row(0, 0), row(0, 1), row(1, 0, "b"), row(1, 1, "b")]


def test_each_rollout_is_paired_with_its_input_row_in_key_order():
    pairs = aligned(ROWS, [result(1, 0, 1.0), result(0, 1, 0.0), result(0, 0, 1.0), result(1, 1, 0.0)], allow_partial=False)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r, _ in pairs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["_ng_task_index"] == out["_ng_task_index"] and r["_ng_rollout_index"] == out["_ng_rollout_index"] for r, out in pairs)


def test_a_rollout_without_its_input_is_an_error_and_an_input_without_its_rollout_is_one_unless_partial_is_allowed():
    with pytest.raises(ValueError, match=r"1 rollouts have no materialized input row; their \(task, rollout\) keys: \[\(5, 0\)\]"):
        aligned(ROWS, [result(5, 0, 1.0)], allow_partial=True)
    with pytest.raises(ValueError, match="3 materialized input rows have no rollout.*--allow-partial-rollouts"):
        aligned(ROWS, [result(0, 0, 1.0)], allow_partial=False)
    assert len(aligned(ROWS, [result(0, 0, 1.0)], allow_partial=True)) == 1


def test_two_rows_of_one_key_are_an_error_naming_it():
    with pytest.raises(ValueError, match="two result rows for task 0, rollout 0"):
        aligned(ROWS, [result(0, 0, 1.0), result(0, 0, 0.0)], allow_partial=True)


def test_completion_counts_rollouts_and_tasks_complete_partial_and_missing():
    done = completion(ROWS + [row(2, 0)], [result(0, 0, 1.0), result(0, 1, 1.0), result(1, 0, 0.0), result(9, 9, 0.0)])
    assert done == {
        "expected_rollout_rows": 5, "completed_rollout_rows": 3, "missing_rollout_rows": 2, "extra_rollout_rows": 1,
        "reward_profile_completion_pct": 60.0, "total_input_rows": 3, "complete_input_rows": 1, "partial_input_rows": 1, "missing_input_rows": 1,
    }
    assert completion([], [])["reward_profile_completion_pct"] == 100.0


def test_a_profile_has_each_tasks_statistics_sample_and_rollouts_and_each_agents_statistics():
    results = [result(0, 1, 0.0), result(0, 0, 1.0), result(1, 0, 0.5)]
    tasks, agents = profile(ROWS, results, allow_partial=True)
    first, second = sorted(tasks, key=lambda task: task["_ng_task_index"])
    assert first["sample"] == {"agent_ref": {"name": "a"}, "question": "q0"}
    assert (first["num_rollouts"], first["expected_num_rollouts"], first["missing_num_rollouts"], first["reward_profile_completion_pct"]) == (2, 2, 0, 100.0)
    assert [info["rollout_id"] for info in first["rollout_infos"]] == ["0:0", "0:1"]
    assert (second["num_rollouts"], second["missing_num_rollouts"], second["reward_profile_completion_pct"]) == (1, 1, 50.0)
    assert {key: first[key] for key in describe(results[:2])} == describe(results[:2])
    assert sorted(agents, key=lambda agent: agent["agent_ref"]["name"]) == [
        {**describe(results[:2]), "agent_ref": {"name": "a"}},
        {**describe(results[2:]), "agent_ref": {"name": "b"}},
    ]


def test_the_profile_is_written_beside_the_rollouts(tmp_path):
    profiling, agent_metrics = write_profile(tmp_path / "rollouts.jsonl", [{"t": 0}, {"t": 1}], [{"a": 1}])
    assert (profiling.name, agent_metrics.name) == ("rollouts_reward_profiling.jsonl", "rollouts_agent_metrics.json")
    assert [json.loads(line) for line in profiling.read_text().splitlines()] == [{"t": 0}, {"t": 1}]
    assert json.loads(agent_metrics.read_text()) == [{"a": 1}]
