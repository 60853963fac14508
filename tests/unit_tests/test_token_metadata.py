"""nemo_gym.token_metadata: an item carries token metadata when any of its fields is set, as a dict or a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from nemo_gym.token_metadata import TOKEN_METADATA_FIELDS, TokenIDLogProbMixin, carries_token_metadata, field_of

IDS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}


@pytest.mark.parametrize("key", sorted(TOKEN_METADATA_FIELDS))
def test_any_one_field_set_carries_token_metadata_in_a_dict_and_in_an_object(key):
    assert carries_token_metadata({key: []})
    assert carries_token_metadata(SimpleNamespace(**{key: []}))


def test_an_item_without_them_or_with_them_none_carries_none():
    assert not carries_token_metadata({"type": "message", "content": []})
    assert not carries_token_metadata({key: None for key in TOKEN_METADATA_FIELDS})
    assert not carries_token_metadata(SimpleNamespace(type="message"))


def test_a_field_is_read_from_a_dict_or_an_attribute_and_is_none_when_absent():
    assert field_of({"a": 1}, "a") == 1 and field_of(SimpleNamespace(a=1), "a") == 1
    assert field_of({}, "a") is None and field_of(SimpleNamespace(), "a") is None


def test_the_mixin_needs_the_three_lists_and_takes_routed_experts_as_lists_or_a_string():
    assert TokenIDLogProbMixin(**IDS).routed_experts is None
    assert TokenIDLogProbMixin(**IDS, routed_experts=[[[0, 1]]]).routed_experts == [[[0, 1]]]
    assert TokenIDLogProbMixin(**IDS, routed_experts="encoded").routed_experts == "encoded"
    assert carries_token_metadata(TokenIDLogProbMixin(**IDS))
    with pytest.raises(ValidationError, match="generation_log_probs"):
        TokenIDLogProbMixin(prompt_token_ids=[1], generation_token_ids=[2])
