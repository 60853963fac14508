"""The provider-neutral sandbox types, under upstream's names: what to start, a handle to it, a command's result, the provider seam."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit


class SandboxStatus(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxResources:
    cpu: float | None = None
    memory_mib: int | None = None
    disk_gib: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    @classmethod
    def from_mapping(cls, resources: Mapping[str, Any] | None) -> "SandboxResources":
        """From a config mapping; a key that is not a resource is a ``ValueError`` naming it."""
        resources = dict(resources or {})
        unknown = sorted(set(resources) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown sandbox resources: {', '.join(unknown)}")
        return cls(**resources)


@dataclass
class SandboxSpec:
    """What to start: an image (ignored by the local provider), a working directory, environment, files to write first."""

    image: str | None = None
    ttl_s: int | float | None = None
    ready_timeout_s: int | float | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # Path in the sandbox -> text to write there before the first command.
    files: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    resources: SandboxResources | Mapping[str, Any] = field(default_factory=SandboxResources)
    entrypoint: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    ports: tuple[int, ...] | list[int] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.resources, SandboxResources):
            self.resources = SandboxResources.from_mapping(self.resources)
        self.ports = tuple(self.ports)


@dataclass(frozen=True)
class SandboxEndpoint:
    """A route to a service inside a sandbox: an absolute URL and the headers a request there must carry."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        endpoint = self.endpoint.strip() if isinstance(self.endpoint, str) else ""
        parts = urlsplit(endpoint)
        if not parts.scheme or not parts.netloc:
            raise ValueError(f"a sandbox endpoint must be an absolute URL, got {self.endpoint!r}")
        if not isinstance(self.headers, Mapping):
            raise TypeError(f"a sandbox endpoint's headers must be a mapping, got {type(self.headers).__name__}")
        object.__setattr__(self, "endpoint", endpoint)
        object.__setattr__(self, "headers", {str(key): str(value) for key, value in self.headers.items()})


@dataclass(frozen=True)
class SandboxHandle:
    sandbox_id: str
    provider_name: str
    raw: Any = None


@dataclass(frozen=True)
class SandboxExecResult:
    """A command's output and exit code; ``error_type`` says why when the command did not run to its end (``"timeout"``)."""

    stdout: str | None
    stderr: str | None
    return_code: int
    error_type: str | None = None


ExecResult = SandboxExecResult


class SandboxCreateError(RuntimeError):
    """A sandbox could not be started."""


class SandboxCreateVerificationError(SandboxCreateError):
    """A sandbox started but failed its provider's readiness check."""


class SandboxProviderUnavailable(RuntimeError):
    """The provider's runtime (a container engine, a cloud service) is not available on this machine."""


class SandboxProvider(Protocol):
    """Where sandboxes run. ``create`` returns once the sandbox can run commands."""

    name: str

    async def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    async def exec(
        self, handle: SandboxHandle, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout_s: int | float | None = None, user: str | int | None = None,
    ) -> SandboxExecResult: ...  # fmt: skip

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None: ...

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None: ...

    async def status(self, handle: SandboxHandle) -> SandboxStatus: ...

    async def close(self, handle: SandboxHandle) -> None: ...

    async def aclose(self) -> None: ...
