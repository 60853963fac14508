"""nemo_gym.config: a merged config parsed into instances: defaults filled in (loopback host, a free port, one
worker), references and ports checked, and every error naming the file and the key."""

from __future__ import annotations

import socket

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery
from tests.unit_tests.config.configs import COUNTER, TRIO, UPSTREAM_SHAPED, write


def load_error(path) -> str:
    """What loading the config at ``path`` fails with (it must fail with a ConfigError)."""
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    return str(error.value)


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
    message = load_error(path)
    assert str(path) in message
    assert "counter" in message
    assert "unknown server type 'resource_servers'" in message


def test_ref_to_a_missing_instance_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("name: counter}", "name: countr}"))
    message = load_error(path)
    assert str(path) in message
    assert "counter_agent.responses_api_agents.simple_agent.resources_server" in message
    assert "'countr'" in message


def test_ref_of_the_wrong_type_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "trio.yaml", TRIO.replace("{type: responses_api_models, name: policy_model}", "{type: responses_api_models, name: counter}"))
    message = load_error(path)
    assert str(path) in message
    assert "counter_agent.responses_api_agents.simple_agent.model_server" in message
    assert "is a resources_servers, not a responses_api_models" in message


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


def test_bad_num_workers_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "counter.yaml", COUNTER + "      num_workers: 0\n")
    message = load_error(path)
    assert f"{path}: counter.resources_servers.example_session_state_mgmt.num_workers" in message


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
    message = load_error(path)
    assert message.startswith(f"{path}: counter.resources_servers.example_session_state_mgmt.host: cannot listen on '192.0.2.1'")


def test_reserved_global_keys_and_plain_variables_are_not_instances(tmp_path):
    instances = discovery.load([write(tmp_path / "upstream.yaml", UPSTREAM_SHAPED)], roots=[gym_config.REPO_ROOT])
    assert set(instances) == {"counter", "counter_agent", "policy_model"}
