"""Aggregate metrics of verify responses (``/aggregate_metrics``) and the helpers servers compute theirs with.

Every numeric or boolean field of a verify response (and of its ``response.usage``) gets
``mean|max|min|median|std/<field>``, per task (rows sharing ``_ng_task_index``) and over all rows.
A server adds its own metrics by overriding ``compute_metrics`` and picks the headline ones with
``get_key_metrics`` (``AggregateMetricsMixin``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from nemo_gym.config_types import AggregateMetrics
from nemo_gym.global_config import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

Tasks = list[list[dict[str, Any]]]
STAT_SUFFIXES = ("std_dev_across_runs", "std_err_across_runs", "avg_sample_std_dev")


class AggregateMetricsMixin:
    """The metric hooks of resources servers and agents."""

    def compute_metrics(self, tasks: Tasks) -> dict[str, Any]:
        """Metrics over every verify response, grouped by task (``tasks[i]`` holds task i's rollouts); merged into ``agent_metrics``."""
        return {}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        """The headline metrics; by default every ``mean/...`` entry."""
        return mean_metrics(agent_metrics)


def mean_metrics(agent_metrics: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in agent_metrics.items() if key.startswith("mean/")}


def numeric_fields(row: dict[str, Any]) -> dict[str, float]:
    """A row's numbers (booleans as 0/1), its ``response.usage`` counts included; the index keys left out."""
    response = row.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    fields = {**row, **(usage if isinstance(usage, dict) else {})}
    return {
        key: float(value)
        for key, value in fields.items()
        if isinstance(value, (bool, int, float)) and key not in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME)
    }


def describe(rows: list[dict[str, Any]]) -> dict[str, float]:
    columns: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in numeric_fields(row).items():
            columns[key].append(value)
    described: dict[str, float] = {}
    for key, values in columns.items():
        described |= {
            f"mean/{key}": statistics.fmean(values),
            f"max/{key}": max(values),
            f"min/{key}": min(values),
            f"median/{key}": statistics.median(values),
            f"std/{key}": statistics.stdev(values) if len(values) > 1 else 0.0,
        }
    return described


def group_by_task(verify_responses: list[dict[str, Any]]) -> Tasks:
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in verify_responses:
        groups[row.get(TASK_INDEX_KEY_NAME, 0)].append(row)
    return [groups[index] for index in sorted(groups)]


