"""Keys a config model does not declare: upstream ignores them, so here they load with a warning naming
them; a near miss of a key the model consumes is refused, naming the key it resembles."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from nemo_gym import config as gym_config
from nemo_gym.config import ConfigError
from nemo_gym.config_types import BaseRunServerInstanceConfig, DatasetConfig, ModelServerRef
from nemo_gym.process import discovery

COUNTER = """
counter:
  resources_servers:
    example_session_state_mgmt:
      entrypoint: app.py
"""
COUNTER_AT = "counter.resources_servers.example_session_state_mgmt"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_an_unknown_key_loads_with_a_warning_naming_it(tmp_path, caplog):
    path = write(tmp_path / "counter.yaml", COUNTER + "      judge_prompt_style: terse\n      num_workers: 2\n")
    with caplog.at_level(logging.WARNING, logger="nemo_gym"):
        instances = discovery.load([path])
    assert instances["counter"].num_workers == 2
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("'judge_prompt_style'" in message and "'counter'" in message for message in warnings), warnings


def test_a_key_that_adds_or_replaces_a_whole_word_of_a_declared_key_is_not_a_near_miss(caplog):
    # Upstream's equivalence_llm_judge config sets judge_prompt_template next to the declared
    # judge_prompt_template_fpath; judge_timeout_seconds is as close to body_timeout_seconds.
    with caplog.at_level(logging.WARNING, logger="nemo_gym"):
        config = BaseRunServerInstanceConfig(name="judge", port=1, max_body_bytes_limit=1, judge_timeout_seconds=5, session=1)
    assert config.max_body_bytes == BaseRunServerInstanceConfig.model_fields["max_body_bytes"].default
    assert "'max_body_bytes_limit', 'judge_timeout_seconds', 'session'" in caplog.text


def test_a_near_miss_of_a_framework_key_is_refused_naming_both(tmp_path):
    for typo, meant in (("num_worker", "num_workers"), ("max_body_byte", "max_body_bytes"), ("numworkers", "num_workers")):
        path = write(tmp_path / "counter.yaml", COUNTER + f"      {typo}: 2\n")
        with pytest.raises(ConfigError) as error:
            discovery.load([path])
        assert str(error.value).startswith(f"{path}: {COUNTER_AT}.{typo}:")
        assert f"'{meant}'" in str(error.value)


def test_a_near_miss_of_a_servers_own_key_is_refused_naming_it(tmp_path):
    text = "policy_model:\n  responses_api_models:\n    vllm_model:\n      base_url: http://127.0.0.1:9/v1\n      model: m\n      timeout_secs: 5\n"
    with pytest.raises(ConfigError) as error:
        discovery.load([write(tmp_path / "model.yaml", text)])
    assert "policy_model.responses_api_models.vllm_model.timeout_secs:" in str(error.value)
    assert "'timeout_seconds'" in str(error.value)


def test_an_upstream_test_building_a_config_with_keys_it_does_not_declare_gets_a_config():
    config = BaseRunServerInstanceConfig(name="", host="127.0.0.1", port=1, entrypoint="app.py", speed_bench_subset="qualitative")
    assert (config.name, config.port) == ("", 1)
    with pytest.raises(ValidationError, match="num_workers"):
        BaseRunServerInstanceConfig(name="", port=1, num_wrkers=2)


def test_nested_config_models_take_unknown_keys_and_refuse_near_misses():
    assert ModelServerRef.model_validate({"type": "responses_api_models", "name": "m", "comment": "x"}).name == "m"
    dataset = {"name": "d", "type": "example", "jsonl_fpath": "data/example.jsonl", "huggingface_repo": "x/y"}
    assert DatasetConfig.model_validate(dataset).name == "d"
    with pytest.raises(ValidationError) as error:
        DatasetConfig.model_validate({**dataset, "num_repeat": 2})
    assert error.value.errors()[0]["loc"] == ("num_repeat",) and "'num_repeats'" in str(error.value)
