"""Redaction: the value of every key that names a credential is hidden, at any depth, whatever its case."""

from __future__ import annotations

from nemo_gym.config.redaction import REDACTED, redact


def test_values_of_credential_keys_are_replaced_at_any_depth_whatever_their_case():
    config = {
        "policy": {"responses_api_models": {"vllm_model": {"api_key": "sk-1", "OPENAI_API_KEY": "sk-2", "port": 1}}},
        "counter": {"resources_servers": {"x": {"Session_Secret": "s" * 32, "headers": [{"X-Auth-Token": "t", "accept": "json"}]}}},
        "db": {"password": {"nested": "p"}, "name": "gym"},
    }
    assert redact(config) == {
        "policy": {"responses_api_models": {"vllm_model": {"api_key": REDACTED, "OPENAI_API_KEY": REDACTED, "port": 1}}},
        "counter": {"resources_servers": {"x": {"Session_Secret": REDACTED, "headers": [{"X-Auth-Token": REDACTED, "accept": "json"}]}}},
        "db": {"password": REDACTED, "name": "gym"},
    }


def test_the_original_is_left_as_it_was():
    config = {"a": {"secret": "s"}}
    redact(config)
    assert config == {"a": {"secret": "s"}}


def test_a_urls_password_is_replaced_and_the_rest_of_it_kept_as_a_session_store_that_carries_one():
    config = {"counter": {"resources_servers": {"x": {"session_store": "postgresql://gym:p%40ss@db:5432/gym?sslmode=require&password=two"}}}}
    assert redact(config)["counter"]["resources_servers"]["x"]["session_store"] == f"postgresql://gym:{REDACTED}@db:5432/gym?sslmode=require&password={REDACTED}"
    assert redact({"session_store": "postgresql://gym@db/gym", "url": "http://host:1/path"}) == {"session_store": "postgresql://gym@db/gym", "url": "http://host:1/path"}
