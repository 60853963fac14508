"""The ``openshell`` provider under upstream's name: upstream's config sections (``connection``, ``create``,
``exec``, ``probe``, ``operations``) and per-sandbox ``provider_options`` with upstream's fields, defaults and
checks; a sandbox on it says at use that the OpenShell gateway and SDK are missing here.

Upstream's provider needs the SDK when it is built; this one only when it is used, as the other providers here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nemo_gym.sandbox.providers.unavailable import ContainerProbeConfig, UnavailableHereProvider, check_bounds, coerce_config, require_module
from nemo_gym.sandbox.types import SandboxCreateError, SandboxCreateVerificationError

READY_PROBE_COMMAND = "printf openshell-sandbox-ready"
READY_PROBE_EXPECTED = "openshell-sandbox-ready"
DEFAULT_UPLOAD_CHUNK_BYTES = 512 * 1024


class OpenShellCreateError(SandboxCreateError):
    """OpenShell could not create a sandbox."""


class OpenShellCreateVerificationError(SandboxCreateVerificationError):
    """A new OpenShell sandbox failed its readiness probe."""


@dataclass(frozen=True)
class OpenShellConnectionConfig:
    """The gateway; the defaults are a local plaintext one."""

    endpoint: str = "localhost:8080"
    workspace: str = "default"
    bearer_token: str | None = None
    tls_ca_path: str | None = None
    tls_cert_path: str | None = None
    tls_key_path: str | None = None
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.endpoint:
            raise ValueError("connection.endpoint must be a non-empty host:port")
        if not self.workspace:
            raise ValueError("connection.workspace must be a non-empty workspace name")
        check_bounds("connection", self, ("request_timeout_s",), 0, strict=True)
        if bool(self.tls_cert_path) != bool(self.tls_key_path):
            raise ValueError("connection.tls_cert_path and connection.tls_key_path must be set together")


@dataclass(frozen=True)
class OpenShellCreateConfig:
    ready_timeout_s: float = 300
    poll_interval_s: float = 1.0
    retries: int = 2
    retry_delay_s: float = 1.0
    retry_max_delay_s: float = 30.0

    def __post_init__(self) -> None:
        check_bounds("create", self, ("ready_timeout_s", "poll_interval_s"), 0, strict=True)
        check_bounds("create", self, ("retries", "retry_delay_s", "retry_max_delay_s"), 0, strict=False)


@dataclass(frozen=True)
class OpenShellExecConfig:
    default_timeout_s: float | None = 180
    # In-flight gateway calls of every kind on one connection.
    concurrency: int = 32
    exec_shell: str = "/bin/sh"
    upload_chunk_bytes: int = DEFAULT_UPLOAD_CHUNK_BYTES

    def __post_init__(self) -> None:
        check_bounds("exec", self, ("default_timeout_s",), 0, strict=True)
        check_bounds("exec", self, ("concurrency",), 1, strict=False)
        if not self.exec_shell:
            raise ValueError("exec.exec_shell must be a non-empty shell name/path")
        check_bounds("exec", self, ("upload_chunk_bytes",), 1, strict=False)


@dataclass(frozen=True)
class OpenShellProbeConfig(ContainerProbeConfig):
    command: str | None = READY_PROBE_COMMAND
    expected_stdout: str | None = READY_PROBE_EXPECTED
    deadline_s: float | None = 60
    stable_delay_s: float = 1.0


@dataclass(frozen=True)
class OpenShellOperationsConfig:
    close_wait_deleted: bool = True
    close_timeout_s: float = 60
    poll_interval_s: float = 1.0

    def __post_init__(self) -> None:
        check_bounds("operations", self, ("close_timeout_s", "poll_interval_s"), 0, strict=True)


@dataclass(frozen=True)
class OpenShellProviderOptions:
    """The per-sandbox options read from ``SandboxSpec.provider_options``."""

    providers: list[str] = field(default_factory=list)
    policy: Any | None = None
    template_resources: dict[str, Any] = field(default_factory=dict)
    driver_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> OpenShellProviderOptions:
        allowed = {item.name for item in fields(cls)}
        unknown = set(options) - allowed
        if unknown:
            raise ValueError(f"Unknown openshell provider_options keys: {sorted(unknown)}. Allowed keys: {sorted(allowed)}")
        providers = options.get("providers") or []
        if isinstance(providers, str):
            providers = [providers]
        if not isinstance(providers, (list, tuple)):
            raise TypeError(f"provider_options['providers'] must be a string or list, got {type(providers).__name__}")
        policy = options.get("policy")
        if policy is not None and not isinstance(policy, (str, Mapping)):
            raise TypeError(f"provider_options['policy'] must be a policy YAML path or a mapping, got {type(policy).__name__}")
        mappings = {}
        for name in ("template_resources", "driver_config"):
            value = options.get(name) or {}
            if not isinstance(value, Mapping):
                raise TypeError(f"provider_options[{name!r}] must be a mapping, got {type(value).__name__}")
            mappings[name] = dict(value)
        return cls(providers=[str(item) for item in providers], policy=policy, **mappings)


class OpenShellProvider(UnavailableHereProvider):
    name = "openshell"

    def __init__(
        self,
        *,
        connection: OpenShellConnectionConfig | Mapping[str, Any] | None = None,
        create: OpenShellCreateConfig | Mapping[str, Any] | None = None,
        exec: OpenShellExecConfig | Mapping[str, Any] | None = None,
        probe: OpenShellProbeConfig | Mapping[str, Any] | None = None,
        operations: OpenShellOperationsConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self._connection = coerce_config(connection, OpenShellConnectionConfig)
        self._create_config = coerce_config(create, OpenShellCreateConfig)
        self._exec_config = coerce_config(exec, OpenShellExecConfig)
        self._probe = coerce_config(probe, OpenShellProbeConfig)
        self._operations = coerce_config(operations, OpenShellOperationsConfig)

    def check_runtime(self) -> str:
        return require_module(self.name, "openshell", "an OpenShell gateway")
