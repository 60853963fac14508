"""nemo_gym.datasets.collation: the datasets a config's agents declare for a mode, found under the search roots,
read row by row (repeated, malformed lines named), their metrics written once, each row stamped with its agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.config.files import ConfigError
from nemo_gym.config_types import DatasetConfig
from nemo_gym.datasets.collation import AgentDataset, check_present, datasets_in_scope, metrics_of, prepared_row, rows_of, write_metrics

TASK = {"responses_create_params": {"input": "q"}}


def agent(datasets: list[dict]) -> dict:
    return {"responses_api_agents": {"simple_agent": {"datasets": datasets}}}


def item(path: Path, type: str = "example", repeats: int = 1) -> AgentDataset:
    return AgentDataset("agent", DatasetConfig(name="d", type=type, jsonl_fpath=str(path), num_repeats=repeats, license="MIT"), path)


def test_a_mode_takes_its_types_of_dataset_from_agents_only_each_file_found_under_the_roots(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("")
    data = {
        "a1": agent([{"name": "t", "type": "train", "jsonl_fpath": "data/train.jsonl", "license": "MIT"}, {"name": "e", "type": "example", "jsonl_fpath": "data/e.jsonl"}]),
        "server": {"resources_servers": {"x": {"datasets": [{"name": "s", "type": "train", "jsonl_fpath": "s.jsonl", "license": "MIT"}]}}},
        "policy_base_url": "http://x",
    }
    training = datasets_in_scope(data, [tmp_path], "train_preparation")
    assert [(found.agent, found.dataset.name, found.path) for found in training] == [("a1", "t", tmp_path / "data" / "train.jsonl")]
    assert [found.dataset.name for found in datasets_in_scope(data, [tmp_path], "example_validation")] == ["e"]


def test_a_missing_dataset_is_named_and_download_says_it_is_not_available_here(tmp_path):
    missing = [item(tmp_path / "gone.jsonl")]
    with pytest.raises(ConfigError, match=r"missing local datasets \(download is off\): agent: d \(example\) at .*gone.jsonl"):
        check_present(missing, download=False)
    with pytest.raises(ConfigError, match="downloading datasets is not available here"):
        check_present(missing, download=True)
    (tmp_path / "gone.jsonl").write_text("")
    check_present(missing, download=False)


def test_rows_repeat_each_in_place_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"n": 1}\n\n{"n": 2}\n')
    assert rows_of(item(path, repeats=2)) == [{"n": 1}, {"n": 1}, {"n": 2}, {"n": 2}]


@pytest.mark.parametrize("line, says", [("{not json", "not valid JSON"), ("[1, 2]", "a row is a JSON object")])
def test_a_line_that_is_no_json_object_is_an_error_naming_its_file_and_line(tmp_path, line, says):
    path = tmp_path / "d.jsonl"
    path.write_text('{"n": 1}\n' + line + "\n")
    with pytest.raises(ConfigError, match=f"d.jsonl:2: {says}"):
        rows_of(item(path))


def test_the_metrics_start_with_the_datasets_config_and_name_the_rows_that_are_no_tasks(tmp_path):
    metrics, offending = metrics_of(item(tmp_path / "d.jsonl"), [TASK, {"no": "request"}, TASK])
    assert offending == [1]
    assert metrics["name"] == "d" and metrics["Number of examples"] == 2


def test_metrics_are_written_once_and_others_in_their_place_are_refused_unless_overwritten(tmp_path):
    path = tmp_path / "out" / "d_metrics.json"
    write_metrics(path, {"a": 1}, overwrite_conflicts=False)
    write_metrics(path, {"a": 1}, overwrite_conflicts=False)
    with pytest.raises(ConfigError, match="holds other metrics"):
        write_metrics(path, {"a": 2}, overwrite_conflicts=False)
    assert json.loads(path.read_text()) == {"a": 1}
    write_metrics(path, {"a": 2}, overwrite_conflicts=True)
    assert json.loads(path.read_text()) == {"a": 2}


def test_a_prepared_row_names_the_agent_that_declared_its_dataset(tmp_path):
    row = prepared_row({**TASK, "agent_ref": {"name": "stale"}}, item(tmp_path / "d.jsonl"))
    assert row == {**TASK, "agent_ref": {"type": "responses_api_agents", "name": "agent"}}
