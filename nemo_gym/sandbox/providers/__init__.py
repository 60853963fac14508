"""Upstream's ``nemo_gym.sandbox.providers`` path: the provider seam's types and the registry, as ``nemo_gym.sandbox`` has them."""

from nemo_gym.sandbox.providers import base
from nemo_gym.sandbox.providers.base import *  # noqa: F403 (the types, under upstream's path)
from nemo_gym.sandbox.registry import create_provider, get_provider_class, list_providers, register_provider

__all__ = [*base.__all__, "create_provider", "get_provider_class", "list_providers", "register_provider"]
