"""Upstream's ``sandbox_provider`` references: a name of a top-level sandbox block in the merged config
(``sandbox: {local: {...}, default_metadata: {...}}``) or an inline ``{provider: {...}}`` mapping, resolved
to the one-provider config ``create_provider`` takes and to the block's ``default_metadata``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SANDBOX_BLOCK_DEFAULT_METADATA_KEY = "default_metadata"


def _plain(value: Any) -> Any:
    """A mapping as a dict (an OmegaConf ``DictConfig`` resolved), anything else as it is."""
    if type(value).__name__ == "DictConfig":
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, Mapping) else value


def _providers(block: Mapping[str, Any]) -> list[str]:
    return [key for key in block if key != SANDBOX_BLOCK_DEFAULT_METADATA_KEY]


def _block(sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None) -> tuple[Any, str]:
    if isinstance(sandbox_provider, Mapping):
        return _plain(sandbox_provider), "the inline sandbox_provider mapping"
    if not isinstance(sandbox_provider, str):
        raise TypeError(f"sandbox_provider must be the name of a sandbox block or a {{provider: config}} mapping, got {type(sandbox_provider).__name__}")
    if not sandbox_provider:
        raise ValueError("sandbox_provider must be a non-empty name")
    named = named_configs or {}
    if named.get(sandbox_provider) is None:
        candidates = sorted(str(name) for name, value in named.items() if isinstance(_plain(value), Mapping) and len(_providers(_plain(value))) == 1)
        raise ValueError(
            f"sandbox_provider {sandbox_provider!r} is not defined in the merged config: add a top-level {sandbox_provider!r} block "
            f"(a provider's config file in the config paths); blocks that look like sandboxes: {', '.join(map(repr, candidates)) or 'none'}"
        )
    return _plain(named[sandbox_provider]), f"sandbox block {sandbox_provider!r}"


def resolve_provider_config(sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{provider_name: settings}`` for ``create_provider``: the block named in ``named_configs`` (the merged
    config) or the inline mapping, without its ``default_metadata``. ValueError unless it has exactly one
    provider key; TypeError for a reference that is neither a name nor a mapping."""
    block, where = _block(sandbox_provider, named_configs)
    if not isinstance(block, Mapping):
        raise ValueError(f"{where} must be a mapping, got {block!r}")
    providers = _providers(block)
    if len(providers) != 1:
        raise ValueError(f"{where} must have exactly one provider key ({{provider_name: config}}), got {providers!r}")
    return {providers[0]: block[providers[0]]}


def resolve_provider_metadata(sandbox_provider: str | Mapping[str, Any], named_configs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The block's ``default_metadata`` (defaults for ``SandboxSpec.metadata``), ``{}`` when it has none."""
    block, where = _block(sandbox_provider, named_configs)
    if not isinstance(block, Mapping):
        raise ValueError(f"{where} must be a mapping, got {block!r}")
    metadata = block.get(SANDBOX_BLOCK_DEFAULT_METADATA_KEY) or {}
    if not isinstance(metadata, Mapping):
        raise ValueError(f"{where}: {SANDBOX_BLOCK_DEFAULT_METADATA_KEY} must be a mapping, got {metadata!r}")
    return dict(metadata)