def compute_aggregate_metrics(
    verify_responses: list[dict[str, Any]],
    compute_metrics_fn: Callable[[Tasks], dict[str, Any]] | None = None,
    get_key_metrics_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> AggregateMetrics:
    if not verify_responses:
        return AggregateMetrics()
    tasks = group_by_task(verify_responses)
    group_level = [{TASK_INDEX_KEY_NAME: rows[0].get(TASK_INDEX_KEY_NAME, 0), **describe(rows)} for rows in tasks]
    agent_metrics: dict[str, Any] = describe(verify_responses)
    if compute_metrics_fn is not None:
        custom = dict(compute_metrics_fn(tasks))
        # Upstream's contract: ``per_task_metrics`` rows join the group-level row of their task index.
        per_task = {row[TASK_INDEX_KEY_NAME]: row for row in custom.pop("per_task_metrics", None) or []}
        for group in group_level:
            group.update(per_task.get(group[TASK_INDEX_KEY_NAME], {}))
        agent_metrics |= custom
    key_metrics = (get_key_metrics_fn or mean_metrics)(agent_metrics)
    rewards = [float(row.get("reward", 0.0)) for row in verify_responses]
    return AggregateMetrics(
        group_level_metrics=group_level,
        agent_metrics=agent_metrics,
        key_metrics=key_metrics,
        num_episodes=len(rewards),
        mean_reward=statistics.fmean(rewards),
        reward_counts=dict(sorted(Counter(str(reward) for reward in rewards).items())),
    )


def pass_at_k(scores: list[float], k: int) -> float:
    """Chance that k of the task's rollouts include a success (binary scores), or the best of the first k."""
    if all(score in (0, 1) for score in scores):
        failures = sum(1 for score in scores if not score)
        return 1.0 if failures < k else 1.0 - math.comb(failures, k) / math.comb(len(scores), k)
    return max(scores[:k])


def majority_at_k(answers: list[Any], scores: list[float]) -> float:
    """The score of the most common answer among the first k (ties averaged); 0 when none answered."""
    votes = Counter((answer, score) for answer, score in zip(answers, scores) if answer is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [score for (_, score), count in votes.items() if count == top]
    return sum(tied) / len(tied)


def percent(values: list[float]) -> float:
    return 100.0 * sum(values) / len(values)


def compute_pass_majority_metrics(
    tasks: Tasks, score_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None, answer_key: str | None = None
) -> tuple[dict[str, Any], list[list[dict[str, float]]], list[str], int]:
    """``pass@k/<score>``, ``pass@1[avg-of-k]/<score>`` and (with ``answer_key``) ``majority@k/<score>``
    and the ``no_answer`` rate, in percent, for every k up to the most rollouts of a task; plus the
    spread of pass@1 across runs. Returns (metrics, per-rollout scores, score names, largest k).

    ``score_fn`` maps a rollout to named scores (default ``{"accuracy": reward}``).
    """
    if not tasks:
        return {}, [], [], 0
    score_fn = score_fn or (lambda row: {"accuracy": row["reward"]})
    scores: list[list[dict[str, float]]] = []
    for rollouts in tasks:
        task_scores = []
        for row in rollouts:
            named = {name: float(value) for name, value in score_fn(row).items()}
            if answer_key is not None:
                named["no_answer"] = float(row.get(answer_key) is None)
            task_scores.append(named)
        scores.append(task_scores)
    names = sorted({name for task_scores in scores for named in task_scores for name in named})
    max_k = max(len(rollouts) for rollouts in tasks)
    metrics: dict[str, Any] = {}
    for k in range(1, max_k + 1):
        for name in names:
            per_task = [[named[name] for named in task_scores if name in named] for task_scores in scores]
            passed = [pass_at_k(values, k) for values in per_task if len(values) >= k]
            if passed:
                metrics[f"pass@{k}/{name}"] = percent(passed)
            averaged = [statistics.fmean(values[:k]) for values in per_task if values]
            if averaged:
                metrics[f"pass@1[avg-of-{k}]/{name}"] = percent(averaged)
            if answer_key is not None:
                voted = [
                    majority_at_k([row.get(answer_key) for row in rollouts[:k]], [named.get(name, 0.0) for named in task_scores[:k]])
                    for rollouts, task_scores in zip(tasks, scores)
                ]
                metrics[f"majority@{k}/{name}"] = percent(voted)
    runs = {
        name: [
            percent(run)
            for index in range(max_k)
            if (run := [task_scores[index][name] for task_scores in scores if index < len(task_scores) and name in task_scores[index]])
        ]
        for name in names
    }
    metrics["per_sample_aggregate"] = {name: values for name, values in runs.items() if values}
    for k in range(2, max_k + 1):
        for name, values in runs.items():
            if len(values[:k]) >= 2:
                spread = statistics.stdev(values[:k])
                metrics[f"pass@1[avg-of-{k}]/{name}/std_dev_across_runs"] = spread
                metrics[f"pass@1[avg-of-{k}]/{name}/std_err_across_runs"] = spread / math.sqrt(len(values[:k]))
    return metrics, scores, names, max_k


def add_avg_sample_std_dev(metrics: dict[str, Any], all_score_dicts: list[list[dict[str, float]]], score_names: list[str], max_k: int) -> None:
    """Add ``pass@1[avg-of-k]/<score>/avg_sample_std_dev`` to ``metrics`` for each k from 2: the mean, over
    the tasks with two or more of their first k scores, of those scores' sample standard deviation (the
    spread within a task, beside ``std_dev_across_runs``, the spread between runs)."""
    for k in range(2, max_k + 1):
        for name in score_names:
            spreads = [statistics.stdev(values) for task_scores in all_score_dicts if len(values := [named[name] for named in task_scores[:k] if name in named]) >= 2]
            if spreads:
                metrics[f"pass@1[avg-of-{k}]/{name}/avg_sample_std_dev"] = statistics.fmean(spreads)


def compute_subset_metrics(
    tasks: Tasks,
    subset_key: str,
    score_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    answer_key: str | None = None,
) -> dict[str, Any]:
    """``compute_pass_majority_metrics`` per value of ``subset_key`` (read from a task's first rollout), keys prefixed ``<value>/``."""
    subsets: dict[Any, Tasks] = defaultdict(list)
    for rollouts in tasks:
        if rollouts and rollouts[0].get(subset_key):
            subsets[rollouts[0][subset_key]].append(rollouts)
    metrics: dict[str, Any] = {}
    for subset, subset_tasks in subsets.items():
        computed = compute_pass_majority_metrics(subset_tasks, score_fn=score_fn, answer_key=answer_key)[0]
        metrics |= {f"{subset}/{key}": value for key, value in computed.items() if key != "per_sample_aggregate"}
    return metrics


def highest_k_metrics(
    agent_metrics: dict[str, Any],
    pattern: str,
    score_names: list[str] | None = None,
    exclude_names: list[str] | None = None,
) -> dict[str, Any]:
    """The entries matching ``pattern`` (``{k}`` stands for k, e.g. ``"pass@{k}"``) at the largest k, spread statistics left out."""
    regex = re.compile("^" + re.escape(pattern).replace(r"\{k\}", r"(\d+)") + "/(.+)$")
    found: list[tuple[int, str]] = []
    for key in agent_metrics:
        match = regex.match(key)
        if match is None or match.group(2).endswith(STAT_SUFFIXES):
            continue
        name = match.group(2)
        if (score_names is not None and name not in score_names) or (exclude_names is not None and name in exclude_names):
            continue
        found.append((int(match.group(1)), key))
    if not found:
        return {}
    top = max(k for k, _ in found)
    return {key: agent_metrics[key] for k, key in found if k == top}
