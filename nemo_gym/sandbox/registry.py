"""Sandbox providers by name: ``local`` runs here; upstream's container and cloud providers are known names that say so at use."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from nemo_gym.sandbox.local import LocalProcessProvider
from nemo_gym.sandbox.types import SandboxProvider

# Upstream's providers that need a container engine, an HPC runtime or a cloud service, by upstream's
# names; each is imported when it is first asked for (as upstream's built-in loaders do).
BUILTIN_PROVIDERS = {
    "apptainer": "ApptainerProvider",
    "daytona": "DaytonaProvider",
    "docker": "DockerProvider",
    "ecs_fargate": "EcsFargateProvider",
    "enroot": "EnrootProvider",
    "opensandbox": "OpenSandboxProvider",
    "openshell": "OpenShellProvider",
}

_PROVIDERS: dict[str, type] = {"local": LocalProcessProvider}


def register_provider(name: str, provider_class: type, *, override: bool = False) -> None:
    if not name:
        raise ValueError("a sandbox provider's name must not be empty")
    if (name in _PROVIDERS or name in BUILTIN_PROVIDERS) and not override:
        raise ValueError(f"sandbox provider {name!r} is already registered")
    _PROVIDERS[name] = provider_class


def get_provider_class(name: str) -> type:
    if name in _PROVIDERS:
        return _PROVIDERS[name]
    if name in BUILTIN_PROVIDERS:
        return getattr(importlib.import_module(f"nemo_gym.sandbox.providers.{name}"), BUILTIN_PROVIDERS[name])
    raise ValueError(f"unknown sandbox provider {name!r}; the providers: {', '.join(list_providers())}")


def list_providers() -> list[str]:
    return sorted({*_PROVIDERS, *BUILTIN_PROVIDERS})


def create_provider(config: Mapping[str, Any]) -> SandboxProvider:
    """The provider a one-key config names, built with its settings: ``{"local": {"root": "/scratch"}}``."""
    if len(config) != 1:
        raise ValueError("a sandbox provider config has exactly one key, the provider's name")
    ((name, settings),) = config.items()
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"sandbox provider {name!r}: its settings are a mapping")
    return get_provider_class(name)(**dict(settings or {}))
