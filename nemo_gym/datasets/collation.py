"""Upstream's data preparation (``gym dataset collate``): the datasets the agents of a config declare, checked row
by row, their statistics written beside each, and every dataset of a type collated into ``<output>/<type>.jsonl``
with the ``agent_ref`` of the agent that declared it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.config import is_instance
from nemo_gym.config.files import ConfigError, find_file, instance_kind
from nemo_gym.config_types import DatasetConfig
from nemo_gym.datasets import MODES
from nemo_gym.datasets.metrics import other_fields, request_columns, request_metrics
from nemo_gym.global_config import AGENT_REF_KEY_NAME
from nemo_gym.prompt import apply_prompt_to_row, load_prompt_config, validate_prompt_compatibility

UNAVAILABLE = "downloading datasets is not available here: it needs the Hugging Face hub or NVIDIA's GitLab, over the network"


@dataclass
class AgentDataset:
    agent: str
    dataset: DatasetConfig
    path: Path


def datasets_in_scope(data: dict[str, Any], roots: list[Path], mode: str) -> list[AgentDataset]:
    """The datasets of the mode's types, of every agent instance, each with its file found as config files are."""
    found = []
    for name, body in data.items():
        if not is_instance(str(name), body) or (instance_kind(body) or ("",))[0] != "responses_api_agents":
            continue
        settings = next(iter(body["responses_api_agents"].values())) or {}
        for item in settings.get("datasets") or []:
            dataset = DatasetConfig.model_validate(item)
            if dataset.type in MODES[mode]:
                found.append(AgentDataset(str(name), dataset, find_file(dataset.jsonl_fpath, roots)))
    return found


def check_present(datasets: list[AgentDataset], download: bool) -> None:
    missing = [f"{item.agent}: {item.dataset.name} ({item.dataset.type}) at {item.path}" for item in datasets if not item.path.is_file()]
    if missing and download:
        raise ConfigError(f"{UNAVAILABLE}; missing: {'; '.join(missing)}")
    if missing:
        raise ConfigError(f"missing local datasets (download is off): {'; '.join(missing)}")


def rows_of(item: AgentDataset) -> list[Any]:
    """The file's rows, each ``num_repeats`` times in a row (abc -> aabbcc); a line that is not a JSON object is an error naming it."""
    rows = []
    for number, line in enumerate(item.path.read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"{item.path}:{number}: not valid JSON: {error}") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{item.path}:{number}: a row is a JSON object")
            rows += [row] * item.dataset.num_repeats
    return rows


def metrics_of(item: AgentDataset, rows: list[Any]) -> tuple[dict[str, Any], list[int]]:
    """The dataset's metrics (its config first) and the indices of the rows that are not task rows."""
    columns = [request_columns(row) for row in rows]
    valid = [row for row, column in zip(rows, columns) if column is not None]
    metrics = item.dataset.model_dump(mode="json") | request_metrics([c for c in columns if c is not None]) | other_fields(valid)
    return metrics, [index for index, column in enumerate(columns) if column is None]


def write_metrics(path: Path, metrics: dict[str, Any], overwrite_conflicts: bool) -> None:
    """Write the metrics, unless the file holds others already: then it is an error unless ``overwrite_conflicts``."""
    if path.exists() and json.loads(path.read_text()) != metrics and not overwrite_conflicts:
        raise ConfigError(f"{path} holds other metrics than these rows give; delete it and run again, or pass --overwrite-metrics-conflicts")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=4))


def prepared_row(row: dict[str, Any], item: AgentDataset) -> dict[str, Any]:
    if item.dataset.type == "benchmark" and item.dataset.prompt_config:
        template = load_prompt_config(item.dataset.prompt_config)
        validate_prompt_compatibility([row], template)
        row = apply_prompt_to_row(row, template)
    return {**row, AGENT_REF_KEY_NAME: {"type": "responses_api_agents", "name": item.agent}}


def collate(data: dict[str, Any], roots: list[Path], mode: str, output_dir: Path, download: bool = False, overwrite_conflicts: bool = False) -> dict[str, Path]:
    """Check, measure and collate; returns the collated file of each dataset type."""
    datasets = datasets_in_scope(data, roots, mode)
    if not datasets:
        raise ConfigError(f"no agent of the config declares a dataset of the types {mode} takes: {', '.join(MODES[mode])}")
    check_present(datasets, download)
    by_type: dict[str, list[tuple[AgentDataset, list[Any], dict[str, Any]]]] = {}
    for item in datasets:
        rows = rows_of(item)
        metrics, offending = metrics_of(item, rows)
        if offending:
            print(f"{item.path}: {len(offending)} rows are not task rows (left out of the metrics): {offending}")
        write_metrics(item.path.with_name(f"{item.path.stem}_metrics.json"), metrics, overwrite_conflicts)
        by_type.setdefault(item.dataset.type, []).append((item, rows, metrics))
    output_dir.mkdir(parents=True, exist_ok=True)
    collated = {}
    for kind, entries in by_type.items():
        valid = [(row, column) for _, rows, _ in entries for row in rows if (column := request_columns(row)) is not None]
        metrics = entries[0][0].dataset.model_dump(mode="json") | request_metrics([column for _, column in valid])
        metrics |= {key: value for key, value in entries[-1][2].items() if key not in metrics}
        write_metrics(output_dir / f"{kind}_metrics.json", metrics, overwrite_conflicts)
        collated[kind] = output_dir / f"{kind}.jsonl"
        with open(collated[kind], "w") as file:
            file.writelines(json.dumps(prepared_row(row, item)) + "\n" for item, rows, _ in entries for row in rows)
    return collated
