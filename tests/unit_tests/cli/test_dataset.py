"""`gym dataset render|collate` on local files, as upstream's `gym dataset` does; its hub commands say they are
not available here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from nemo_gym.cli.main import main


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_gym_dataset_render_fills_the_prompt_template_into_each_rows_input(tmp_path, capsys):
    write_jsonl(tmp_path / "raw.jsonl", [{"question": "2+2?", "responses_create_params": {"temperature": 0.5}}])
    (tmp_path / "prompt.yaml").write_text(yaml.safe_dump({"system": "Be brief.", "user": "Q: {question}"}))
    arguments = ["dataset", "render", "-i", str(tmp_path / "raw.jsonl"), "--prompt-config", str(tmp_path / "prompt.yaml"), "-o", str(tmp_path / "out" / "rendered.jsonl")]
    assert main(arguments) == 0
    [row] = read_jsonl(tmp_path / "out" / "rendered.jsonl")
    assert row["responses_create_params"] == {"temperature": 0.5, "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 2+2?"}]}
    assert row["prompt_config_used"] == str(tmp_path / "prompt.yaml")


def agent_config(tmp_path: Path, datasets: list[dict]) -> Path:
    config = {"math_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py", "datasets": datasets}}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


ROWS = [
    {"responses_create_params": {"input": "1+1?", "temperature": 1.0, "tools": [{"type": "function", "name": "calc", "parameters": {}, "strict": True}]}, "answer": 2, "topic": "sum"},
    {"responses_create_params": {"input": [{"role": "user", "content": "2*3?"}, {"role": "user", "content": "show work"}], "temperature": 0.5}, "answer": 6, "topic": "product"},
]


def test_gym_dataset_collate_writes_each_types_rows_with_the_agent_ref_of_the_agent_that_declared_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data" / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "data" / "validation.jsonl", ROWS[:1])
    datasets = [
        {"name": "math_train", "type": "train", "jsonl_fpath": "data/train.jsonl", "license": "MIT", "num_repeats": 2},
        {"name": "math_validation", "type": "validation", "jsonl_fpath": "data/validation.jsonl", "license": "MIT"},
    ]
    config = agent_config(tmp_path, datasets)
    assert main(["dataset", "collate", "--config", str(config), "--mode", "train_preparation", "--output-dir", "prepared"]) == 0
    train = read_jsonl(tmp_path / "prepared" / "train.jsonl")
    assert [row["answer"] for row in train] == [2, 2, 6, 6]
    assert all(row["agent_ref"] == {"type": "responses_api_agents", "name": "math_agent"} for row in train)
    assert [row["answer"] for row in read_jsonl(tmp_path / "prepared" / "validation.jsonl")] == [2]


def test_gym_dataset_collate_writes_upstreams_statistics_beside_each_dataset_and_per_type(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data" / "example.jsonl", [*ROWS, {"not": "a task row"}])
    config = agent_config(tmp_path, [{"name": "math_example", "type": "example", "jsonl_fpath": "data/example.jsonl"}])
    assert main(["dataset", "collate", "--config", str(config), "--mode", "example_validation", "--output-dir", "prepared"]) == 0
    metrics = json.loads((tmp_path / "data" / "example_metrics.json").read_text())
    assert metrics["name"] == "math_example" and metrics["Number of examples"] == 2
    assert metrics["Number of tools"] == {"Total # non-null values": 1, "Average": 1.0, "Min": 1.0, "Max": 1.0, "Standard deviation": 0.0}
    assert metrics["Number of turns"] == {"Total # non-null values": 2, "Average": 1.5, "Min": 1.0, "Max": 2.0, "Standard deviation": 0.707}
    assert metrics["Temperature"]["Average"] == 0.75
    assert metrics["answer"] == {"Total # non-null values": 2, "Average": 4.0, "Min": 2.0, "Max": 6.0, "Standard deviation": 2.83}
    assert metrics["topic"] == {"unique_count": 2, "total_count": 2}
    assert json.loads((tmp_path / "prepared" / "example_metrics.json").read_text())["Number of examples"] == 2


def test_gym_dataset_collate_refuses_metrics_that_disagree_with_the_rows_unless_told_to_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data" / "example.jsonl", ROWS)
    (tmp_path / "data" / "example_metrics.json").write_text(json.dumps({"Number of examples": 99}))
    config = agent_config(tmp_path, [{"name": "math_example", "type": "example", "jsonl_fpath": "data/example.jsonl"}])
    arguments = ["dataset", "collate", "--config", str(config), "--mode", "example_validation", "--output-dir", "prepared"]
    assert main(arguments) == 2
    assert "holds other metrics than these rows give" in capsys.readouterr().err
    assert main([*arguments, "--overwrite-metrics-conflicts"]) == 0
    assert json.loads((tmp_path / "data" / "example_metrics.json").read_text())["Number of examples"] == 2


def test_gym_dataset_collate_names_a_missing_dataset_and_download_is_not_available_here(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = agent_config(tmp_path, [{"name": "math_train", "type": "train", "jsonl_fpath": "data/train.jsonl", "license": "MIT"}])
    arguments = ["dataset", "collate", "--config", str(config), "--mode", "train_preparation", "--output-dir", "prepared"]
    assert main(arguments) == 2
    assert "missing local datasets (download is off): math_agent: math_train (train)" in capsys.readouterr().err
    assert main([*arguments, "--download"]) == 2
    assert "downloading datasets is not available here: it needs the Hugging Face hub or NVIDIA's GitLab" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["upload", "download", "rm", "migrate"])
def test_gym_dataset_hub_commands_say_they_are_not_available_here_and_why(command, capsys):
    assert main(["dataset", command, "--name", "x"]) == 2
    error = capsys.readouterr().err
    assert f"gym dataset {command} is not available here" in error and "over the network" in error


def test_upstreams_ng_prepare_data_and_ng_materialize_prompts_invocations_run_unchanged(tmp_path, monkeypatch):
    from nemo_gym.cli import aliases

    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data" / "example.jsonl", ROWS)
    config = agent_config(tmp_path, [{"name": "math_example", "type": "example", "jsonl_fpath": "data/example.jsonl"}])
    monkeypatch.setattr("sys.argv", ["ng_prepare_data", f"+config_paths=[{config}]", "+output_dirpath=prepared", "+mode=example_validation"])
    assert aliases.main() == 0
    assert len(read_jsonl(tmp_path / "prepared" / "example.jsonl")) == 2
    write_jsonl(tmp_path / "raw.jsonl", [{"question": "2+2?"}])
    (tmp_path / "prompt.yaml").write_text(yaml.safe_dump({"user": "Q: {question}"}))
    monkeypatch.setattr("sys.argv", ["nemo_gym_materialize_prompts", "+input_jsonl_fpath=raw.jsonl", "+prompt_config=prompt.yaml", "+output_jsonl_fpath=rendered.jsonl"])
    assert aliases.main() == 0
    assert read_jsonl(tmp_path / "rendered.jsonl")[0]["responses_create_params"]["input"] == [{"role": "user", "content": "Q: 2+2?"}]
