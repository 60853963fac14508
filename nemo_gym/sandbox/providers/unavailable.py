"""The base of upstream's providers whose runtime this project does not drive: built from their configs as
upstream's are (a mapping or a config instance per section), and at first use (``create``, ``exec``, files,
``status``, ``close``) a ``SandboxProviderUnavailable`` that names what this machine lacks.

Building a provider never raises for a missing runtime (upstream's container providers raise at
construction): a config that names one loads, and a server that builds one at start-up starts.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.types import SandboxExecResult, SandboxHandle, SandboxProviderUnavailable, SandboxSpec, SandboxStatus


def coerce_config(value: Any, config_class: type) -> Any:
    """A provider's config section: ``None`` is the defaults, a mapping its fields (an unknown key is a ``TypeError``)."""
    if value is None:
        return config_class()
    if isinstance(value, config_class):
        return value
    if isinstance(value, Mapping):
        return config_class(**value)
    raise TypeError(f"{config_class.__name__} must be a mapping or {config_class.__name__} instance")


def check_bounds(section: str, config: Any, names: tuple[str, ...], bound: float, strict: bool) -> None:
    """Upstream's config checks: each named field, unless ``None``, is above (``strict``) or at least ``bound``."""
    for name in names:
        value = getattr(config, name)
        if value is not None and (value <= bound if strict else value < bound):
            raise ValueError(f"{section}.{name} must be {'>' if strict else '>='} {bound:g}")


@dataclass(frozen=True)
class ContainerProbeConfig:
    """A provider's readiness probe, with upstream's fields and checks; each provider's own class
    (``DockerProbeConfig``, ``OpenSandboxProbeConfig``, ...) gives the command and the output it expects."""

    command: str | None = None
    expected_stdout: str | None = None
    timeout_s: int = 30
    deadline_s: float | None = None
    stable_count: int = 1
    stable_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.command is not None:
            check_bounds("probe", self, ("timeout_s",), 0, strict=True)
        check_bounds("probe", self, ("deadline_s",), 0, strict=True)
        check_bounds("probe", self, ("stable_count",), 1, strict=False)
        check_bounds("probe", self, ("stable_delay_s",), 0, strict=False)


def check_exec(config: Any) -> None:
    """A container provider's exec section, as upstream checks it: a positive timeout (or none), one or more at once."""
    check_bounds("exec", config, ("default_timeout_s",), 0, strict=True)
    check_bounds("exec", config, ("concurrency",), 1, strict=False)


def unavailable(name: str, missing: str) -> SandboxProviderUnavailable:
    return SandboxProviderUnavailable(f"{name} is not available on this machine: {missing}; use the local provider")


def require_binary(provider_name: str, binary: str, directory: str | None = None) -> str:
    """The path of ``binary`` (in ``directory`` when given, else on ``PATH``); ``SandboxProviderUnavailable`` without it."""
    found = shutil.which(binary, path=directory) if directory else shutil.which(binary)
    if found is None:
        where = f"in {directory}" if directory else "on PATH"
        raise unavailable(provider_name, f"the {provider_name} provider needs the {binary} CLI, not found {where}")
    return found


def require_module(provider_name: str, module: str, service: str) -> str:
    """What a remote provider found (its SDK, by module name); ``SandboxProviderUnavailable`` without it."""
    if importlib.util.find_spec(module) is None:
        raise unavailable(provider_name, f"the {provider_name} provider needs {service} and its Python SDK (module {module!r}), not installed")
    return f"the {module!r} SDK"


class UnavailableHereProvider:
    """Subclasses set ``name``; ``check_runtime()`` raises what this machine lacks, else returns what it found."""

    name: str

    def check_runtime(self) -> str:
        raise NotImplementedError

    def refusal(self) -> SandboxProviderUnavailable:
        found = self.check_runtime()
        return unavailable(self.name, f"{found} is here, but this project does not drive {self.name} containers")

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        raise self.refusal()

    async def exec(
        self, handle: SandboxHandle, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout_s: int | float | None = None, user: str | int | None = None,
    ) -> SandboxExecResult:  # fmt: skip
        raise self.refusal()

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        raise self.refusal()

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        raise self.refusal()

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        raise self.refusal()

    async def close(self, handle: SandboxHandle) -> None:
        raise self.refusal()

    async def aclose(self) -> None:
        """Nothing was started, so there is nothing to release."""
