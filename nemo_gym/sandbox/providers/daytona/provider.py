"""The ``daytona`` provider under upstream's name: upstream's config sections (``connection``, ``create``,
``probe``, ``operations``, ``batch``), each refusing a key it does not have as upstream's do, and the
per-sandbox ``provider_options``; a sandbox on it says at use that the Daytona service and SDK are missing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nemo_gym.sandbox.providers.unavailable import UnavailableHereProvider, check_bounds, require_module
from nemo_gym.sandbox.types import SandboxCreateError, SandboxCreateVerificationError


class DaytonaCreateError(SandboxCreateError):
    """Daytona could not create a sandbox."""


class DaytonaCreateTimeoutError(DaytonaCreateError):
    """A Daytona sandbox was not ready in time."""


class DaytonaCreateVerificationError(SandboxCreateVerificationError):
    """A new Daytona sandbox failed its probe."""


class DaytonaConfigBase:
    """A config section built from a mapping; a key the section does not have is a ``ValueError`` naming it."""

    @classmethod
    def from_mapping(cls, value: Any) -> Any:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"{cls.__name__} must be a mapping or {cls.__name__} instance")
        known = {item.name for item in fields(cls) if item.init}
        unknown = sorted(str(key) for key in value if key not in known)
        if unknown:
            raise ValueError(f"Unsupported Daytona {cls.__name__} settings: {', '.join(unknown)}")
        return cls(**value)


@dataclass(frozen=True)
class DaytonaProviderOptions:
    """The per-sandbox options read from ``SandboxSpec.provider_options``."""

    extensions: Mapping[str, str] = field(default_factory=dict)
    snapshot_id: str | None = None
    volumes: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> DaytonaProviderOptions:
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise TypeError("Daytona provider_options must be a mapping")
        allowed = {item.name for item in fields(cls)}
        unknown = set(options) - allowed
        if unknown:
            raise ValueError(f"Unknown Daytona provider option(s): {', '.join(sorted(unknown))}. Supported: {', '.join(sorted(allowed))}")
        extensions = options.get("extensions", {})
        if not isinstance(extensions, Mapping):
            raise TypeError("Daytona provider option 'extensions' must be a mapping")
        snapshot_id = options.get("snapshot_id")
        if snapshot_id is not None and not isinstance(snapshot_id, str):
            raise TypeError("Daytona provider option 'snapshot_id' must be a string")
        volumes = options.get("volumes") or ()
        if not isinstance(volumes, (list, tuple)) or not all(isinstance(volume, Mapping) for volume in volumes):
            raise TypeError("Daytona provider option 'volumes' must be a list of mappings")
        return cls({str(key): str(value) for key, value in extensions.items()}, snapshot_id, tuple(dict(volume) for volume in volumes))


@dataclass(frozen=True)
class DaytonaConnectionConfig(DaytonaConfigBase):
    api_key: str | None = None
    jwt_token: str | None = None
    organization_id: str | None = None
    api_url: str | None = None
    server_url: str | None = None
    target: str | None = None
    connection_pool_maxsize: int | None = None
    otel_enabled: bool | None = None

    def __post_init__(self) -> None:
        check_bounds("connection", self, ("connection_pool_maxsize",), 0, strict=True)


@dataclass(frozen=True)
class DaytonaCreateConfig(DaytonaConfigBase):
    timeout_s: float = 60.0
    retries: int = 2
    retry_delay_s: float = 1.0
    retry_max_delay_s: float = 30.0
    language: str | None = None
    os_user: str | None = None
    public: bool | None = None
    auto_stop_interval: int | None = None
    auto_archive_interval: int | None = None
    auto_delete_interval: int | None = None
    ephemeral: bool | None = None
    network_block_all: bool | None = None
    network_allow_list: str | None = None

    def __post_init__(self) -> None:
        check_bounds("create", self, ("timeout_s", "retries", "retry_delay_s", "retry_max_delay_s"), 0, strict=False)


@dataclass(frozen=True)
class DaytonaProbeConfig(DaytonaConfigBase):
    command: str | None = "printf nemo-rl-sandbox-ready"
    expected_stdout: str | None = "nemo-rl-sandbox-ready"
    timeout_s: int = 30
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.command is not None:
            check_bounds("probe", self, ("timeout_s",), 0, strict=True)
        check_bounds("probe", self, ("deadline_s",), 0, strict=True)


@dataclass(frozen=True)
class DaytonaOperationConfig(DaytonaConfigBase):
    retries: int = 3
    retry_delay_s: float = 1.0
    retry_max_delay_s: float = 15.0
    command_retries: int = 0
    command_timeout_margin_s: float = 60.0
    file_timeout_s: int | None = 30 * 60
    close_timeout_s: float | None = 60.0

    def __post_init__(self) -> None:
        check_bounds("operations", self, ("retries", "retry_delay_s", "retry_max_delay_s", "command_retries", "command_timeout_margin_s"), 0, strict=False)
        check_bounds("operations", self, ("file_timeout_s", "close_timeout_s"), 0, strict=True)


@dataclass(frozen=True)
class DaytonaBatchConfig(DaytonaConfigBase):
    concurrency: int = 4

    def __post_init__(self) -> None:
        check_bounds("batch", self, ("concurrency",), 1, strict=False)


class DaytonaProvider(UnavailableHereProvider):
    name = "daytona"

    def __init__(
        self,
        *,
        connection: DaytonaConnectionConfig | Mapping[str, Any] | None = None,
        create: DaytonaCreateConfig | Mapping[str, Any] | None = None,
        probe: DaytonaProbeConfig | Mapping[str, Any] | None = None,
        operations: DaytonaOperationConfig | Mapping[str, Any] | None = None,
        batch: DaytonaBatchConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self._connection = DaytonaConnectionConfig.from_mapping(connection)
        self._create = DaytonaCreateConfig.from_mapping(create)
        self._probe = DaytonaProbeConfig.from_mapping(probe)
        self._operations = DaytonaOperationConfig.from_mapping(operations)
        self._batch = DaytonaBatchConfig.from_mapping(batch)

    def check_runtime(self) -> str:
        return require_module(self.name, "daytona", "a Daytona account (network)")
