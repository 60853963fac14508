"""Redaction: the value of every key that names a credential is hidden, at any depth, whatever its case."""

from __future__ import annotations

import yaml
from hypothesis import given

from nemo_gym.config.redaction import REDACTED, misread, redact, shown_url
from tests.hostile_passwords import PASSWORDS, leaked, written_forms


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


def test_a_url_is_shown_rebuilt_without_its_password_or_credential_parameters_and_the_rest_kept():
    config = {"counter": {"resources_servers": {"x": {"session_store": "postgresql://gym:p%40ss@db:5432/gym?sslmode=require&password=two&sslpassword=3"}}}}
    assert redact(config)["counter"]["resources_servers"]["x"]["session_store"] == "postgresql://gym@db:5432/gym?sslmode=require"
    assert redact({"session_store": "postgresql://gym@db/gym", "url": "http://host:1/path"}) == {"session_store": "postgresql://gym@db/gym", "url": "http://host:1/path"}


def test_a_password_with_a_raw_question_mark_or_hash_is_read_as_libpq_reads_it_to_its_at_sign():
    # libpq ends the user part at the first '@' before any '/': '?' and '#' are part of the password.
    for written in ("postgresql://gym:a?b#c@db:5432/gym", "postgresql://gym:a#b?c@db:5432/gym?sslmode=require"):
        assert shown_url(written).startswith("postgresql://gym@db:5432/gym") and "a" not in shown_url(written).partition("@")[0][len("postgresql://") :]


def test_a_url_with_an_at_sign_past_its_user_part_is_shown_as_its_scheme_alone():
    # A raw '@' or '/' in a password: libpq takes part of it for the host or the database.
    for written in ("postgresql://gym:p@ss@db/gym", "postgresql://gym:p/ss@db/gym", "postgresql://db/gym?password=a@b"):
        assert misread(written) and shown_url(written) == f"postgresql://{REDACTED}"


@given(PASSWORDS)
def test_no_password_of_printable_characters_is_in_a_redacted_config_or_a_shown_url(password):
    for written in written_forms(password):
        dumped = yaml.safe_dump(redact({"counter": {"resources_servers": {"x": {"session_store": written}}}}))
        assert not leaked(password, dumped) and not leaked(password, shown_url(written)), (written, dumped)
