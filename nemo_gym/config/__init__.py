"""Merge, validate and resolve the YAML configs that describe which servers to run.

A config maps instance names to ``{server_type: {implementation: {settings}}}``. Its other top-level
keys are upstream NeMo Gym's reserved global keys and plain variables (``policy_base_url`` ...), which
``${...}`` interpolations refer to. Everything here is checked from the config alone, and every error
names the file and the key it is about; checking each instance against its server's own config model
needs the server's code (``nemo_gym.process.discovery``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.config import directives, files, interpolation
from nemo_gym.config.files import ConfigError, Sources, instance_kind
from nemo_gym.config.paths import INSTALL_ROOT, SERVER_TYPES, search_roots
from nemo_gym.config.ports import free_port, port_in_use
from nemo_gym.env import DEFAULT_HOST

REPO_ROOT = INSTALL_ROOT
INSTANCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
# Upstream's global keys: accepted and kept, never read as instances, and handed to every server. Of
# these, this project acts on config_paths and ray_head_node_address (docs/ray.md).
# Upstream also reserves _inherit_from and _copy: here they are directives inside a block
# (directives.py), and one at the top level is an error.
RESERVED_KEYS = frozenset(
    """config_paths entrypoint default_host head_server disallowed_ports head_server_deps python_version
    pip_install_verbose use_absolute_ip uv_pip_set_python skip_venv_if_present hf_token ray_head_node_address
    port_range_low port_range_high dry_run model_endpoint_readiness_timeout_seconds allow_openai_version_skew
    uv_cache_dir uv_venv_dir results_dir cache_dir nemo_gym_log_dir verbose json query
    observability_enabled model_call_capture_dir token_id_capture component_name skip_verification
    skip_verification_reward error_on_almost_servers profiling_enabled profiling_results_dirpath
    uvicorn_logging_show_200_ok uvicorn_timeout_worker_healthcheck""".split()
)


def is_instance(name: str, body: Any) -> bool:
    """A top-level key is an instance when its value names a server type, or has the shape ``{type: {implementation: ...}}``."""
    if name in RESERVED_KEYS or not isinstance(body, dict):
        return False
    return any(key in SERVER_TYPES for key in body) or instance_kind(body) is not None


@dataclass
class Instance:
    """One server instance: its name, type, implementation and settings (ports resolved)."""

    name: str
    server_type: str
    implementation: str
    settings: dict[str, Any]
    source: str = field(default="<config>", compare=False)
    # The file that set each setting, when the config came from several files.
    key_sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    # Where the server's code was found (set by nemo_gym.process.discovery.check_settings).
    directory: Path | None = field(default=None, compare=False)
    # Whether the server's code imports ray (set there too; nemo_gym.ray_cluster.need).
    needs_ray: bool = field(default=False, compare=False)

    @property
    def host(self) -> str:
        return self.settings["host"]

    @property
    def port(self) -> int:
        return self.settings["port"]

    @property
    def num_workers(self) -> int:
        return self.settings["num_workers"]

    @property
    def num_replicas(self) -> int:
        return self.settings.get("num_replicas", 1)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def module(self) -> str:
        """The importable module that defines this server's module-level ``app``."""
        entry = Path(self.settings["entrypoint"]).with_suffix("")
        return ".".join((self.server_type, self.implementation, *entry.parts))

    def to_dict(self) -> dict[str, Any]:
        return {self.name: {self.server_type: {self.implementation: dict(self.settings)}}}

    def where(self, key: str | None = None) -> str:
        """``file: instance.type.implementation[.key]``, naming the file that set ``key`` when it is known."""
        setting = key.split(".", 1)[0] if key else None
        source = self.key_sources.get(setting, self.source) if setting else self.source
        path = f"{self.name}.{self.server_type}.{self.implementation}"
        return f"{source}: {path}.{key}" if key else f"{source}: {path}"


