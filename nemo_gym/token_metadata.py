"""What a model server adds to an item it generated, for training: its token ids, their log-probs and routed experts."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel

# Per-token routed expert indices [tokens, moe_layers, top_k], or the trainer's opaque string encoding of them.
RoutedExperts = Union[str, list[list[list[int]]]]
REQUIRED_TOKEN_METADATA_FIELDS = frozenset({"prompt_token_ids", "generation_token_ids", "generation_log_probs"})
TOKEN_METADATA_FIELDS = REQUIRED_TOKEN_METADATA_FIELDS | {"routed_experts"}


class TokenIDLogProbMixin(BaseModel):
    """What a model server adds to an item it generated, for training: the token ids and their log-probs."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Optional[RoutedExperts] = None


def field_of(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def carries_token_metadata(item: Any) -> bool:
    return any(field_of(item, key) is not None for key in TOKEN_METADATA_FIELDS)
