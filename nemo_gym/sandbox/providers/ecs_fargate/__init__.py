"""Upstream's ecs_fargate sandbox provider (AWS ECS): its configs and provider class (the provider says at use what is missing here)."""

from nemo_gym.sandbox.providers.ecs_fargate.engine import EcsFargateConfig, SshSidecarConfig
from nemo_gym.sandbox.providers.ecs_fargate.provider import EcsFargateProvider, engine_config_from_mapping

__all__ = [
    "EcsFargateConfig",
    "EcsFargateProvider",
    "SshSidecarConfig",
    "engine_config_from_mapping",
]