def merge(base: dict, override: dict) -> dict:
    """Deep-merge two config mappings; values in ``override`` win."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def config_of(instances: dict[str, Instance]) -> dict:
    """The ``{name: {type: {implementation: settings}}}`` config of some instances."""
    data: dict = {}
    for instance in instances.values():
        data = merge(data, instance.to_dict())
    return data


def parse(data: dict, sources: dict[str, str] | None = None, check_ports: bool = True) -> dict[str, Instance]:
    """Validate a merged, resolved config and return its instances with host, port and workers filled in."""
    sources = Sources(sources or {})
    instances: dict[str, Instance] = {}
    for name, body in data.items():
        if is_instance(str(name), body):
            instances[str(name)] = _parse_instance(str(name), body, sources)
    for instance in instances.values():
        _check_refs(instance, instances)
    taken: dict[int, list[Instance]] = {}
    for instance in instances.values():
        if instance.settings.get("port") is not None:
            _claim_port(instance, instance.settings["port"], taken)
    for instance in instances.values():
        _resolve_port(instance, check_ports, taken)
    return instances


def resolve(
    paths: Iterable[str | Path],
    overrides: Iterable[str] = (),
    roots: list[Path] | None = None,
    initial: tuple[str, dict] | None = None,
) -> tuple[dict, Sources]:
    """The merged config with its directives applied and every interpolation resolved, and the source of each key."""
    merged, sources = files.read(paths, search_roots() if roots is None else roots, overrides, initial)
    expanded = directives.apply(merged, sources)
    return interpolation.resolve(expanded, sources), sources


def _parse_instance(name: str, body: Any, sources: Sources) -> Instance:
    source = sources.of(name)
    where = f"{source}: {name}"
    if not INSTANCE_NAME.match(name):
        raise ConfigError(f"{where}: instance names are letters, digits, '_' and '-', starting with a letter")
    if not isinstance(body, dict) or len(body) != 1:
        raise ConfigError(f"{where}: must map exactly one server type ({', '.join(SERVER_TYPES)}) to its implementation")
    (server_type, impls), = body.items()
    if server_type not in SERVER_TYPES:
        raise ConfigError(f"{where}: unknown server type {server_type!r}; expected one of {', '.join(SERVER_TYPES)}")
    if not isinstance(impls, dict) or len(impls) != 1:
        raise ConfigError(f"{where}.{server_type}: must map exactly one implementation to its settings")
    (implementation, settings), = impls.items()
    if settings is not None and not isinstance(settings, dict):
        raise ConfigError(f"{where}.{server_type}.{implementation}: settings must be a mapping, got {settings!r}")
    settings = dict(settings or {})
    prefix = f"{name}.{server_type}.{implementation}."
    key_sources = {key[len(prefix) :]: file for key, file in sources.items() if key.startswith(prefix)}
    instance = Instance(name, server_type, implementation, settings, source, key_sources)
    settings.setdefault("entrypoint", "app.py")
    settings.setdefault("host", DEFAULT_HOST)
    settings.setdefault("num_workers", 1)
    workers = settings["num_workers"]
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"{instance.where('num_workers')}: must be a whole number of at least 1, got {workers!r}")
    port = settings.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        raise ConfigError(f"{instance.where('port')}: must be a TCP port number, got {port!r}")
    return instance


def _check_refs(instance: Instance, instances: dict[str, Instance]) -> None:
    for key, value in instance.settings.items():
        if isinstance(value, dict) and set(value) == {"type", "name"}:
            target = instances.get(value["name"])
            if target is None:
                raise ConfigError(f"{instance.where(key)}: refers to instance {value['name']!r}, which the config does not define")
            if target.server_type != value["type"]:
                raise ConfigError(
                    f"{instance.where(key)}: instance {value['name']!r} is a {target.server_type}, not a {value['type']}"
                )


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def _clashes(first: str, second: str) -> bool:
    return first == second or first in WILDCARD_HOSTS or second in WILDCARD_HOSTS


def _claim_port(instance: Instance, port: int, taken: dict[int, list[Instance]]) -> None:
    """Two instances of one config cannot listen on the same address."""
    for other in taken.get(port, []):
        if _clashes(other.host, instance.host):
            raise ConfigError(f"{instance.where('port')}: port {port} on {instance.host} is also the port of instance {other.name!r}")
    taken.setdefault(port, []).append(instance)


def _resolve_port(instance: Instance, check_ports: bool, taken: dict[int, list[Instance]]) -> None:
    port = instance.settings.get("port")
    try:
        if port is None:
            port = free_port(instance.host)
            while any(_clashes(other.host, instance.host) for other in taken.get(port, [])):
                port = free_port(instance.host)
            instance.settings["port"] = port
            _claim_port(instance, port, taken)
        elif check_ports and port_in_use(instance.host, port):
            raise ConfigError(f"{instance.where('port')}: port {port} on {instance.host} is already in use")
    except OSError as error:
        raise ConfigError(f"{instance.where('host')}: cannot listen on {instance.host!r}: {error.strerror or error}") from None

