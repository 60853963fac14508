"""nemo_gym.config_types: the config models' own checks (a dataset's license, the session secret's length and its
absence from dumps, the settings' bounds), and the names upstream's servers import from it."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from nemo_gym.config_types import BaseRunServerInstanceConfig, DatasetConfig

INSTANCE = {"name": "counter", "host": "127.0.0.1", "port": 18080}


def test_config_types_has_omegaconf_as_upstreams_does():
    from omegaconf import OmegaConf

    from nemo_gym.config_types import OmegaConf as exported

    assert exported is OmegaConf


@pytest.mark.parametrize("kind", ["train", "validation"])
def test_a_dataset_trained_or_validated_on_needs_a_license(kind):
    with pytest.raises(ValidationError, match=f"dataset 'd' of type {kind} needs a license"):
        DatasetConfig(name="d", type=kind, jsonl_fpath="d.jsonl")
    assert DatasetConfig(name="d", type=kind, jsonl_fpath="d.jsonl", license="MIT").license == "MIT"


@pytest.mark.parametrize("kind", ["example", "benchmark"])
def test_an_example_or_benchmark_dataset_needs_no_license(kind):
    assert DatasetConfig(name="d", type=kind, jsonl_fpath="d.jsonl").license is None


def test_a_dataset_is_repeated_at_least_once():
    with pytest.raises(ValidationError, match="num_repeats"):
        DatasetConfig(name="d", type="example", jsonl_fpath="d.jsonl", num_repeats=0)


def test_a_session_secret_shorter_than_32_bytes_is_refused_and_a_long_enough_one_is_kept():
    with pytest.raises(ValidationError, match="session_secret is 31 bytes long; a signing secret needs at least 32"):
        BaseRunServerInstanceConfig(**INSTANCE, session_secret="s" * 31)
    # Bytes, not characters: 11 three-byte characters are 33 bytes.
    assert BaseRunServerInstanceConfig(**INSTANCE, session_secret="€" * 11).session_secret == "€" * 11


def test_an_unset_session_secret_is_left_out_of_a_dump_and_a_set_one_is_in_it():
    assert "session_secret" not in BaseRunServerInstanceConfig(**INSTANCE).model_dump()
    assert BaseRunServerInstanceConfig(**INSTANCE, session_secret="s" * 32).model_dump()["session_secret"] == "s" * 32


@pytest.mark.parametrize(
    "key, value",
    [
        ("max_body_bytes", 0),
        ("header_timeout_seconds", math.inf),
        ("body_timeout_seconds", math.nan),
        ("min_body_bytes_per_second", -1),
        ("session_idle_timeout_seconds", -1),
        ("max_sessions", 0),
        ("owner_lease_seconds", 0),
        ("forward_port", 65536),
        ("forward_port", -1),
        ("peer_dead_after_seconds", math.inf),
        ("num_replicas", 0),
    ],
)
def test_a_setting_out_of_its_bounds_is_refused_naming_it(key, value):
    with pytest.raises(ValidationError, match=key):
        BaseRunServerInstanceConfig(**INSTANCE, **{key: value})


def test_the_defaults_route_sessions_keep_them_durable_and_idle_them_after_an_hour():
    config = BaseRunServerInstanceConfig(**INSTANCE)
    assert (config.route_sessions, config.durable_sessions, config.place_sessions) == (True, True, False)
    assert (config.session_idle_timeout_seconds, config.max_sessions, config.num_replicas, config.replicas) == (3600.0, None, 1, [])
