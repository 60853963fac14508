"""Config loading: files merge (later wins), defaults are filled in, and every error names the file and key."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


COUNTER = """
counter:
  resources_servers:
    example_session_state_mgmt:
      entrypoint: app.py
"""

TRIO = COUNTER + """
counter_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: counter}
      model_server: {type: responses_api_models, name: policy_model}
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      base_url: http://127.0.0.1:9/v1
      model: first
"""


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


def test_defaults_are_loopback_host_a_free_port_and_one_worker(tmp_path):
    instances = discovery.load([write(tmp_path / "counter.yaml", COUNTER)])

    counter = instances["counter"]
    assert counter.host == "127.0.0.1"
    assert counter.num_workers == 1
    assert isinstance(counter.port, int) and 0 < counter.port < 65536
    assert not gym_config.port_in_use(counter.host, counter.port)
    assert counter.url == f"http://127.0.0.1:{counter.port}"
    assert counter.module == "resources_servers.example_session_state_mgmt.app"


def test_unknown_server_type_error_names_the_file_and_the_instance(tmp_path):
    path = write(tmp_path / "bad.yaml", "counter:\n  resource_servers:\n    example_session_state_mgmt: {}\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter" in message
    assert "unknown server type 'resource_servers'" in message


def test_ref_to_a_missing_instance_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("name: counter}", "name: countr}"))
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter_agent.responses_api_agents.simple_agent.resources_server" in message
    assert "'countr'" in message


def test_ref_of_the_wrong_type_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("{type: responses_api_models, name: policy_model}", "{type: responses_api_models, name: counter}"))
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter_agent.responses_api_agents.simple_agent.model_server" in message
    assert "is a resources_servers, not a responses_api_models" in message


def test_missing_implementation_directory_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "bad.yaml", "counter:\n  resources_servers:\n    no_such_environment: {}\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter.resources_servers.no_such_environment" in message
    assert "no implementation directory resources_servers/no_such_environment" in message


def test_port_already_in_use_error_names_the_file_and_the_key(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write(tmp_path / "counter.yaml", COUNTER + f"      port: {port}\n")
        with pytest.raises(ConfigError) as error:
            discovery.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter.resources_servers.example_session_state_mgmt.port" in message
    assert f"port {port} on 127.0.0.1 is already in use" in message


def test_typo_in_a_setting_key_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      num_wokers: 4\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter.resources_servers.example_session_state_mgmt.num_wokers" in message


def test_typo_in_a_model_setting_is_caught_by_that_servers_own_config_model(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("model: first", "model: first\n      timeout_secs: 5"))
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    assert f"{path}: policy_model.responses_api_models.vllm_model.timeout_secs" in str(error.value)


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


def test_bad_num_workers_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      num_workers: 0\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert f"{path}: counter.resources_servers.example_session_state_mgmt.num_workers" in message


def test_the_example_config_loads(tmp_path):
    path = gym_config.REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "configs" / "example_session_state_mgmt.yaml"
    instances = discovery.load([path])
    assert {instance.server_type for instance in instances.values()} == set(gym_config.SERVER_TYPES)


def test_two_instances_on_the_same_port_is_an_error_naming_the_file_and_the_key(tmp_path):
    port = gym_config.free_port()
    text = TRIO.replace("model: first", f"model: first\n      port: {port}")
    path = write(tmp_path / "trio.yaml", text.replace("entrypoint: app.py", f"entrypoint: app.py\n      port: {port}", 1))
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    assert str(error.value) == (
        f"{path}: policy_model.responses_api_models.vllm_model.port: port {port} on 127.0.0.1 is also the port of instance 'counter'"
    )


def test_a_host_that_is_not_on_this_machine_is_an_error_naming_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      host: 192.0.2.1\n")  # TEST-NET-1: never assigned
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert message.startswith(f"{path}: counter.resources_servers.example_session_state_mgmt.host: cannot listen on '192.0.2.1'")


UPSTREAM_SHAPED = """
policy_base_url: http://127.0.0.1:9/v1
policy_model_name: upstream-model
config_paths: []
default_host: 127.0.0.1
error_on_almost_servers: false
counter:
  resources_servers:
    example_session_state_mgmt:
      entrypoint: app.py
      domain: games
      verified: false
      verified_url: https://example.com/report
      description: Count per session
      value: Teaches keeping state across tool calls
      datasets:
        - name: example
          type: example
          jsonl_fpath: resources_servers/example_session_state_mgmt/data/example.jsonl
        - name: train
          type: train
          jsonl_fpath: data/train.jsonl
          license: Apache 2.0
          num_repeats: 2
          source: {type: huggingface, repo_id: someone/counter}
