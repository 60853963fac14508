"""An agent's ``sandbox_provider`` to the provider config ``create_provider`` takes.

``sandbox_provider`` is either the name of a top-level block of the config (``sandbox: {local: {...}}``,
usually in a file of its own, so swapping providers is swapping a config file) or such a block
inline. A block holds exactly one provider key, plus an optional ``default_metadata`` mapping: tags
merged under the agent's own ``SandboxSpec.metadata``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

SANDBOX_BLOCK_DEFAULT_METADATA_KEY = "default_metadata"
SANDBOX_BLOCK_RESERVED_KEYS = frozenset({SANDBOX_BLOCK_DEFAULT_METADATA_KEY})


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, Mapping) else value


def _provider_keys(block: Mapping[str, Any]) -> list[str]:
    return [key for key in block if key not in SANDBOX_BLOCK_RESERVED_KEYS]


def _block(sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The block a reference names (or the inline block), and how to name where it came from."""
    if isinstance(sandbox_provider, str):
        if not sandbox_provider:
            raise ValueError("a sandbox provider reference must be a non-empty string")
        block = None if named_configs is None else named_configs.get(sandbox_provider)
        if block is None:
            candidates = sorted(
                str(key) for key, value in (named_configs or {}).items() if isinstance(_plain(value), Mapping) and len(_provider_keys(_plain(value))) == 1
            )
            raise ValueError(
                f"sandbox provider reference {sandbox_provider!r} is not defined in the merged config: add a top-level "
                f"'{sandbox_provider}:' block (a provider's configs/<provider>.yaml in config_paths). "
                f"Available sandbox configs: {', '.join(map(repr, candidates)) or '(none)'}"
            )
        source = f"reference {sandbox_provider!r}"
    elif isinstance(sandbox_provider, Mapping):
        block, source = sandbox_provider, "the inline sandbox_provider"
    else:
        raise TypeError(f"sandbox_provider is a name reference (str) or a single-key provider mapping, not {type(sandbox_provider).__name__}")
    block = _plain(block)
    if not isinstance(block, Mapping):
        raise ValueError(f"the sandbox provider config from {source} must be a mapping, got {block!r}")
    return block, source


def resolve_provider_config(sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{provider_name: provider_kwargs}`` for ``create_provider``, the reserved keys left out."""
    block, source = _block(sandbox_provider, named_configs)
    keys = _provider_keys(block)
    if len(keys) != 1:
        raise ValueError(f"the sandbox provider config from {source} must have exactly one provider key {{provider_name: config}}, got {keys!r}")
    return {keys[0]: block[keys[0]]}


def resolve_provider_metadata(sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The block's ``default_metadata`` (empty without one)."""
    block, source = _block(sandbox_provider, named_configs)
    metadata = block.get(SANDBOX_BLOCK_DEFAULT_METADATA_KEY) or {}
    if not isinstance(metadata, Mapping):
        raise ValueError(f"'{SANDBOX_BLOCK_DEFAULT_METADATA_KEY}' of the sandbox config from {source} must be a mapping, got {metadata!r}")
    return dict(metadata)
