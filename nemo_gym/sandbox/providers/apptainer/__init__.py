"""Upstream's apptainer sandbox provider: its configs, errors and provider class (the provider says at use what is missing here)."""

from nemo_gym.sandbox.providers.apptainer.provider import (
    ApptainerCreateConfig,
    ApptainerCreateError,
    ApptainerCreateVerificationError,
    ApptainerExecConfig,
    ApptainerProbeConfig,
    ApptainerProvider,
)

__all__ = [
    "ApptainerCreateConfig",
    "ApptainerCreateError",
    "ApptainerCreateVerificationError",
    "ApptainerExecConfig",
    "ApptainerProbeConfig",
    "ApptainerProvider",
]
