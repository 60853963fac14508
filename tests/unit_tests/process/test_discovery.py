"""nemo_gym.process.discovery: a config loaded and each instance checked against its server's code: its
implementation found in the search roots, its settings validated by its server's own config model (upstream's keys
kept, typos refused), every error naming the file and the key."""

from __future__ import annotations

import pytest

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.process import discovery
from tests.unit_tests.config.configs import COUNTER, TRIO, UPSTREAM_SHAPED, write


def test_missing_implementation_directory_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path / "bad.yaml", "counter:\n  resources_servers:\n    no_such_environment: {}\n")
    with pytest.raises(ConfigError) as error:
        discovery.load([path])
    message = str(error.value)
    assert str(path) in message
    assert "counter.resources_servers.no_such_environment" in message
    assert "no implementation directory resources_servers/no_such_environment" in message


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


def test_the_example_config_loads(tmp_path):
    path = gym_config.REPO_ROOT / "resources_servers" / "example_session_state_mgmt" / "configs" / "example_session_state_mgmt.yaml"
    instances = discovery.load([path])
    assert {instance.server_type for instance in instances.values()} == set(gym_config.SERVER_TYPES)


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


def test_a_missing_implementation_error_lists_every_place_it_looked(tmp_path):
    path = write(tmp_path / "bad.yaml", "counter:\n  resources_servers:\n    no_such_environment: {}\n")
    roots = gym_config.search_roots([tmp_path / "extra"], cwd=tmp_path)
    with pytest.raises(ConfigError) as error:
        discovery.load([path], roots=roots)
    message = str(error.value)
    for root in (tmp_path / "extra", tmp_path, gym_config.REPO_ROOT):
        assert f"\n  {root / 'resources_servers' / 'no_such_environment'}" in message
