"""Drive episodes through an agent's ``/run`` and summarise their rewards."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

from nemo_gym.client.reading import ReadingClient


def read_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file; a line that is not JSON is an error naming it."""
    with open(path) as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON: {error}") from None


def read_rows(path: str | Path, limit: int | None = None, num_repeats: int = 1) -> list[dict[str, Any]]:
    """Task rows from a JSONL file; a line that is not a JSON object is an error naming the line."""
    rows = []
    for number, row in read_jsonl(path):
        if not isinstance(row, dict) or "responses_create_params" not in row:
            raise ValueError(f"{path}:{number}: a task row is a JSON object with responses_create_params")
        rows.append(row)
    rows = rows[:limit] if limit else rows
    return [row for row in rows for _ in range(num_repeats)]


async def run_episode(client: ReadingClient, agent: str, row: dict[str, Any]) -> dict[str, Any]:
    """One episode through ``/run``. A failed episode is recorded with reward 0.0 and its error.

    An agent that cannot be reached (refused, reset, timed out) is such a failure too, with status
    None, so one lost connection costs one episode, not the whole run.
    """
    try:
        reply = await client.post(agent, "/run", json=row)
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        return {**row, "reward": 0.0, "error": {"status": None, "detail": f"{agent}/run: {type(error).__name__}: {error}"}}
    if reply.ok and isinstance(reply.body, dict):
        return reply.body
    return {**row, "reward": 0.0, "error": {"status": reply.status, "detail": reply.text}}


async def run_episodes(
    client: ReadingClient, agent: str, rows: Iterable[dict[str, Any]], concurrency: int, progress: bool = True
) -> list[dict[str, Any]]:
    rows = list(rows)
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(rows), desc="episodes", disable=not progress)

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            result = await run_episode(client, agent, row)
        bar.update()
        return result

    try:
        return await asyncio.gather(*(one(row) for row in rows))
    finally:
        bar.close()


def write_results(path: str | Path, results: list[dict[str, Any]], metrics: dict[str, Any]) -> Path:
    """Write rollouts as JSONL and the aggregate metrics as JSON beside them; returns the metrics path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as file:
        for result in results:
            file.write(json.dumps(result) + "\n")
    metrics_path = path.with_name(f"{path.stem}_aggregate_metrics.json")
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics_path
