"""nemo_gym.config.interpolation: every ``???`` left unset and every interpolation that cannot resolve is reported
at once, each naming the file that set it; a config without any resolves to plain data.
And at load, from config files and env.yaml (``process.discovery.load``).
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from nemo_gym import config as gym_config
from nemo_gym.config.files import ConfigError, Sources
from nemo_gym.config.interpolation import resolve
from nemo_gym.process import discovery
from tests.unit_tests.config.configs import TRIO, write


def sources(**files: dict) -> Sources:
    made = Sources()
    for name, data in files.items():
        made.record(data, f"{name}.yaml")
    return made


def test_interpolations_of_keys_and_of_the_environment_resolve_to_plain_data(monkeypatch):
    monkeypatch.setenv("GYM_TEST_URL", "http://judge")
    data = {"base": "http://policy", "model": {"url": "${base}/v1", "judge": "${oc.env:GYM_TEST_URL}", "key": "${oc.env:GYM_TEST_UNSET,none}"}}
    resolved = resolve(OmegaConf.create(data), sources(main=data))
    assert resolved == {"base": "http://policy", "model": {"url": "http://policy/v1", "judge": "http://judge", "key": "none"}}
    assert type(resolved) is dict and type(resolved["model"]) is dict


def test_one_required_value_unset_is_an_error_naming_its_file_its_key_and_how_to_set_it():
    data = {"model": {"api_key": "???"}}
    with pytest.raises(ConfigError) as error:
        resolve(OmegaConf.create(data), sources(secrets=data))
    assert str(error.value) == "secrets.yaml: model.api_key: required value (???) is not set; set it in a config, env.yaml or with ++model.api_key=VALUE"


def test_every_problem_is_reported_at_once_each_with_the_file_that_set_it():
    first, second = {"model": {"api_key": "???"}}, {"agent": {"url": "${nowhere.url}"}, "items": [1, "${missing}"]}
    with pytest.raises(ConfigError) as error:
        resolve(OmegaConf.create({**first, **second}), sources(first=first, second=second))
    lines = str(error.value).splitlines()
    assert lines[0] == "3 config values cannot be resolved:"
    assert lines[1].startswith("first.yaml: model.api_key: required value (???)")
    assert lines[2].startswith("second.yaml: agent.url: ") and "nowhere" in lines[2]
    assert lines[3].startswith("second.yaml: items.1: ") and "missing" in lines[3]


def test_a_key_no_file_set_is_reported_as_the_configs():
    with pytest.raises(ConfigError, match=r"^<config>: a: required value"):
        resolve(OmegaConf.create({"a": "???"}), Sources())


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
