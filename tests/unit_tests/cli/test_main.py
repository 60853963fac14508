"""The command line, for what it checks before it starts anything (process-starting CLI tests are in tests/e2e)."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings

from nemo_gym.cli import env as cli_env, eval as cli_eval
from nemo_gym.cli.env import check_example_data
from nemo_gym.cli.main import main
from nemo_gym.config import REPO_ROOT, free_port
from nemo_gym.process.launcher import LaunchError
from tests.hostile_passwords import PASSWORDS, leaked, written_forms

COUNTER = "example_session_state_mgmt"
COUNTER_DIR = REPO_ROOT / "resources_servers" / COUNTER
DATA = COUNTER_DIR / "data" / "example.jsonl"
CONFIG = REPO_ROOT / "resources_servers" / COUNTER / "configs" / f"{COUNTER}.yaml"


def test_check_example_data_accepts_the_counters_example_rows(capsys):
    assert check_example_data(COUNTER_DIR) == 0
    assert "5 of 5 rows match the request models" in capsys.readouterr().out


def test_check_example_data_reports_a_bad_row_by_number_and_field(tmp_path, capsys):
    good, *_ = DATA.read_text().splitlines()
    bad = json.loads(good) | {"expected_count": "three"}
    path = tmp_path / "example.jsonl"
    path.write_text("\n".join([good, json.dumps(bad), good]) + "\n")

    assert check_example_data(COUNTER_DIR, path) == 1
    captured = capsys.readouterr()
    assert f"{path}: row 2:" in captured.err
    assert "expected_count" in captured.err
    assert "row 1" not in captured.err and "row 3" not in captured.err
    assert "2 of 3 rows match the request models" in captured.out


def test_env_test_with_an_unknown_resources_server_is_a_clear_error(capsys):
    assert main(["env", "test", "--resources-server", "no_such_environment"]) == 2
    message = capsys.readouterr().err
    assert "--resources-server: no implementation directory resources_servers/no_such_environment; looked in" in message
    assert f"\n  {COUNTER_DIR.parent / 'no_such_environment'}" in message


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


def test_env_test_with_a_path_that_is_not_a_resources_server_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "my_env").mkdir()
    assert main(["env", "test", "--resources-server", str(tmp_path / "my_env")]) == 2
    message = capsys.readouterr().err
    assert f"--resources-server: {tmp_path / 'my_env'} is not a resources server directory" in message
    assert "Traceback" not in message


def test_env_test_with_a_server_whose_app_cannot_be_imported_is_a_clear_error(tmp_path, capsys):
    directory = tmp_path / "resources_servers" / "broken_env"
    directory.mkdir(parents=True)
    (directory / "app.py").write_text("import no_such_module_anywhere\n")
    assert main(["env", "test", "--resources-server", str(directory)]) == 2
    message = capsys.readouterr().err
    assert f"{directory / 'app.py'}: cannot load a server app from resources_servers.broken_env.app" in message
    assert "no_such_module_anywhere" in message


RESOLVE_CONFIG = """
policy_base_url: http://127.0.0.1:9/v1
policy_api_key: sk-very-secret
policy_model:
  responses_api_models:
    vllm_model:
      base_url: ${policy_base_url}
      api_key: ${policy_api_key}
      model: ${policy_model_name}
      description: ???
