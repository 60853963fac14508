"""Upstream's command names: `ng` is `gym`, and each `ng_*` / `nemo_gym_*` entry point of pyproject.toml
runs the `gym` command it stands for; `gym --version` prints the installed version."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import tomllib
from pathlib import Path

import pytest

from nemo_gym.cli.main import main as gym_main
from nemo_gym.config import free_port

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
# Upstream's alias (prefix dropped) and the `gym` command it is here (upstream's own mapping).
ALIASES = {
    "run": ["env", "start"],
    "test": ["env", "test"],
    "init_resources_server": ["env", "init"],
    "collect_rollouts": ["eval", "run", "--no-serve"],
    "e2e_collect_rollouts": ["eval", "run"],
    "dump_config": ["env", "resolve"],
    "list_benchmarks": ["list", "benchmarks"],
    "prepare_benchmark": ["eval", "prepare"],
    "aggregate_rollouts": ["eval", "aggregate"],
    "reward_profile": ["eval", "profile"],
    "materialize_prompts": ["dataset", "render"],
    "prepare_data": ["dataset", "collate"],
    "upload_dataset_to_gitlab": ["dataset", "upload", "--storage", "gitlab"],
    "download_dataset_from_gitlab": ["dataset", "download", "--storage", "gitlab"],
    "upload_dataset_to_hf": ["dataset", "upload"],
    "download_dataset_from_hf": ["dataset", "download"],
    "gitlab_to_hf_dataset": ["dataset", "migrate"],
    "delete_dataset_from_gitlab": ["dataset", "rm"],
    "validate": ["env", "validate"],
    "status": ["env", "status"],
    "help": [],
    "version": [],
}


def scripts() -> dict[str, str]:
    return tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]


def entry_point(name: str):
    module, attribute = scripts()[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def output_of(function, argv0: str, arguments: list[str], monkeypatch, capsys) -> tuple[object, str]:
    """What a console script prints and exits with, run as its installed wrapper runs it."""
    monkeypatch.setattr(sys, "argv", [argv0, *arguments])
    with pytest.raises(SystemExit) as stop:
        sys.exit(function())
    return stop.value.code, capsys.readouterr().out


def test_the_entry_point_table_has_ng_and_both_prefixes_of_every_alias():
    names = set(scripts())
    assert {"gym", "ng"} <= names
    assert {f"{prefix}{alias}" for prefix in ("ng_", "nemo_gym_") for alias in ALIASES} <= names
    assert scripts()["ng"] == scripts()["gym"]


@pytest.mark.parametrize("alias", sorted(ALIASES))
@pytest.mark.parametrize("prefix", ["ng_", "nemo_gym_"])
def test_each_alias_runs_the_gym_command_it_stands_for(alias, prefix, monkeypatch, capsys):
    tokens = ALIASES[alias]
    flag = ["--version"] if alias == "version" else ["--help"]
    expected = output_of(gym_main, "gym", [*tokens, *flag], monkeypatch, capsys)
    assert expected[0] == 0
    assert output_of(entry_point(prefix + alias), prefix + alias, [] if alias in ("help", "version") else flag, monkeypatch, capsys) == expected


def test_gym_version_prints_the_installed_version(monkeypatch, capsys):
    code, out = output_of(gym_main, "gym", ["--version"], monkeypatch, capsys)
    assert (code, out.strip()) == (0, f"gym {importlib.metadata.version('nemo-gym-multiworker')}")


def test_ng_collect_rollouts_uses_running_servers_and_ng_e2e_collect_rollouts_starts_its_own(tmp_path, monkeypatch, capsys):
    head_url = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "in.jsonl").write_text('{"responses_create_params": {"input": "hi"}}\n')
    arguments = ["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"), "--head-url", head_url]
    for alias, message in (("ng_collect_rollouts", f"no Gym head endpoint at {head_url}"), ("ng_e2e_collect_rollouts", "give either --config")):
        monkeypatch.setattr(sys, "argv", [alias, *arguments])
        assert entry_point(alias)() == 2
        assert message in capsys.readouterr().err


def test_an_alias_with_no_gym_command_here_is_an_error_naming_it(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/ng_reinstall"])
    assert entry_point("ng_run")() == 2
    assert "ng_reinstall: no `gym` command here stands for it" in capsys.readouterr().err


@pytest.mark.parametrize("alias", ["ng_upload_dataset_to_gitlab", "nemo_gym_download_dataset_from_hf", "ng_gitlab_to_hf_dataset", "ng_delete_dataset_from_gitlab"])
def test_the_dataset_hub_aliases_take_upstreams_arguments_and_say_they_are_not_available_here(alias, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [alias, "+dataset_name=my_set", "+input_jsonl_fpath=data/train.jsonl"])
    assert entry_point(alias)() == 2
    assert "is not available here" in capsys.readouterr().err


def test_ng_status_reports_the_servers_of_a_running_head_and_ng_validate_checks_a_config(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ng_status", "--head-url", f"http://127.0.0.1:{free_port()}"])
    assert entry_point("ng_status")() == 0
    assert "No NeMo Gym servers found running." in capsys.readouterr().out
    counter = PYPROJECT.parent / "resources_servers" / "example_session_state_mgmt" / "configs" / "example_session_state_mgmt.yaml"
    monkeypatch.setattr(sys, "argv", ["nemo_gym_validate", "--config", str(counter)])
    assert entry_point("nemo_gym_validate")() == 0
    assert "✓ Config is valid." in capsys.readouterr().out


def test_ng_test_takes_upstreams_entrypoint_override_as_the_server_to_test(tmp_path, monkeypatch, capsys):
    directory = tmp_path / "resources_servers" / "broken_env"
    directory.mkdir(parents=True)
    (directory / "app.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    for form in ("+entrypoint=resources_servers/broken_env", "++entrypoint=resources_servers/broken_env"):
        monkeypatch.setattr(sys, "argv", ["ng_test", form])
        assert entry_point("ng_test")() == 2
        assert f"{directory / 'app.py'}: cannot load a server app from resources_servers.broken_env.app" in capsys.readouterr().err
    assert gym_main(["env", "test"]) == 2
    assert "give --resources-server NAME|DIR (or upstream's +entrypoint=resources_servers/NAME), once" in capsys.readouterr().err


def test_upstreams_config_paths_override_stands_for_config_files(monkeypatch, capsys):
    counter = PYPROJECT.parent / "resources_servers" / "example_session_state_mgmt" / "configs" / "example_session_state_mgmt.yaml"
    monkeypatch.setattr(sys, "argv", ["ng_dump_config", f"+config_paths=[{counter}]"])
    assert entry_point("ng_dump_config")() == 0
    assert "example_session_state_mgmt_simple_agent:" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["ng_validate", f"+config_paths=[{counter}]"])
    assert entry_point("ng_validate")() == 0
    assert "✓ Config is valid." in capsys.readouterr().out
