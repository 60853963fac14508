"""nemo_gym.sandbox.config: an agent's ``sandbox_provider`` (a block's name, or an inline block) to a provider config."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from nemo_gym.sandbox import resolve_provider_config, resolve_provider_metadata
from nemo_gym.sandbox.config import SANDBOX_BLOCK_DEFAULT_METADATA_KEY

NAMED = {
    "sandbox": {"local": {"root": "/tmp/x"}, "default_metadata": {"sandbox-api": "local"}},
    "two": {"local": {}, "docker": {}},
    "policy_model": {"responses_api_models": {"vllm_model": {}}},
}


def test_a_name_resolves_to_its_single_provider_block_without_the_reserved_keys():
    assert SANDBOX_BLOCK_DEFAULT_METADATA_KEY == "default_metadata"
    assert resolve_provider_config("sandbox", NAMED) == {"local": {"root": "/tmp/x"}}
    assert resolve_provider_config("sandbox", OmegaConf.create(NAMED)) == {"local": {"root": "/tmp/x"}}


def test_an_inline_block_resolves_as_it_is():
    assert resolve_provider_config({"local": {}}) == {"local": {}}


def test_a_blocks_default_metadata_is_its_own_and_empty_when_absent():
    assert resolve_provider_metadata("sandbox", NAMED) == {"sandbox-api": "local"}
    assert resolve_provider_metadata({"local": {}}) == {}
    with pytest.raises(ValueError, match="default_metadata"):
        resolve_provider_metadata({"local": {}, "default_metadata": "tag"})


def test_an_unknown_name_is_refused_listing_the_blocks_that_could_be_sandboxes():
    with pytest.raises(ValueError, match=r"'nowhere' is not defined.*Available sandbox configs: 'policy_model', 'sandbox'"):
        resolve_provider_config("nowhere", NAMED)
    with pytest.raises(ValueError, match="non-empty"):
        resolve_provider_config("", NAMED)


def test_a_block_needs_exactly_one_provider_and_a_reference_is_a_name_or_a_mapping():
    with pytest.raises(ValueError, match="exactly one provider key"):
        resolve_provider_config("two", NAMED)
    with pytest.raises(ValueError, match="must be a mapping"):
        resolve_provider_config("flat", {"flat": "local"})
    with pytest.raises(TypeError, match="name reference"):
        resolve_provider_config(3)
