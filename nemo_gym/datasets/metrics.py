"""The statistics of a task dataset that upstream's data preparation writes beside it (``<name>_metrics.json``):
number of examples, tools, turns, temperature and JSON words of each row's request, and of its other fields."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from typing import Any

from pydantic import ValidationError

from nemo_gym.base_resources_server import BaseRunRequest

REQUEST_FIELDS = ("responses_create_params", "response")


def rounded(value: float) -> float:
    return round(value, 2) if abs(value) >= 1 else round(value, 3)


def summary(values: list[float]) -> dict[str, Any]:
    """Upstream's five numbers of a column, under its names."""
    count = len(values)
    return {
        "Total # non-null values": count,
        "Average": rounded(statistics.fmean(values)) if count else 0.0,
        "Min": rounded(min(values)) if count else 0.0,
        "Max": rounded(max(values)) if count else 0.0,
        "Standard deviation": rounded(statistics.stdev(values)) if count > 1 else 0.0,
    }


def request_columns(row: Any) -> dict[str, float] | None:
    """A valid task row's request numbers (tools, user turns, temperature, JSON words); None for a row that is not one."""
    try:
        params = BaseRunRequest.model_validate(row).responses_create_params.model_dump(exclude_unset=True)
    except ValidationError:
        return None
    inputs = params.get("input")
    inputs = [{"role": "user", "content": inputs}] if isinstance(inputs, str) else inputs or []
    turns = sum(1 for item in inputs if isinstance(item, dict) and item.get("role") == "user")
    columns = {"Json-dumped number of words (proxy for token count)": float(len(json.dumps(params).split()))}
    if params.get("tools") is not None:
        columns["Number of tools"] = float(len(params["tools"]))
    if turns:
        columns["Number of turns"] = float(turns)
    if params.get("temperature") is not None:
        columns["Temperature"] = float(params["temperature"])
    return columns


def other_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows' other fields (lists count each item): numbers summarised, strings counted."""
    numbers: dict[str, list[float]] = {}
    strings: dict[str, Counter] = {}
    for row in rows:
        for key, value in row.items():
            if key in REQUEST_FIELDS:
                continue
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, (bool, int, float)):
                    numbers.setdefault(key, []).append(float(item))
                elif isinstance(item, str):
                    strings.setdefault(key, Counter())[item] += 1
    return {key: summary(values) for key, values in numbers.items()} | {
        key: {"unique_count": len(counts), "total_count": sum(counts.values())} for key, counts in strings.items()
    }


def request_metrics(columns: list[dict[str, float]]) -> dict[str, Any]:
    names = ["Number of tools", "Json-dumped number of words (proxy for token count)", "Number of turns", "Temperature"]
    return {"Number of examples": len(columns), **{name: summary([row[name] for row in columns if name in row]) for name in names}}
