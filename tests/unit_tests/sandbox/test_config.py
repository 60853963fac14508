"""nemo_gym.sandbox.config: upstream's resolve_provider_config and resolve_provider_metadata (an agent's
``sandbox_provider`` as a name of a top-level block or an inline one-provider mapping), as upstream's agents call them."""

from __future__ import annotations

import pytest

from nemo_gym.sandbox import resolve_provider_config as exported_config
from nemo_gym.sandbox import resolve_provider_metadata as exported_metadata
from nemo_gym.sandbox import rewrite_image as exported_rewrite
from nemo_gym.sandbox.config import resolve_provider_config, resolve_provider_metadata
from nemo_gym.sandbox.utils import rewrite_image

GLOBAL = {
    "sandbox": {"local": {"root": "/tmp/x"}, "default_metadata": {"sandbox-api": "local"}},
    "policy_model": {"responses_api_models": {"openai_model": {}}},
}


def test_upstream_paths_export_the_same_functions():
    assert (exported_config, exported_metadata, exported_rewrite) == (resolve_provider_config, resolve_provider_metadata, rewrite_image)


def test_a_named_block_resolves_to_its_one_provider_without_default_metadata():
    assert resolve_provider_config("sandbox", GLOBAL) == {"local": {"root": "/tmp/x"}}
    assert resolve_provider_metadata("sandbox", GLOBAL) == {"sandbox-api": "local"}


def test_an_inline_one_provider_mapping_resolves_as_it_is():
    assert resolve_provider_config({"docker": {"image": "x"}}) == {"docker": {"image": "x"}}
    assert resolve_provider_metadata({"docker": {"image": "x"}}) == {}


def test_an_undefined_name_is_a_value_error_listing_the_blocks_that_look_like_sandboxes():
    with pytest.raises(ValueError, match=r"'missing' is not defined.*'sandbox'"):
        resolve_provider_config("missing", GLOBAL)
    with pytest.raises(ValueError, match="non-empty"):
        resolve_provider_config("", GLOBAL)


def test_a_block_with_other_than_one_provider_key_is_a_value_error():
    with pytest.raises(ValueError, match="exactly one provider key"):
        resolve_provider_config({"local": {}, "docker": {}})
    with pytest.raises(ValueError, match="exactly one provider key"):
        resolve_provider_config({"default_metadata": {}})


def test_default_metadata_that_is_not_a_mapping_is_a_value_error():
    with pytest.raises(ValueError, match="default_metadata"):
        resolve_provider_metadata({"local": {}, "default_metadata": ["a"]})


def test_a_reference_that_is_neither_a_name_nor_a_mapping_is_a_type_error():
    with pytest.raises(TypeError, match="sandbox_provider"):
        resolve_provider_config(3)
