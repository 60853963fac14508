"""Upstream's openshell sandbox provider (a remote gateway): its configs, errors and provider class (the provider says at use what is missing here)."""

from nemo_gym.sandbox.providers.openshell.provider import (
    OpenShellConnectionConfig,
    OpenShellCreateConfig,
    OpenShellCreateError,
    OpenShellCreateVerificationError,
    OpenShellExecConfig,
    OpenShellOperationsConfig,
    OpenShellProbeConfig,
    OpenShellProvider,
    OpenShellProviderOptions,
)

__all__ = [
    "OpenShellConnectionConfig",
    "OpenShellCreateConfig",
    "OpenShellCreateError",
    "OpenShellCreateVerificationError",
    "OpenShellExecConfig",
    "OpenShellOperationsConfig",
    "OpenShellProbeConfig",
    "OpenShellProvider",
    "OpenShellProviderOptions",
]
