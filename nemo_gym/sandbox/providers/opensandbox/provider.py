"""The ``opensandbox`` provider under upstream's name: upstream's config sections (``connection``, ``create``,
``probe``, ``operations``, ``attribution``) with upstream's fields, defaults and checks; a sandbox on it says at
use that the OpenSandbox server and SDK are missing here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_gym.sandbox.providers.unavailable import ContainerProbeConfig, UnavailableHereProvider, check_bounds, coerce_config, require_module
from nemo_gym.sandbox.types import SandboxCreateError, SandboxCreateVerificationError

DEFAULT_ATTRIBUTION_KEY_PREFIX = "nemo-gym.nvidia.com/"
# A lowercase DNS subdomain: a Kubernetes label key's prefix.
ATTRIBUTION_KEY_PREFIX_RE = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DEFAULT_IMAGE_PULL_POLICY = "IfNotPresent"
VALID_IMAGE_PULL_POLICIES = {"Always", "IfNotPresent", "Never"}


class OpenSandboxCreateError(SandboxCreateError):
    """OpenSandbox could not create a sandbox."""


class OpenSandboxCreateTimeoutError(OpenSandboxCreateError):
    """An OpenSandbox sandbox was not ready in time."""


class OpenSandboxCreateVerificationError(SandboxCreateVerificationError):
    """A new OpenSandbox sandbox failed its probe."""


def validate_image_pull_policy(image_pull_policy: str) -> str:
    if image_pull_policy not in VALID_IMAGE_PULL_POLICIES:
        raise ValueError(f"image_pull_policy must be one of: {', '.join(sorted(VALID_IMAGE_PULL_POLICIES))}")
    return image_pull_policy


@dataclass(frozen=True)
class OpenSandboxConnectionConfig:
    domain: str | None = None
    api_key: str | None = None
    protocol: str | None = None
    request_timeout_s: int | None = None
    use_server_proxy: bool = False
    disable_connection_pooling: bool = False
    keepalive_expiry_s: float | None = 3.0
    max_keepalive_connections: int = 20
    max_connections: int | None = 100
    connect_retries: int = 2
    transport_backend: str = "httpx"


@dataclass(frozen=True)
class OpenSandboxAttributionConfig:
    """Job attribution added to every sandbox's metadata; ``key_prefix`` is kept with one trailing ``/`` (or ``""``)."""

    enabled: bool = True
    team: str | None = None
    user: str | None = None
    workload: str | None = None
    run: str | None = None
    key_prefix: str = DEFAULT_ATTRIBUTION_KEY_PREFIX

    def __post_init__(self) -> None:
        prefix = self.key_prefix.strip()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        if prefix and not ATTRIBUTION_KEY_PREFIX_RE.fullmatch(prefix[:-1]):
            raise ValueError(
                f"attribution key_prefix {self.key_prefix!r} must be a lowercase DNS subdomain "
                "(Kubernetes label-key prefix), e.g. 'nemo-gym.nvidia.com/', or '' for bare keys"
            )
        object.__setattr__(self, "key_prefix", prefix)


@dataclass(frozen=True)
class OpenSandboxCreateConfig:
    request_timeout_s: int | None = None
    timeout_s: float | None = None
    retries: int = 2
    retry_delay_s: float = 5.0
    retry_max_delay_s: float = 60.0
    image_pull_policy: str | None = DEFAULT_IMAGE_PULL_POLICY
    skip_health_check: bool = False
    connect_attempt_timeout_s: float = 30.0
    connect_poll_s: float = 2.0

    def __post_init__(self) -> None:
        if self.image_pull_policy is not None:
            validate_image_pull_policy(self.image_pull_policy)
        check_bounds("create", self, ("timeout_s",), 0, strict=True)
        check_bounds("create", self, ("retries", "retry_delay_s", "retry_max_delay_s"), 0, strict=False)
        check_bounds("create", self, ("connect_attempt_timeout_s", "connect_poll_s"), 0, strict=True)


@dataclass(frozen=True)
class OpenSandboxProbeConfig(ContainerProbeConfig):
    command: str | None = "printf nemo-gym-sandbox-ready"
    expected_stdout: str | None = "nemo-gym-sandbox-ready"


@dataclass(frozen=True)
class OpenSandboxOperationConfig:
    retries: int = 3
    retry_delay_s: float = 1.0
    retry_max_delay_s: float = 15.0
    command_retries: int = 0
    close_timeout_s: float | None = 30.0
    # Poll a command's status instead of holding one stream open (for load balancers that cut long streams).
    background_exec: bool = False
    background_poll_initial_s: float = 0.25
    background_poll_interval_s: float = 2.0

    def __post_init__(self) -> None:
        check_bounds("operations", self, ("retries", "retry_delay_s", "retry_max_delay_s", "command_retries"), 0, strict=False)
        check_bounds("operations", self, ("close_timeout_s", "background_poll_interval_s", "background_poll_initial_s"), 0, strict=True)


class OpenSandboxProvider(UnavailableHereProvider):
    name = "opensandbox"

    def __init__(
        self,
        *,
        connection: OpenSandboxConnectionConfig | Mapping[str, Any] | None = None,
        create: OpenSandboxCreateConfig | Mapping[str, Any] | None = None,
        probe: OpenSandboxProbeConfig | Mapping[str, Any] | None = None,
        operations: OpenSandboxOperationConfig | Mapping[str, Any] | None = None,
        attribution: OpenSandboxAttributionConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self._connection = coerce_config(connection, OpenSandboxConnectionConfig)
        self._create = coerce_config(create, OpenSandboxCreateConfig)
        self._probe = coerce_config(probe, OpenSandboxProbeConfig)
        self._operations = coerce_config(operations, OpenSandboxOperationConfig)
        self._attribution = coerce_config(attribution, OpenSandboxAttributionConfig)

    def check_runtime(self) -> str:
        return require_module(self.name, "opensandbox", "an OpenSandbox server")
