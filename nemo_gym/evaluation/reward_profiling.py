"""The reward profile of a finished collection (upstream's ``gym eval profile``): each rollout joined to its
materialized input row, then statistics per task (with the task's sample row and every rollout's numbers) and per agent.

Files beside the rollouts: ``<stem>_reward_profiling.jsonl`` (one line per task) and ``<stem>_agent_metrics.json``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from nemo_gym.global_config import AGENT_REF_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.reward_profile import describe, numeric_fields

Key = tuple[Any, Any]


def key_of(row: dict[str, Any]) -> Key:
    return row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]


def by_key(rows: list[dict[str, Any]], name: str) -> dict[Key, dict[str, Any]]:
    indexed: dict[Key, dict[str, Any]] = {}
    for row in rows:
        if key_of(row) in indexed:
            raise ValueError(f"two {name} rows for task {key_of(row)[0]}, rollout {key_of(row)[1]}")
        indexed[key_of(row)] = row
    return indexed


def aligned(rows: list[dict[str, Any]], results: list[dict[str, Any]], allow_partial: bool) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(input row, result) pairs by key; a result without its input is an error, and so is an input without its
    result unless ``allow_partial``."""
    inputs, outputs = by_key(rows, "materialized input"), by_key(results, "result")
    extra, missing = sorted(outputs.keys() - inputs.keys()), sorted(inputs.keys() - outputs.keys())
    if extra:
        raise ValueError(f"{len(extra)} rollouts have no materialized input row; their (task, rollout) keys: {extra[:10]}")
    if missing and not allow_partial:
        raise ValueError(f"{len(missing)} materialized input rows have no rollout; their (task, rollout) keys: {missing[:10]}. Pass --allow-partial-rollouts to profile the completed ones")
    return [(inputs[key], outputs[key]) for key in sorted(inputs.keys() & outputs.keys())]


def completion(rows: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    """How much of the collection finished, by rollout and by input row (task)."""
    inputs, outputs = by_key(rows, "materialized input"), by_key(results, "result")
    done = inputs.keys() & outputs.keys()
    expected, finished = Counter(task for task, _ in inputs), Counter(task for task, _ in done)
    complete = sum(finished[task] == count for task, count in expected.items())
    partial = sum(0 < finished[task] < count for task, count in expected.items())
    return {
        "expected_rollout_rows": len(inputs),
        "completed_rollout_rows": len(done),
        "missing_rollout_rows": len(inputs) - len(done),
        "extra_rollout_rows": len(outputs.keys() - inputs.keys()),
        "reward_profile_completion_pct": 100.0 if not inputs else 100.0 * len(done) / len(inputs),
        "total_input_rows": len(expected),
        "complete_input_rows": complete,
        "partial_input_rows": partial,
        "missing_input_rows": len(expected) - complete - partial,
    }


def rollout_info(result: dict[str, Any]) -> dict[str, Any]:
    task, rollout = key_of(result)
    return {"rollout_id": f"{task}:{rollout}", TASK_INDEX_KEY_NAME: task, ROLLOUT_INDEX_KEY_NAME: rollout, **numeric_fields(result)}


def profile(rows: list[dict[str, Any]], results: list[dict[str, Any]], allow_partial: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one entry per task, one entry per agent)."""
    pairs = aligned(rows, results, allow_partial)
    expected = Counter(row[TASK_INDEX_KEY_NAME] for row in rows)
    per_task: dict[Any, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    per_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row, result in pairs:
        per_task[row[TASK_INDEX_KEY_NAME]].append((row, result))
        per_agent[row[AGENT_REF_KEY_NAME]["name"]].append(result)
    tasks = []
    for task, group in per_task.items():
        sample = {key: value for key, value in group[0][0].items() if key not in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME)}
        tasks.append({
            TASK_INDEX_KEY_NAME: task,
            **describe([result for _, result in group]),
            "sample": sample,
            "num_rollouts": len(group),
            "expected_num_rollouts": expected[task],
            "missing_num_rollouts": expected[task] - len(group),
            "reward_profile_completion_pct": 100.0 * len(group) / expected[task],
            "rollout_infos": sorted((rollout_info(result) for _, result in group), key=lambda info: info[ROLLOUT_INDEX_KEY_NAME]),
        })
    agents = [{**describe(group), AGENT_REF_KEY_NAME: {"name": name}} for name, group in per_agent.items()]
    return tasks, agents


def write_profile(rollouts: Path, tasks: list[dict[str, Any]], agents: list[dict[str, Any]]) -> tuple[Path, Path]:
    profiling = rollouts.with_name(f"{rollouts.stem}_reward_profiling.jsonl")
    profiling.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    agent_metrics = rollouts.with_name(f"{rollouts.stem}_agent_metrics.json")
    agent_metrics.write_text(json.dumps(agents))
    return profiling, agent_metrics
