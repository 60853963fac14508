"""Re-verification of stored rollouts (upstream's ``gym eval reverify``): each rollout's response, joined to its
materialized input row by task and rollout index, goes to ``/verify`` of its agent's resources server again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.client.reading import ReadingClient
from nemo_gym.config import Instance
from nemo_gym.global_config import AGENT_REF_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.client.rollouts import read_jsonl

# Modes under which /verify may not give the stored rollout's reward again (the session state is gone).
UNSAFE_MODES = ("unknown", "unsupported")
FAILURE_CLASS_KEY = "_ng_failure_class"


def key_of(row: dict[str, Any], path: Path, number: int) -> tuple[Any, Any]:
    if not isinstance(row, dict) or TASK_INDEX_KEY_NAME not in row or ROLLOUT_INDEX_KEY_NAME not in row:
        raise ValueError(f"{path}:{number}: a row needs {TASK_INDEX_KEY_NAME} and {ROLLOUT_INDEX_KEY_NAME}")
    return row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]


def verify_payloads(inputs: Path, rollouts: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The input row of each rollout with the rollout's ``response``; the first ``limit`` rollouts only."""
    by_key = {key_of(row, inputs, number): row for number, row in read_jsonl(inputs)}
    payloads = []
    for number, rollout in read_jsonl(rollouts):
        if limit is not None and len(payloads) >= limit:
            break
        key = key_of(rollout, rollouts, number)
        if key not in by_key:
            raise ValueError(f"{rollouts}:{number}: no materialized input row for the rollout of task {key[0]}, rollout {key[1]} in {inputs}")
        payloads.append({**by_key[key], "response": rollout.get("response")})
    return payloads


@dataclass
class Routes:
    """Agent name -> the resources server it verifies with; ``default`` takes the rows the mapping does not place:
    every row when the config has no agent (and one resources server), else the rows naming no agent when all agents share one."""

    by_agent: dict[str, str]
    default: str | None

    def server_for(self, row: dict[str, Any]) -> str:
        reference = row.get(AGENT_REF_KEY_NAME)
        agent = reference.get("name") if isinstance(reference, dict) else None
        if agent in self.by_agent:
            return self.by_agent[agent]
        if self.default is not None and (agent is None or not self.by_agent):
            return self.default
        where = f"task {row.get(TASK_INDEX_KEY_NAME)}, rollout {row.get(ROLLOUT_INDEX_KEY_NAME)}"
        raise ValueError(f"reverify: the rollout of {where} names agent {agent!r}; the config's agents are {sorted(self.by_agent)}")

    def servers(self) -> set[str]:
        return set(self.by_agent.values()) | ({self.default} if self.default else set())


def routes_of(instances: dict[str, Instance]) -> Routes:
    by_agent = {
        name: instance.settings["resources_server"]["name"]
        for name, instance in instances.items()
        if instance.server_type == "responses_api_agents" and isinstance(instance.settings.get("resources_server"), dict)
    }
    if by_agent:
        shared = set(by_agent.values())
        return Routes(by_agent, shared.pop() if len(shared) == 1 else None)
    servers = [name for name, instance in instances.items() if instance.server_type == "resources_servers"]
    if len(servers) != 1:
        raise ValueError(f"reverify: no agent names its resources server, and the config has {len(servers)} resources servers: {servers}")
    return Routes({}, servers[0])


async def unsafe_servers(client: ReadingClient, servers: set[str]) -> list[str]:
    """The resources servers whose ``GET /reverify_mode`` is unknown or unsupported."""
    unsafe = []
    for name in sorted(servers):
        reply = await client.get(name, "/reverify_mode")
        if not reply.ok:
            raise ValueError(f"{name}/reverify_mode answered {reply.status}: {reply.text}")
        if reply.body in UNSAFE_MODES:
            unsafe.append(name)
    return unsafe


async def reverify(client: ReadingClient, payloads: list[dict[str, Any]], routes: Routes, concurrency: int | None) -> list[dict[str, Any]]:
    """Each payload's ``/verify`` result, stamped with its indices and agent; a refused one raises, naming it."""
    gate = asyncio.Semaphore(concurrency or len(payloads) or 1)

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        server = routes.server_for(row)
        async with gate:
            reply = await client.post(server, "/verify", json=row)
        if not reply.ok or not isinstance(reply.body, dict):
            raise ValueError(f"{server}/verify answered {reply.status} for task {row.get(TASK_INDEX_KEY_NAME)}, rollout {row.get(ROLLOUT_INDEX_KEY_NAME)}: {reply.text}")
        stamps = {key: row[key] for key in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, AGENT_REF_KEY_NAME) if key in row}
        return {**reply.body, **stamps}

    return list(await asyncio.gather(*(one(row) for row in payloads)))


def output_paths(output: str | Path, prefix: str, overwrite: bool, resume: bool) -> tuple[Path, Path]:
    """The results file and its ``_failures.jsonl`` sidecar (``prefix`` before each name). Existing ones are kept to
    be added to with ``resume``, deleted with ``overwrite``, and an error otherwise."""
    output = Path(output)
    output = output.with_name(prefix + output.name)
    failures = output.with_name(f"{output.stem}_failures.jsonl")
    for path in (output, failures):
        if path.exists() and not resume:
            if not overwrite:
                raise ValueError(f"output file already exists: '{path}'. Pass --overwrite to delete it and start fresh, or --resume to continue it")
            path.unlink()
    return output, failures


def done_rows(output: Path) -> list[dict[str, Any]]:
    """The results a previous run wrote (none when there is no file)."""
    return [row for _, row in read_jsonl(output)] if output.exists() else []


def not_done(payloads: list[dict[str, Any]], done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The payloads whose task and rollout no result in ``done`` has."""
    keys = {(row.get(TASK_INDEX_KEY_NAME), row.get(ROLLOUT_INDEX_KEY_NAME)) for row in done}
    return [row for row in payloads if (row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]) not in keys]