counter_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      domain: agent
      resources_server: {type: resources_servers, name: counter}
      model_server: {type: responses_api_models, name: policy_model}
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      base_url: ${policy_base_url}
      model: ${policy_model_name}
      return_token_id_information: false
      uses_reasoning_parser: true
      chat_template_kwargs: {enable_thinking: false}
"""


def test_upstream_catalog_keys_load_and_are_kept_in_the_settings(tmp_path):
    instances = discovery.load([write(tmp_path / "upstream.yaml", UPSTREAM_SHAPED)], roots=[gym_config.REPO_ROOT])
    counter = instances["counter"].settings
    assert (counter["domain"], counter["verified"], counter["description"]) == ("games", False, "Count per session")
    assert counter["verified_url"] == "https://example.com/report"
    assert counter["value"] == "Teaches keeping state across tool calls"
    assert [dataset["name"] for dataset in counter["datasets"]] == ["example", "train"]
    assert instances["counter_agent"].settings["domain"] == "agent"


def test_upstream_vllm_model_keys_are_accepted(tmp_path):
    instances = discovery.load([write(tmp_path / "upstream.yaml", UPSTREAM_SHAPED)], roots=[gym_config.REPO_ROOT])
    model = instances["policy_model"].settings
    assert (model["return_token_id_information"], model["uses_reasoning_parser"]) == (False, True)
    assert model["chat_template_kwargs"] == {"enable_thinking": False}


def test_reserved_global_keys_and_plain_variables_are_not_instances(tmp_path):
    instances = discovery.load([write(tmp_path / "upstream.yaml", UPSTREAM_SHAPED)], roots=[gym_config.REPO_ROOT])
    assert set(instances) == {"counter", "counter_agent", "policy_model"}


def test_a_domain_outside_upstreams_list_is_an_error_naming_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      domain: maths\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path], roots=[gym_config.REPO_ROOT])
    message = str(error.value)
    assert message.startswith(f"{path}: counter.resources_servers.example_session_state_mgmt.domain:")
    assert "'math'" in message


def test_a_training_dataset_without_a_license_is_an_error_naming_the_file_and_the_key(tmp_path):
    text = COUNTER + "      datasets:\n        - {name: train, type: train, jsonl_fpath: data/train.jsonl}\n"
    with pytest.raises(ConfigError) as error:
        discovery.load([write(tmp_path / "counter.yaml", text)], roots=[gym_config.REPO_ROOT])
    assert str(error.value).startswith(f"{tmp_path / 'counter.yaml'}: counter.resources_servers.example_session_state_mgmt.datasets.0")
    assert "needs a license" in str(error.value)


def test_datasets_null_loads_as_no_datasets_as_upstreams_optional_list(tmp_path):
    instances = discovery.load([write(tmp_path / "counter.yaml", COUNTER + "      datasets: null\n")], roots=[gym_config.REPO_ROOT])
    assert instances["counter"].settings["datasets"] is None


def test_a_typo_next_to_upstream_keys_is_still_an_error_naming_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "upstream.yaml", UPSTREAM_SHAPED.replace("      verified: false\n", "      verifed: false\n"))
    with pytest.raises(ConfigError) as error:
        discovery.load([path], roots=[gym_config.REPO_ROOT])
    assert str(error.value).startswith(f"{path}: counter.resources_servers.example_session_state_mgmt.verifed:")


def test_interpolations_of_a_variable_a_dotted_path_and_environment_variables_resolve_at_load(tmp_path, monkeypatch):
    monkeypatch.setenv("GYM_TEST_MODEL", "from-the-environment")
    monkeypatch.delenv("GYM_TEST_UNSET", raising=False)
    text = TRIO.replace("base_url: http://127.0.0.1:9/v1", "base_url: ${policy.url}").replace("model: first", "model: ${oc.env:GYM_TEST_MODEL}")
    text += "policy: {url: 'http://127.0.0.1:9/v1', key: '${oc.env:GYM_TEST_UNSET,no-key}'}\n"
    text = text.replace("model: ${oc.env:GYM_TEST_MODEL}", "model: ${oc.env:GYM_TEST_MODEL}\n      api_key: ${policy.key}")
    instances = discovery.load([write(tmp_path / "trio.yaml", text)], roots=[gym_config.REPO_ROOT])
    model = instances["policy_model"].settings
    assert (model["base_url"], model["model"], model["api_key"]) == ("http://127.0.0.1:9/v1", "from-the-environment", "no-key")


def test_every_missing_value_is_reported_at_load_at_once_with_its_file(tmp_path, monkeypatch):
    monkeypatch.delenv("GYM_TEST_UNSET", raising=False)
    text = TRIO.replace("base_url: http://127.0.0.1:9/v1", "base_url: ${policy_base_url}").replace("model: first", "model: ???")
    first = write(tmp_path / "first.yaml", text)
    second = write(tmp_path / "second.yaml", "policy_model:\n  responses_api_models:\n    vllm_model:\n      api_key: ${oc.env:GYM_TEST_UNSET}\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([first, second], roots=[gym_config.REPO_ROOT])
    lines = str(error.value).splitlines()
    assert lines[0] == "3 config values cannot be resolved:"
    assert any(line.startswith(f"{first}: policy_model.responses_api_models.vllm_model.base_url:") and "policy_base_url" in line for line in lines)
    assert f"{first}: policy_model.responses_api_models.vllm_model.model: required value (???) is not set" in str(error.value)
    assert any(line.startswith(f"{second}: policy_model.responses_api_models.vllm_model.api_key:") and "GYM_TEST_UNSET" in line for line in lines)


ENV_YAML = "policy_base_url: http://127.0.0.1:7/v1\npolicy_api_key: from-env-yaml\npolicy_model_name: env-model\n"
UPSTREAM_MODEL = """
policy_model:
  responses_api_models:
    vllm_model:
      base_url: ${policy_base_url}
      api_key: ${policy_api_key}
      model: ${policy_model_name}
"""


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


def test_a_missing_implementation_error_lists_every_place_it_looked(tmp_path):
    path = write(tmp_path / "bad.yaml", "counter:\n  resources_servers:\n    no_such_environment: {}\n")
    roots = gym_config.search_roots([tmp_path / "extra"], cwd=tmp_path)
    with pytest.raises(ConfigError) as error:
        discovery.load([path], roots=roots)
    message = str(error.value)
    for root in (tmp_path / "extra", tmp_path, gym_config.REPO_ROOT):
        assert f"\n  {root / 'resources_servers' / 'no_such_environment'}" in message


def test_a_plain_override_may_set_a_key_an_earlier_override_added(tmp_path):
    key = "counter.resources_servers.example_session_state_mgmt.description"
    instances = discovery.load([write(tmp_path / "counter.yaml", COUNTER)], overrides=[f"+{key}=first", f"{key}=second"], roots=[gym_config.REPO_ROOT])
    assert instances["counter"].settings["description"] == "second"
