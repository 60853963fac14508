"""The ``ecs_fargate`` provider under upstream's name: its settings are upstream's ``EcsFargateConfig`` keys,
built as upstream's ``engine_config_from_mapping`` builds them; a sandbox on it says at use that AWS (boto3 and
an account) is missing here.

Upstream fills a config that names a ``region`` but no ``cluster`` from AWS SSM parameters; here nothing is
looked up (no network), so such a config keeps its empty cluster. A key ``EcsFargateConfig`` does not have is
logged as a warning (upstream ignores it silently)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from nemo_gym.sandbox.providers.ecs_fargate import engine
from nemo_gym.sandbox.providers.unavailable import UnavailableHereProvider, require_module

LOGGER = logging.getLogger(__name__)

# Where upstream's mapping default differs from the dataclass's.
_MAPPING_DEFAULTS = {"assign_public_ip": True}


def _sidecar_config(sidecar: Any) -> engine.SshSidecarConfig | None:
    if sidecar is None or isinstance(sidecar, engine.SshSidecarConfig):
        return sidecar
    sidecar = dict(sidecar)
    if not sidecar.get("public_key_secret_arn") or not sidecar.get("private_key_secret_arn"):
        raise ValueError("ssh_sidecar.public_key_secret_arn and ssh_sidecar.private_key_secret_arn are required")
    return engine.SshSidecarConfig(
        sshd_port=sidecar.get("sshd_port", engine.DEFAULT_SSHD_PORT),
        ssh_ready_timeout_sec=sidecar.get("ssh_ready_timeout_sec", 300.0),
        public_key_secret_arn=sidecar["public_key_secret_arn"],
        private_key_secret_arn=sidecar["private_key_secret_arn"],
        image=sidecar.get("image"),
        exec_server_port=sidecar.get("exec_server_port", engine.DEFAULT_EXEC_SERVER_PORT),
    )


def engine_config_from_mapping(config: Mapping[str, Any]) -> engine.EcsFargateConfig:
    """An ``EcsFargateConfig`` from the provider's settings: a ``None`` or missing key is its default, ``cpu`` and
    ``memory`` become strings, and ``ssh_sidecar`` needs both of its key secrets."""
    known = {item.name: item for item in dataclasses.fields(engine.EcsFargateConfig)}
    unknown = sorted(set(config) - set(known))
    if unknown:
        LOGGER.warning("ecs_fargate: ignoring settings EcsFargateConfig does not have: %s", ", ".join(unknown))
    settings = {name: value for name, value in config.items() if name in known and value is not None}
    for name, default in _MAPPING_DEFAULTS.items():
        settings.setdefault(name, default)
    for name in ("cpu", "memory"):
        if name in settings:
            settings[name] = str(settings[name])
    if "startup_timeout_sec" in settings:
        settings["startup_timeout_sec"] = float(settings["startup_timeout_sec"])
    settings["ssh_sidecar"] = _sidecar_config(config.get("ssh_sidecar"))
    return engine.EcsFargateConfig(**settings)


class EcsFargateProvider(UnavailableHereProvider):
    name = "ecs_fargate"

    def __init__(self, **config: Any) -> None:
        self._cfg = engine_config_from_mapping(config)

    def check_runtime(self) -> str:
        return require_module(self.name, "boto3", "an AWS account with ECS (network)")
