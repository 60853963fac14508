"""nemo_gym.global_config: upstream's key names and accessors of the config the launcher handed a process."""

from __future__ import annotations

import json

from nemo_gym import global_config
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