"""


@settings(max_examples=15, deadline=None)
@given(PASSWORDS)
def test_env_resolve_and_validate_print_no_password_of_a_session_store_whatever_it_holds(password):
    with tempfile.TemporaryDirectory() as directory:
        for written in written_forms(password):
            path = Path(directory) / "store.yaml"
            server = {"entrypoint": "app.py", "num_workers": 2, "session_store": written}
            path.write_text(yaml.safe_dump({COUNTER: {"resources_servers": {COUNTER: server}}}))
            for command in ("resolve", "validate"):
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    main(["env", command, "--config", str(path)])
                assert not leaked(password, out.getvalue() + err.getvalue()), (command, written, out.getvalue(), err.getvalue())


def test_env_resolve_prints_the_interpolated_config_as_yaml_with_credentials_redacted(tmp_path, capsys):
    path = tmp_path / "model.yaml"
    path.write_text(RESOLVE_CONFIG.replace("      description: ???\n", ""))
    assert main(["env", "resolve", "--config", str(path), "--search-dir", str(tmp_path), "+policy_model_name=m1"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["policy_model"]["responses_api_models"]["vllm_model"] == {
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "<redacted>",
        "model": "m1",
    }
    assert (printed["policy_api_key"], printed["policy_model_name"]) == ("<redacted>", "m1")


def test_env_resolve_reports_every_unresolved_value_and_prints_no_config(tmp_path, capsys):
    path = tmp_path / "model.yaml"
    path.write_text(RESOLVE_CONFIG)
    assert main(["env", "resolve", "--config", str(path), "--search-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "2 config values cannot be resolved:" in captured.err
    assert f"{path}: policy_model.responses_api_models.vllm_model.model: Interpolation key 'policy_model_name' not found" in captured.err
    assert f"{path}: policy_model.responses_api_models.vllm_model.description: required value (???) is not set" in captured.err


def test_env_resolve_checks_settings_as_env_start_does(tmp_path, capsys):
    path = tmp_path / "model.yaml"
    path.write_text(RESOLVE_CONFIG.replace("      description: ???\n", "      timeout_secs: 5\n"))
    assert main(["env", "resolve", "--config", str(path), "+policy_model_name=m1"]) == 2
    assert f"{path}: policy_model.responses_api_models.vllm_model.timeout_secs: not a key of VLLMModelConfig; did you mean 'timeout_seconds'?" in capsys.readouterr().err


def test_model_flags_with_a_config_set_upstreams_policy_variables(tmp_path, capsys):
    path = tmp_path / "model.yaml"
    path.write_text(RESOLVE_CONFIG.replace("      description: ???\n", ""))
    arguments = ["env", "resolve", "--config", str(path), "--model-url", "http://127.0.0.1:8/v1", "--model", "flag-model"]
    assert main(arguments) == 0
    model = yaml.safe_load(capsys.readouterr().out)["policy_model"]["responses_api_models"]["vllm_model"]
    assert (model["base_url"], model["model"]) == ("http://127.0.0.1:8/v1", "flag-model")


def test_env_start_with_an_override_of_a_key_the_config_lacks_names_it_and_starts_nothing(capsys):
    assert main(["env", "start", "--config", str(CONFIG), "--head-port", str(free_port()), "polcy_model.x=1"]) == 2
    assert "command line: override 'polcy_model.x=1': the config has no key 'polcy_model.x'" in capsys.readouterr().err


def test_gym_list_shows_type_name_and_path_of_servers_in_the_search_roots(tmp_path, capsys):
    external = tmp_path / "responses_api_agents" / "outside_agent"
    external.mkdir(parents=True)
    (external / "app.py").write_text("")
    assert main(["list", "--search-dir", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["type", "name", "path"]
    assert ["responses_api_agents", "outside_agent", str(external)] in rows
    assert ["resources_servers", COUNTER, str(COUNTER_DIR)] in rows


class LauncherSpy:
    """Stands in for the launcher: notes the start timeout it was given and starts nothing."""

    timeouts: list[float | None] = []

    def __init__(self, instances, head_port, extra_env=None, start_timeout=None, settings=None) -> None:
        LauncherSpy.timeouts.append(start_timeout)

    def __enter__(self):
        raise LaunchError("not started: a test's stand-in")

    def __exit__(self, *exc_info) -> None:
        pass


@pytest.mark.parametrize(
    "command",
    [
        ["env", "start", "--resources-server", COUNTER, "--head-port", str(free_port())],
        ["eval", "run", "--resources-server", COUNTER, "--input", str(DATA), "--output", "unused.jsonl"],
    ],
    ids=["env start", "eval run"],
)
def test_start_timeout_reaches_the_launcher_and_defaults_to_its_own(command, monkeypatch, capsys):
    monkeypatch.setattr(cli_env, "Launcher", LauncherSpy)
    monkeypatch.setattr(cli_eval, "Launcher", LauncherSpy)
    LauncherSpy.timeouts = []
    assert main([*command, "--start-timeout", "250"]) == 1
    assert main(command) == 1
    assert LauncherSpy.timeouts == [250, None]
    with pytest.raises(SystemExit) as refused:
        main([*command, "--start-timeout", "0"])
    assert refused.value.code == 2
    assert "--start-timeout" in capsys.readouterr().err
