"""The ``enroot`` provider under upstream's name: upstream's ``create``, ``exec`` and ``probe`` config sections;
a sandbox on it says at use that the ``enroot`` binary is missing, or, with it, that this project does not
drive enroot containers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.sandbox.providers.unavailable import ContainerProbeConfig, check_exec, UnavailableHereProvider, coerce_config, require_binary
from nemo_gym.sandbox.types import SandboxCreateError, SandboxCreateVerificationError

DEFAULT_MOUNT_POINT = "/sandbox"
# A shell loop, not `sleep infinity`, which busybox's sleep refuses.
DEFAULT_INIT_COMMAND = "while true; do sleep 86400; done"
READY_PROBE_EXPECTED = "enroot-sandbox-ready"
READY_PROBE_COMMAND = f"printf {READY_PROBE_EXPECTED} > {DEFAULT_MOUNT_POINT}/.nemo-gym-ready && printf {READY_PROBE_EXPECTED}"


class EnrootCreateError(SandboxCreateError):
    """Enroot could not create a sandbox."""


class EnrootCreateVerificationError(SandboxCreateVerificationError):
    """A new container could not run its probe command."""


@dataclass(frozen=True)
class EnrootCreateConfig:
    mount_point: str = DEFAULT_MOUNT_POINT
    # Enroot's paths; None: ENROOT_* from the environment, else under base_dir (or a per-user temporary directory).
    base_dir: str | None = None
    data_path: str | None = None
    cache_path: str | None = None
    runtime_path: str | None = None
    sqsh_cache_dir: str | None = None
    rw: bool = True
    remap_root: bool = False
    # Clear the image's ENTRYPOINT so the init command runs as it is.
    bypass_entrypoint: bool = True
    init_command: str = DEFAULT_INIT_COMMAND
    import_timeout_s: float | None = 1800
    create_timeout_s: float | None = 600
    start_timeout_s: float | None = 600
    start_poll_s: float = 0.5
    extra_import_args: list[str] = field(default_factory=list)
    extra_create_args: list[str] = field(default_factory=list)
    extra_start_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("import_timeout_s", "create_timeout_s", "start_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"create.{name} must be > 0")
        if self.start_poll_s <= 0:
            raise ValueError("create.start_poll_s must be > 0")
        if not self.mount_point.startswith("/"):
            raise ValueError(f"create.mount_point must be an absolute path, got {self.mount_point!r}")


@dataclass(frozen=True)
class EnrootExecConfig:
    default_timeout_s: float | None = 180
    default_mounts: list[str] = field(default_factory=list)
    extra_exec_args: list[str] = field(default_factory=list)
    concurrency: int = 32
    exec_shell: str = "sh"

    def __post_init__(self) -> None:
        check_exec(self)


@dataclass(frozen=True)
class EnrootProbeConfig(ContainerProbeConfig):
    command: str | None = READY_PROBE_COMMAND
    expected_stdout: str | None = READY_PROBE_EXPECTED


def _require_enroot() -> str:
    return require_binary("enroot", "enroot")


class EnrootProvider(UnavailableHereProvider):
    name = "enroot"

    def __init__(
        self,
        *,
        exec: EnrootExecConfig | Mapping[str, Any] | None = None,
        create: EnrootCreateConfig | Mapping[str, Any] | None = None,
        probe: EnrootProbeConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self._exec_config = coerce_config(exec, EnrootExecConfig)
        self._create_config = coerce_config(create, EnrootCreateConfig)
        self._probe = coerce_config(probe, EnrootProbeConfig)

    def check_runtime(self) -> str:
        return _require_enroot()
