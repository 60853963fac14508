"""Upstream's opensandbox sandbox provider (a remote service): its configs, errors and provider class (the provider says at use what is missing here)."""

from nemo_gym.sandbox.providers.opensandbox.provider import (
    OpenSandboxAttributionConfig,
    OpenSandboxConnectionConfig,
    OpenSandboxCreateConfig,
    OpenSandboxCreateError,
    OpenSandboxCreateTimeoutError,
    OpenSandboxCreateVerificationError,
    OpenSandboxOperationConfig,
    OpenSandboxProbeConfig,
    OpenSandboxProvider,
)

__all__ = [
    "OpenSandboxAttributionConfig",
    "OpenSandboxConnectionConfig",
    "OpenSandboxCreateConfig",
    "OpenSandboxCreateError",
    "OpenSandboxCreateTimeoutError",
    "OpenSandboxCreateVerificationError",
    "OpenSandboxOperationConfig",
    "OpenSandboxProbeConfig",
    "OpenSandboxProvider",
]
