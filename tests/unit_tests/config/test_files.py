"""nemo_gym.config.files: config files read and merged in order (later wins, another implementation replaces the
instance), env.yaml and ``config_paths`` layered in, overrides applied, and every error naming the file or the override."""

from __future__ import annotations

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery
from tests.unit_tests.config.configs import COUNTER, ENV_YAML, TRIO, UPSTREAM_MODEL, write


def test_several_files_merge_and_the_later_file_wins(tmp_path):
    first = write(tmp_path / "first.yaml", TRIO)
    second = write(
        tmp_path / "second.yaml",
        """
policy_model:
  responses_api_models:
    vllm_model:
      model: second
counter:
  resources_servers:
    example_session_state_mgmt:
      num_workers: 3
""",
    )
    instances = discovery.load([first, second])

    assert set(instances) == {"counter", "counter_agent", "policy_model"}
    assert instances["policy_model"].settings["model"] == "second"
    assert instances["policy_model"].settings["base_url"] == "http://127.0.0.1:9/v1"
    assert instances["counter"].num_workers == 3
    assert instances["counter_agent"].settings["resources_server"] == {"type": "resources_servers", "name": "counter"}


def test_an_error_names_the_file_that_set_the_bad_key_not_a_later_file_that_merged_into_it(tmp_path):
    first = write(tmp_path / "first.yaml", COUNTER + "      num_wokers: 4\n")
    second = write(tmp_path / "second.yaml", COUNTER)
    with pytest.raises(ConfigError) as error:
        discovery.load([first, second])
    assert str(error.value).startswith(f"{first}: counter.resources_servers.example_session_state_mgmt.num_wokers")


def test_a_later_file_that_names_another_implementation_replaces_the_instance(tmp_path):
    first = write(tmp_path / "first.yaml", TRIO)
    second = write(
        tmp_path / "second.yaml",
        "policy_model:\n  responses_api_models:\n    scripted_backend:\n      think_time_ms: 5\n",
    )
    instances = discovery.load([first, second])
    assert instances["policy_model"].implementation == "scripted_backend"
    assert "base_url" not in instances["policy_model"].settings
    assert instances["policy_model"].settings["think_time_ms"] == 5


def test_bad_yaml_error_names_the_file(tmp_path):
    path = write(tmp_path / "broken.yaml", "counter:\n  resources_servers: [unclosed\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    assert f"{path}: not valid YAML" in str(error.value)


def test_missing_config_file_error_names_the_file(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    assert f"{path}: cannot read config" in str(error.value)


def test_env_yaml_in_the_working_directory_supplies_variables(tmp_path):
    write(tmp_path / "env.yaml", ENV_YAML)
    path = write(tmp_path / "model.yaml", UPSTREAM_MODEL)
    instances = discovery.load([path], roots=gym_config.search_roots(cwd=tmp_path))
    model = instances["policy_model"].settings
    assert (model["base_url"], model["api_key"], model["model"]) == ("http://127.0.0.1:7/v1", "from-env-yaml", "env-model")


def test_env_yaml_wins_over_config_files_and_loses_to_command_line_overrides(tmp_path):
    write(tmp_path / "env.yaml", ENV_YAML)
    path = write(tmp_path / "model.yaml", UPSTREAM_MODEL + "policy_model_name: file-model\npolicy_api_key: file-key\n")
    instances = discovery.load([path], overrides=["policy_model_name=cli-model"], roots=gym_config.search_roots(cwd=tmp_path))
    model = instances["policy_model"].settings
    assert (model["api_key"], model["model"]) == ("from-env-yaml", "cli-model")


def test_an_env_yaml_of_a_search_root_wins_over_the_working_directorys(tmp_path):
    (tmp_path / "cwd").mkdir()
    (tmp_path / "extra").mkdir()
    write(tmp_path / "cwd" / "env.yaml", ENV_YAML)
    write(tmp_path / "extra" / "env.yaml", "policy_model_name: extra-model\n")
    path = write(tmp_path / "model.yaml", UPSTREAM_MODEL)
    roots = gym_config.search_roots([tmp_path / "extra"], cwd=tmp_path / "cwd")
    assert discovery.load([path], roots=roots)["policy_model"].settings["model"] == "extra-model"


def test_config_paths_are_read_first_and_lose_to_the_file_that_lists_them(tmp_path):
    write(tmp_path / "base.yaml", TRIO)
    path = write(
        tmp_path / "top.yaml",
        f"config_paths: [{tmp_path / 'base.yaml'}]\npolicy_model:\n  responses_api_models:\n    vllm_model:\n      model: top\n",
    )
    instances = discovery.load([path], roots=[gym_config.REPO_ROOT])
    assert set(instances) == {"counter", "counter_agent", "policy_model"}
    assert instances["policy_model"].settings["model"] == "top"


def test_a_config_file_that_includes_itself_is_an_error_naming_the_chain(tmp_path):
    path = write(tmp_path / "loop.yaml", f"config_paths: [{tmp_path / 'loop.yaml'}]\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path], roots=[gym_config.REPO_ROOT])
    assert f"{path}: config_paths: the file includes itself" in str(error.value)


def test_override_plain_key_sets_an_existing_key_with_a_yaml_typed_value(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      num_workers: 1\n")
    overrides = ["counter.resources_servers.example_session_state_mgmt.num_workers=3"]
    assert discovery.load([path], overrides=overrides, roots=[gym_config.REPO_ROOT])["counter"].num_workers == 3


def test_override_plain_key_that_the_config_lacks_is_an_error_suggesting_plus(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER)
    with pytest.raises(ConfigError) as error:
        discovery.load([path], overrides=["counter.resources_servers.example_session_state_mgmt.num_wokers=3"], roots=[gym_config.REPO_ROOT])
    message = str(error.value)
    assert message.startswith("command line: override 'counter.resources_servers.example_session_state_mgmt.num_wokers=3'")
    assert "write +counter" in message


def test_override_plus_adds_and_double_plus_sets_or_adds(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      num_workers: 1\n")
    key = "counter.resources_servers.example_session_state_mgmt"
    overrides = [f"+{key}.port={gym_config.free_port()}", f"++{key}.num_workers=2", f"++{key}.description=added"]
    counter = discovery.load([path], overrides=overrides, roots=[gym_config.REPO_ROOT])["counter"]
    assert (counter.num_workers, counter.settings["description"]) == (2, "added")


def test_override_plus_config_paths_adds_config_files(tmp_path):
    write(tmp_path / "counter.yaml", COUNTER)
    instances = discovery.load([], overrides=[f"+config_paths=[{tmp_path / 'counter.yaml'}]"], roots=[gym_config.REPO_ROOT])
    assert set(instances) == {"counter"}


@pytest.mark.parametrize("token", ["no_equals_sign", "=value", "+key=[unclosed", "a[0]=1"])
def test_a_malformed_override_is_an_error_naming_it(token, tmp_path):
    with pytest.raises(ConfigError) as error:
        discovery.load([write(tmp_path / "counter.yaml", COUNTER)], overrides=[token], roots=[gym_config.REPO_ROOT])
    assert str(error.value).startswith(f"command line: override {token!r}:")


def test_a_plain_override_may_set_a_key_an_earlier_override_added(tmp_path):
    key = "counter.resources_servers.example_session_state_mgmt.description"
    instances = discovery.load([write(tmp_path / "counter.yaml", COUNTER)], overrides=[f"+{key}=first", f"{key}=second"], roots=[gym_config.REPO_ROOT])
    assert instances["counter"].settings["description"] == "second"
