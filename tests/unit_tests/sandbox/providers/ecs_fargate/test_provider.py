"""nemo_gym.sandbox.providers.ecs_fargate.provider: upstream's ECS Fargate settings build its engine's config as
upstream's mapping does."""

from __future__ import annotations

import pytest

from nemo_gym.sandbox.providers.ecs_fargate import EcsFargateConfig, EcsFargateProvider, SshSidecarConfig, engine_config_from_mapping


def test_ecs_fargate_settings_build_upstreams_config_as_its_mapping_does():
    config = engine_config_from_mapping({"region": "us-east-1", "cluster": "c", "cpu": 2048, "subnets": ["s-1"], "ssh_sidecar": {"public_key_secret_arn": "pub", "private_key_secret_arn": "priv"}})
    assert (config.cpu, config.assign_public_ip, config.subnets, config.memory) == ("2048", True, ["s-1"], "8192")
    assert config.ssh_sidecar == SshSidecarConfig(sshd_port=52222, public_key_secret_arn="pub", private_key_secret_arn="priv", exec_server_port=19542)
    assert EcsFargateProvider(cluster="c")._cfg == EcsFargateConfig(cluster="c", assign_public_ip=True)
    with pytest.raises(ValueError, match="ssh_sidecar.public_key_secret_arn and ssh_sidecar.private_key_secret_arn are required"):
        engine_config_from_mapping({"ssh_sidecar": {"public_key_secret_arn": "pub"}})
