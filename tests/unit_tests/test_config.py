"""Config loading: files merge (later wins), defaults are filled in, and every error names the file and key."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError


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
    instances = gym_config.load([first, second])

    assert set(instances) == {"counter", "counter_agent", "policy_model"}
    assert instances["policy_model"].settings["model"] == "second"
    assert instances["policy_model"].settings["base_url"] == "http://127.0.0.1:9/v1"
    assert instances["counter"].num_workers == 3
    assert instances["counter_agent"].settings["resources_server"] == {"type": "resources_servers", "name": "counter"}


def test_an_error_names_the_file_that_set_the_bad_key_not_a_later_file_that_merged_into_it(tmp_path):
    first = write(tmp_path / "first.yaml", COUNTER + "      num_wokers: 4\n")
    second = write(tmp_path / "second.yaml", COUNTER)
    with pytest.raises(ConfigError) as error:
        gym_config.load([first, second])
    assert str(error.value).startswith(f"{first}: counter.resources_servers.example_session_state_mgmt.num_wokers")


def test_a_later_file_that_names_another_implementation_replaces_the_instance(tmp_path):
    first = write(tmp_path / "first.yaml", TRIO)
    second = write(
        tmp_path / "second.yaml",
        "policy_model:\n  responses_api_models:\n    scripted_backend:\n      think_time_ms: 5\n",
    )
    instances = gym_config.load([first, second])
    assert instances["policy_model"].implementation == "scripted_backend"
    assert "base_url" not in instances["policy_model"].settings
    assert instances["policy_model"].settings["think_time_ms"] == 5


def test_defaults_are_loopback_host_a_free_port_and_one_worker(tmp_path):
    instances = gym_config.load([write(tmp_path / "counter.yaml", COUNTER)])

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
        gym_config.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter" in message
    assert "unknown server type 'resource_servers'" in message


def test_ref_to_a_missing_instance_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("name: counter}", "name: countr}"))
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter_agent.responses_api_agents.simple_agent.resources_server" in message
    assert "'countr'" in message


def test_ref_of_the_wrong_type_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("{type: responses_api_models, name: policy_model}", "{type: responses_api_models, name: counter}"))
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter_agent.responses_api_agents.simple_agent.model_server" in message
    assert "is a resources_servers, not a responses_api_models" in message


def test_missing_implementation_directory_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "bad.yaml", "counter:\n  resources_servers:\n    no_such_environment: {}\n")
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
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
            gym_config.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter.resources_servers.example_session_state_mgmt.port" in message
    assert f"port {port} on 127.0.0.1 is already in use" in message


def test_typo_in_a_setting_key_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      num_wokers: 4\n")
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter.resources_servers.example_session_state_mgmt.num_wokers" in message


def test_typo_in_a_model_setting_is_caught_by_that_servers_own_config_model(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("model: first", "model: first\n      timeout_secs: 5"))
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    assert f"{path}: policy_model.responses_api_models.vllm_model.timeout_secs" in str(error.value)


def test_bad_yaml_error_names_the_file(tmp_path):
    path = write(tmp_path / "broken.yaml", "counter:\n  resources_servers: [unclosed\n")
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    assert f"{path}: not valid YAML" in str(error.value)


def test_missing_config_file_error_names_the_file(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    assert f"{path}: cannot read config" in str(error.value)


def test_bad_num_workers_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      num_workers: 0\n")
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    message = str(error.value)
    assert f"{path}: counter.resources_servers.example_session_state_mgmt.num_workers" in message


def test_the_example_config_loads(tmp_path):
    path = gym_config.REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "configs" / "example_session_state_mgmt.yaml"
    instances = gym_config.load([path])
    assert {instance.server_type for instance in instances.values()} == set(gym_config.SERVER_TYPES)


def test_two_instances_on_the_same_port_is_an_error_naming_the_file_and_the_key(tmp_path):
    port = gym_config.free_port()
    text = TRIO.replace("model: first", f"model: first\n      port: {port}")
    path = write(tmp_path / "trio.yaml", text.replace("entrypoint: app.py", f"entrypoint: app.py\n      port: {port}", 1))
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    assert str(error.value) == (
        f"{path}: policy_model.responses_api_models.vllm_model.port: port {port} on 127.0.0.1 is also the port of instance 'counter'"
    )


def test_a_host_that_is_not_on_this_machine_is_an_error_naming_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      host: 192.0.2.1\n")  # TEST-NET-1: never assigned
    with pytest.raises(ConfigError) as error:
        gym_config.load([path])
    message = str(error.value)
    assert message.startswith(f"{path}: counter.resources_servers.example_session_state_mgmt.host: cannot listen on '192.0.2.1'")
