"""Sandboxes under upstream NeMo Gym's names: ``AsyncSandbox`` on a provider; here the ``local`` provider runs, the others say they cannot."""

from nemo_gym.sandbox.api import AsyncSandbox, Sandbox
from nemo_gym.sandbox.config import resolve_provider_config, resolve_provider_metadata
from nemo_gym.sandbox.local import LocalProcessProvider
from nemo_gym.sandbox.registry import create_provider, get_provider_class, list_providers, register_provider
from nemo_gym.sandbox.types import (
    ExecResult,
    SandboxCreateError,
    SandboxCreateVerificationError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxProvider,
    SandboxProviderUnavailable,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)
from nemo_gym.sandbox.utils import rewrite_image

__all__ = [
    "AsyncSandbox",
    "Sandbox",
    "ExecResult",
    "LocalProcessProvider",
    "SandboxCreateError",
    "SandboxCreateVerificationError",
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
    "resolve_provider_config",
    "resolve_provider_metadata",
    "rewrite_image",
]
