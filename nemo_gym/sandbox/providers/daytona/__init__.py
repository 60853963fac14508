"""Upstream's daytona sandbox provider (a cloud service): its configs, errors and provider class (the provider says at use what is missing here)."""

from nemo_gym.sandbox.providers.daytona.provider import (
    DaytonaBatchConfig,
    DaytonaConnectionConfig,
    DaytonaCreateConfig,
    DaytonaCreateError,
    DaytonaCreateTimeoutError,
    DaytonaOperationConfig,
    DaytonaProbeConfig,
    DaytonaProvider,
    DaytonaProviderOptions,
)

__all__ = [
    "DaytonaBatchConfig",
    "DaytonaConnectionConfig",
    "DaytonaCreateConfig",
    "DaytonaCreateError",
    "DaytonaCreateTimeoutError",
    "DaytonaOperationConfig",
    "DaytonaProbeConfig",
    "DaytonaProvider",
    "DaytonaProviderOptions",
]
