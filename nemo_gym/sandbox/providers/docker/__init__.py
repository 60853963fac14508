"""Upstream's docker sandbox provider: its configs, errors and provider class (the provider says at use what is missing here)."""

from nemo_gym.sandbox.providers.docker.provider import (
    DockerCreateConfig,
    DockerCreateError,
    DockerCreateVerificationError,
    DockerExecConfig,
    DockerProbeConfig,
    DockerProvider,
)

__all__ = [
    "DockerCreateConfig",
    "DockerCreateError",
    "DockerCreateVerificationError",
    "DockerExecConfig",
    "DockerProbeConfig",
    "DockerProvider",
]
