"""The ``docker`` provider under upstream's name: upstream's three config sections (``create``, ``exec``,
``probe``) with upstream's fields, defaults and checks; a sandbox on it says at use whether the docker CLI
or its daemon is missing (this project does not drive containers, so with both it says that)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.sandbox.providers.unavailable import ContainerProbeConfig, check_exec, UnavailableHereProvider, coerce_config, unavailable
from nemo_gym.sandbox.types import SandboxCreateError, SandboxCreateVerificationError, SandboxHandle, SandboxSpec

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
READY_PROBE_COMMAND = "printf docker-sandbox-ready"
READY_PROBE_EXPECTED = "docker-sandbox-ready"


class DockerCreateError(SandboxCreateError):
    """Docker could not create a sandbox."""


class DockerCreateVerificationError(SandboxCreateVerificationError):
    """A new container failed its readiness probe."""


@dataclass(frozen=True)
class DockerCreateConfig:
    keepalive_shell: str = "/bin/sh"
    keepalive_cmd: str = "while :; do sleep 2147483647; done"
    start_timeout_s: float | None = 600
    use_init: bool = True
    # None: docker's default bridge; "none": no network; anything else names a network.
    network: str | None = None
    read_only: bool = False
    cap_drop: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    pids_limit: int | None = None
    extra_run_args: list[str] = field(default_factory=list)
    apply_resource_limits: bool = True
    publish_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.start_timeout_s is not None and self.start_timeout_s <= 0:
            raise ValueError("create.start_timeout_s must be > 0")
        if self.pids_limit is not None and self.pids_limit <= 0:
            raise ValueError("create.pids_limit must be > 0")
        try:
            ipaddress.ip_address(self.publish_host)
        except ValueError:
            raise ValueError(f"create.publish_host must be an IPv4 or IPv6 address, got {self.publish_host!r}") from None


@dataclass(frozen=True)
class DockerExecConfig:
    default_timeout_s: float | None = 180
    extra_exec_args: list[str] = field(default_factory=list)
    concurrency: int = 32
    # None: bash when the image has it, else sh.
    exec_shell: str | None = None

    def __post_init__(self) -> None:
        check_exec(self)
        if self.exec_shell is not None and not self.exec_shell:
            raise ValueError("exec.exec_shell must be null (auto) or a non-empty shell name or path")


@dataclass(frozen=True)
class DockerProbeConfig(ContainerProbeConfig):
    command: str | None = READY_PROBE_COMMAND
    expected_stdout: str | None = READY_PROBE_EXPECTED


def docker_host() -> str:
    """Where the docker CLI looks for its daemon: ``DOCKER_HOST``, else the default socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def daemon_listens(address: str) -> bool:
    """Whether something accepts a connection at a ``unix://`` or ``tcp://`` docker address."""
    scheme, _, rest = address.partition("://")
    try:
        if scheme == "unix":
            with socket.socket(socket.AF_UNIX) as connection:
                connection.settimeout(2)
                connection.connect(rest)
            return True
        if scheme == "tcp":
            host, _, port = rest.rpartition(":")
            socket.create_connection((host, int(port)), timeout=2).close()
            return True
    except (OSError, ValueError):
        return False
    return False


def _require_docker() -> str:
    binary = shutil.which("docker")
    if binary is None:
        raise unavailable("docker", "the docker provider needs the docker CLI, not found on PATH, and a running docker daemon")
    return binary


class DockerProvider(UnavailableHereProvider):
    name = "docker"

    def __init__(
        self,
        *,
        exec: DockerExecConfig | Mapping[str, Any] | None = None,
        create: DockerCreateConfig | Mapping[str, Any] | None = None,
        probe: DockerProbeConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self._exec_config = coerce_config(exec, DockerExecConfig)
        self._create_config = coerce_config(create, DockerCreateConfig)
        self._probe = coerce_config(probe, DockerProbeConfig)

    def check_runtime(self) -> str:
        binary = _require_docker()
        address = docker_host()
        if not daemon_listens(address):
            raise unavailable(self.name, f"the docker CLI is at {binary} but no docker daemon listens at {address}")
        return f"the docker CLI at {binary} with a daemon at {address}"

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        if spec.image is None:
            raise DockerCreateError("spec.image is required for the docker provider")
        raise self.refusal()
