"""Aggregate metrics of finished rollouts, asked of each agent that ran them, as upstream writes them:
``<output stem>_aggregate_metrics.json``, a list of ``{agent_ref, agent_metrics, key_metrics, group_level_metrics}``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_gym.client.reading import ReadingClient
from nemo_gym.global_config import AGENT_REF_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

# Heavy fields a row loses before it is sent; its response keeps only ``usage``.
HEAVY_FIELDS = frozenset({"response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture", "ng_trajectory"})


def rollout_order(row: dict[str, Any]) -> tuple:
    """Sort key: by task, then rollout; rows without the indices last."""
    task, rollout = row.get(TASK_INDEX_KEY_NAME), row.get(ROLLOUT_INDEX_KEY_NAME)
    return (task is None, task if task is not None else 0, rollout is None, rollout if rollout is not None else 0)


def agent_of(row: dict[str, Any], default: str | None) -> str | None:
    """The agent a rollout names in ``agent_ref``, else ``default``."""
    reference = row.get(AGENT_REF_KEY_NAME)
    return (reference.get("name") if isinstance(reference, dict) else None) or default


def stripped(row: dict[str, Any]) -> dict[str, Any]:
    entry = {key: value for key, value in row.items() if key not in HEAVY_FIELDS}
    usage = (row.get("response") or {}).get("usage") if isinstance(row.get("response"), dict) else None
    if usage:
        entry["response"] = {"usage": usage}
    return entry


async def metrics_by_agent(client: ReadingClient, results: list[dict[str, Any]], agents: list[str]) -> list[dict[str, Any]]:
    """One entry per agent: its ``/aggregate_metrics`` over the rollouts that name it. Rows naming no agent count
    under the only agent of ``agents`` (without one, they are left out, as upstream leaves them out); a row naming
    an agent not in ``agents`` is an error."""
    default = agents[0] if len(agents) == 1 else None
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for row in results:
        if (name := agent_of(row, default)) is not None:
            by_agent.setdefault(name, []).append(stripped(row))
    unknown = sorted(set(by_agent) - set(agents))
    if unknown:
        raise ValueError(f"the rollouts name agents {unknown} that the servers do not have; their agents: {agents}")
    entries = []
    for name, rows in by_agent.items():
        reply = await client.post(name, "/aggregate_metrics", json={"verify_responses": rows})
        if not reply.ok or not isinstance(reply.body, dict):
            raise ValueError(f"{name}/aggregate_metrics answered {reply.status}: {reply.text}")
        entries.append({AGENT_REF_KEY_NAME: {"name": name}, **{key: reply.body.get(key) for key in ("agent_metrics", "key_metrics", "group_level_metrics")}})
        print(f"\nKey metrics for {name}:\n" + json.dumps(reply.body.get("key_metrics"), indent=4))
    return entries


def write_agent_metrics(output: str | Path, entries: list[dict[str, Any]]) -> Path:
    """Write the entries beside ``output`` as ``<stem>_aggregate_metrics.json``; returns that path."""
    output = Path(output)
    path = output.with_name(f"{output.stem}_aggregate_metrics.json")
    path.write_text(json.dumps(entries, indent=2) + "\n")
    return path
