"""Upstream's enroot sandbox provider: its configs, errors and provider class (the provider says at use what is missing here)."""

from nemo_gym.sandbox.providers.enroot.provider import (
    EnrootCreateConfig,
    EnrootCreateError,
    EnrootCreateVerificationError,
    EnrootExecConfig,
    EnrootProbeConfig,
    EnrootProvider,
)

__all__ = [
    "EnrootCreateConfig",
    "EnrootCreateError",
    "EnrootCreateVerificationError",
    "EnrootExecConfig",
    "EnrootProbeConfig",
    "EnrootProvider",
]
