"""Upstream's ``nemo_gym.sandbox.providers`` path: the provider seam's types and the registry, as ``nemo_gym.sandbox`` has them."""

from nemo_gym.sandbox.providers.base import (
    ExecResult,
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxProvider,
    SandboxProviderUnavailable,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)
from nemo_gym.sandbox.registry import create_provider, get_provider_class, list_providers, register_provider

__all__ = [
    "ExecResult",
    "SandboxCreateError",
    "SandboxEndpoint",
    "SandboxExecResult",
    "SandboxHandle",
    "SandboxProvider",
    "SandboxProviderUnavailable",
    "SandboxResources",
    "SandboxSpec",
    "SandboxStatus",
    "create_provider",
    "get_provider_class",
    "list_providers",
    "register_provider",
]
