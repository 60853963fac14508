"""Upstream's ``nemo_gym.sandbox.providers.base`` path of the provider-neutral sandbox types (defined in ``nemo_gym.sandbox.types``)."""

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

__all__ = [
    "ExecResult",
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
]
