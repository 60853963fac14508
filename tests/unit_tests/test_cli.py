"""The command line, for what it checks before it starts anything (process-starting CLI tests are in tests/e2e)."""

from __future__ import annotations

import json
import socket

import pytest

from nemo_gym.cli.env import check_example_data
from nemo_gym.cli.main import main
from nemo_gym.config import REPO_ROOT, free_port

COUNTER = "example_session_state_mgmt"
DATA = REPO_ROOT / "resources_servers" / COUNTER / "data" / "example.jsonl"
CONFIG = REPO_ROOT / "resources_servers" / COUNTER / "configs" / f"{COUNTER}.yaml"


def test_check_example_data_accepts_the_counters_example_rows(capsys):
    assert check_example_data(COUNTER) == 0
    assert "5 of 5 rows match the request models" in capsys.readouterr().out


def test_check_example_data_reports_a_bad_row_by_number_and_field(tmp_path, capsys):
    good, *_ = DATA.read_text().splitlines()
    bad = json.loads(good) | {"expected_count": "three"}
    path = tmp_path / "example.jsonl"
    path.write_text("\n".join([good, json.dumps(bad), good]) + "\n")

    assert check_example_data(COUNTER, path) == 1
    captured = capsys.readouterr()
    assert f"{path}: row 2:" in captured.err
    assert "expected_count" in captured.err
    assert "row 1" not in captured.err and "row 3" not in captured.err
    assert "2 of 3 rows match the request models" in captured.out


def test_env_test_with_an_unknown_resources_server_is_a_clear_error(capsys):
    assert main(["env", "test", "--resources-server", "no_such_environment"]) == 2
    assert "--resources-server: no resources server at" in capsys.readouterr().err


def test_env_start_needs_either_a_config_or_the_shortcut(capsys):
    assert main(["env", "start", "--config", str(CONFIG), "--resources-server", COUNTER]) == 2
    assert "give either --config FILE ... or --resources-server NAME" in capsys.readouterr().err


def test_env_start_with_a_config_typo_names_the_file_and_key_and_starts_nothing(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text(f"counter:\n  resources_servers:\n    {COUNTER}:\n      num_wokers: 2\n")
    assert main(["env", "start", "--config", str(path), "--head-port", str(free_port())]) == 2
    assert f"{path}: counter.resources_servers.{COUNTER}.num_wokers" in capsys.readouterr().err


def test_eval_run_with_a_bad_agent_name_is_a_clear_error_before_any_server_starts(tmp_path, capsys):
    arguments = ["eval", "run", "--config", str(CONFIG), "--agent", "no_such_agent", "--input", str(DATA)]
    assert main([*arguments, "--output", str(tmp_path / "out.jsonl")]) == 2
    message = capsys.readouterr().err
    assert "--agent: no agent named 'no_such_agent'; agents: example_session_state_mgmt_simple_agent" in message
    assert not (tmp_path / "out.jsonl").exists()


def test_eval_run_no_serve_without_a_running_head_is_a_clear_error(tmp_path, capsys):
    head_url = f"http://127.0.0.1:{free_port()}"
    arguments = ["eval", "run", "--no-serve", "--head-url", head_url, "--input", str(DATA)]
    assert main([*arguments, "--output", str(tmp_path / "out.jsonl")]) == 2
    assert f"no Gym head endpoint at {head_url}" in capsys.readouterr().err


def test_eval_run_with_an_input_line_that_is_not_json_names_the_line(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text(DATA.read_text().splitlines()[0] + "\n{oops\n")
    arguments = ["eval", "run", "--resources-server", COUNTER, "--input", str(path)]
    assert main([*arguments, "--output", str(tmp_path / "out.jsonl")]) == 2
    assert f"{path}:2: not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--concurrency", "--num-repeats", "--limit"])
def test_eval_run_counts_must_be_at_least_one(option, tmp_path, capsys):
    arguments = ["eval", "run", "--resources-server", COUNTER, "--input", str(DATA), "--output", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit) as exit_:
        main([*arguments, option, "0"])
    assert exit_.value.code == 2
    assert f"{option}: must be at least 1, got 0" in capsys.readouterr().err


def test_env_start_with_a_head_port_already_in_use_is_a_clear_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["env", "start", "--resources-server", COUNTER, "--head-port", str(port)]) == 2
    assert f"--head-port: port {port} is already in use" in capsys.readouterr().err


def test_env_start_with_a_head_port_that_cannot_be_a_port_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["env", "start", "--resources-server", COUNTER, "--head-port", "70000"])
    assert exit_.value.code == 2
    assert "--head-port: not a TCP port: 70000" in capsys.readouterr().err
