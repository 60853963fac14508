"""nemo_gym.global_config: upstream's key names and accessors of the config the launcher handed a process.

Upstream's find_open_port (local_vllm_model): a port that binds, not a disallowed one, within the config's port range.
"""

from __future__ import annotations

import json
import socket

import pytest

from nemo_gym import global_config
from nemo_gym.config import free_port
from nemo_gym.env import CONFIG_PATH_ENV


def test_upstreams_row_key_names_are_the_keys_rows_carry():
    names = [global_config.ATTEMPT_INDEX_KEY_NAME, global_config.ROLLOUT_ID_KEY_NAME, global_config.SKILLS_REF_KEY_NAME, global_config.RESPONSES_CREATE_PARAMS_KEY_NAME]
    assert names == ["_ng_attempt_index", "_ng_rollout_id", "skills_ref", "responses_create_params"]


def test_maybe_get_global_config_dict_is_none_outside_the_launcher_and_the_config_inside(tmp_path, monkeypatch):
    global_config.get_global_config_dict.cache_clear()
    monkeypatch.delenv(CONFIG_PATH_ENV, raising=False)
    assert global_config.maybe_get_global_config_dict() is None
    (tmp_path / "config.json").write_text(json.dumps({global_config.HF_TOKEN_KEY_NAME: "hf_x", "judge": {"responses_api_models": {"x": {"port": 1}}}}))
    monkeypatch.setenv(CONFIG_PATH_ENV, str(tmp_path / "config.json"))
    try:
        assert global_config.maybe_get_global_config_dict()["judge"]["responses_api_models"]["x"]["port"] == 1
        assert global_config.get_hf_token() == "hf_x"
    finally:
        global_config.get_global_config_dict.cache_clear()


def test_find_open_port_gives_a_port_that_can_be_bound_and_is_not_disallowed(monkeypatch):
    monkeypatch.delenv(global_config.CONFIG_PATH_ENV, raising=False)
    taken = global_config.find_open_port()
    port = global_config.find_open_port(disallowed_ports=[taken])
    assert port != taken
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_find_open_port_keeps_to_the_configs_port_range(tmp_path, monkeypatch):
    low = free_port()
    (tmp_path / "config.json").write_text(json.dumps({"port_range_low": low, "port_range_high": low}))
    monkeypatch.setenv(global_config.CONFIG_PATH_ENV, str(tmp_path / "config.json"))
    global_config.get_global_config_dict.cache_clear()
    try:
        assert global_config.find_open_port() == low
        with pytest.raises(RuntimeError, match="disallowed"):
            global_config.find_open_port(disallowed_ports=[low], max_retries=3)
    finally:
        global_config.get_global_config_dict.cache_clear()
