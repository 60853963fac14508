"""Sandbox providers by name: ``local`` runs here; upstream's container and cloud providers are known names that say so at use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_gym.sandbox.local import LocalProcessProvider
from nemo_gym.sandbox.types import SandboxProvider, SandboxProviderUnavailable

# Upstream's providers that need a container engine, an HPC runtime or a cloud account.
UNAVAILABLE_PROVIDERS = ("apptainer", "daytona", "docker", "ecs_fargate", "enroot", "opensandbox", "openshell")


def unavailable_provider(provider_name: str) -> type:
    """A provider class that can be named and built (a config that names it loads) but raises at first use."""

    class UnavailableProvider:
        name = provider_name

        def __init__(self, **settings: Any) -> None:
            self.settings = settings

        def __getattr__(self, operation: str) -> Any:
            if operation.startswith("_"):
                raise AttributeError(operation)

            async def refuse(*args: Any, **kwargs: Any) -> Any:
                if operation == "aclose":
                    return None
                raise SandboxProviderUnavailable(
                    f"the {provider_name!r} sandbox provider is not available here; use the 'local' provider (nemo_gym.sandbox.local)"
                )

            return refuse

    UnavailableProvider.__name__ = f"Unavailable_{provider_name}"
    return UnavailableProvider


_PROVIDERS: dict[str, type] = {"local": LocalProcessProvider, **{name: unavailable_provider(name) for name in UNAVAILABLE_PROVIDERS}}


def register_provider(name: str, provider_class: type, *, override: bool = False) -> None:
    if not name:
        raise ValueError("a sandbox provider's name must not be empty")
    if name in _PROVIDERS and not override:
        raise ValueError(f"sandbox provider {name!r} is already registered")
    _PROVIDERS[name] = provider_class


def get_provider_class(name: str) -> type:
    try:
        return _PROVIDERS[name]
    except KeyError:
        raise ValueError(f"unknown sandbox provider {name!r}; the providers: {', '.join(list_providers())}") from None


def list_providers() -> list[str]:
    return sorted(_PROVIDERS)


def create_provider(config: Mapping[str, Any]) -> SandboxProvider:
    """The provider a one-key config names, built with its settings: ``{"local": {"root": "/scratch"}}``."""
    if len(config) != 1:
        raise ValueError("a sandbox provider config has exactly one key, the provider's name")
    ((name, settings),) = config.items()
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"sandbox provider {name!r}: its settings are a mapping")
    return get_provider_class(name)(**dict(settings or {}))
