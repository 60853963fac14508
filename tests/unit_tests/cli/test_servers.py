"""`gym list <kind> [NAME]`: upstream's component listings (benchmarks, environments, agents, models,
resources-servers) from the configs in the search roots, as a table, as JSON, or one component inspected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nemo_gym.cli.main import main


def write_yaml(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A search root with a resources server in two flavors plus a helper config, an agent, a model, a benchmark and an environment."""
    server = {"resources_servers": {"word_count": {"entrypoint": "app.py", "domain": "knowledge", "description": "counts words"}}}
    write_yaml(tmp_path / "resources_servers" / "word_count" / "configs" / "word_count.yaml", {"word_count": server})
    write_yaml(tmp_path / "resources_servers" / "word_count" / "configs" / "strict.yaml", {"word_count": {"resources_servers": {"word_count": {"entrypoint": "app.py", "domain": "knowledge", "description": "strict counting"}}}})
    write_yaml(tmp_path / "resources_servers" / "word_count" / "configs" / "judge.yaml", {"judge": {"responses_api_models": {"vllm_model": {"entrypoint": "app.py"}}}})
    write_yaml(tmp_path / "responses_api_agents" / "loop_agent" / "configs" / "loop_agent.yaml", {"loop": {"responses_api_agents": {"loop_agent": {"entrypoint": "app.py", "description": "loops"}}}})
    write_yaml(tmp_path / "responses_api_models" / "echo_model" / "configs" / "echo_model.yaml", {"echo": {"responses_api_models": {"echo_model": {"entrypoint": "app.py", "description": "echoes"}}}})
    dataset = {"name": "wc_bench", "type": "benchmark", "jsonl_fpath": "benchmarks/wc/data/wc.jsonl", "prepare_script": "benchmarks/wc/prepare.py", "num_repeats": 8}
    write_yaml(tmp_path / "benchmarks" / "wc" / "config.yaml", {
        "wc_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py", "datasets": [dataset]}}},
        "wc_server": {"resources_servers": {"word_count": {"entrypoint": "app.py", "domain": "knowledge", "description": "word counting benchmark"}}},
    })
    write_yaml(tmp_path / "environments" / "wc_env" / "config.yaml", {"wc_env_server": {"resources_servers": {"word_count": {"entrypoint": "app.py", "domain": "games", "description": "an environment"}}}})
    return tmp_path


def listed(kind: str, root: Path, capsys, *extra: str) -> list:
    assert main(["list", kind, *extra, "--json", "--search-dir", str(root)]) == 0
    return json.loads(capsys.readouterr().out)


def test_gym_list_resources_servers_lists_one_entry_per_config_flavor_with_domain_and_description(root, capsys):
    entries = {entry["name"]: entry for entry in listed("resources-servers", root, capsys)}
    assert entries["word_count"] == {"name": "word_count", "domain": "knowledge", "description": "counts words"}
    assert entries["word_count/strict"]["description"] == "strict counting"
    assert "word_count/judge" not in entries
    assert "example_session_state_mgmt" in entries


def test_gym_list_agents_and_models_list_their_configs(root, capsys):
    assert {"name": "loop_agent", "domain": None, "description": "loops"} in listed("agents", root, capsys)
    assert {"name": "echo_model", "domain": None, "description": "echoes"} in listed("models", root, capsys)


def test_gym_list_benchmarks_gives_the_agent_and_repeats_of_each_benchmark(root, capsys):
    [entry] = [entry for entry in listed("benchmarks", root, capsys) if entry["name"] == "wc"]
    assert entry == {"name": "wc", "agent_name": "wc_agent", "domain": "knowledge", "num_repeats": 8, "description": "word counting benchmark"}


def test_gym_list_environments_lists_the_environment_configs(root, capsys):
    assert {"name": "wc_env", "domain": "games", "description": "an environment"} in listed("environments", root, capsys)


def test_gym_list_kind_prints_a_titled_table(root):
    done = subprocess.run([sys.executable, "-m", "nemo_gym.cli.main", "list", "resources-servers", "--search-dir", str(root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Available resources servers in NeMo Gym (")
    assert lines[1].split() == ["Name", "Domain", "Description"]
    assert ["word_count/strict", "knowledge", "strict", "counting"] in [line.split() for line in lines]


def test_gym_list_kind_name_inspects_one_component_with_its_config_and_usage(root, capsys):
    assert main(["list", "resources-servers", "word_count", "--search-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert str(root / "resources_servers" / "word_count" / "configs" / "word_count.yaml") in out
    assert "gym env start --resources-server word_count" in out
    [details] = [listed("benchmarks", root, capsys, "wc")]
    assert details["name"] == "wc" and details["config"] == str(root / "benchmarks" / "wc" / "config.yaml")


def test_gym_list_kind_with_an_unknown_name_suggests_the_close_ones(root, capsys):
    assert main(["list", "resources-servers", "word_cont", "--search-dir", str(root)]) == 2
    assert "no resources server named 'word_cont'; did you mean word_count, word_count/strict?" in capsys.readouterr().err
