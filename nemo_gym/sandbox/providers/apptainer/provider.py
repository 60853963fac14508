"""The ``apptainer`` provider under upstream's name: upstream's ``create``, ``exec`` and ``probe`` config
sections and its ``bin_path`` (the directory of the ``apptainer`` binary, else ``PATH``); a sandbox on it says
at use that the binary is missing, or, with it, that this project does not drive apptainer instances."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.sandbox.providers.unavailable import ContainerProbeConfig, check_exec, UnavailableHereProvider, coerce_config, require_binary
from nemo_gym.sandbox.types import SandboxCreateError, SandboxCreateVerificationError

DEFAULT_MOUNT_POINT = "/sandbox"
READY_PROBE_COMMAND = "printf apptainer-sandbox-ready"
READY_PROBE_EXPECTED = "apptainer-sandbox-ready"


class ApptainerCreateError(SandboxCreateError):
    """Apptainer could not create a sandbox."""


class ApptainerCreateVerificationError(SandboxCreateVerificationError):
    """A new instance could not run its probe command."""


@dataclass(frozen=True)
class ApptainerCreateConfig:
    mount_point: str = DEFAULT_MOUNT_POINT
    start_timeout_s: float | None = 600
    extra_start_args: list[str] = field(default_factory=list)
    apply_resource_limits: bool = True

    def __post_init__(self) -> None:
        if self.start_timeout_s is not None and self.start_timeout_s <= 0:
            raise ValueError("create.start_timeout_s must be > 0")
        if not self.mount_point.startswith("/"):
            raise ValueError(f"create.mount_point must be an absolute path, got {self.mount_point!r}")


@dataclass(frozen=True)
class ApptainerExecConfig:
    default_timeout_s: float | None = 180
    fakeroot_for_root: bool = True
    default_binds: list[str] = field(default_factory=list)
    extra_exec_args: list[str] = field(default_factory=list)
    concurrency: int = 32

    def __post_init__(self) -> None:
        check_exec(self)


@dataclass(frozen=True)
class ApptainerProbeConfig(ContainerProbeConfig):
    command: str | None = READY_PROBE_COMMAND
    expected_stdout: str | None = READY_PROBE_EXPECTED


def _require_apptainer(bin_path: str | None = None) -> str:
    return require_binary("apptainer", "apptainer", bin_path)


class ApptainerProvider(UnavailableHereProvider):
    name = "apptainer"

    def __init__(
        self,
        *,
        exec: ApptainerExecConfig | Mapping[str, Any] | None = None,
        create: ApptainerCreateConfig | Mapping[str, Any] | None = None,
        probe: ApptainerProbeConfig | Mapping[str, Any] | None = None,
        bin_path: str | None = None,
    ) -> None:
        self._exec_config = coerce_config(exec, ApptainerExecConfig)
        self._create_config = coerce_config(create, ApptainerCreateConfig)
        self._probe = coerce_config(probe, ApptainerProbeConfig)
        self._bin_path = bin_path

    def check_runtime(self) -> str:
        return _require_apptainer(self._bin_path)
