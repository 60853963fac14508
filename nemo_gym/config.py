"""Load, merge, validate and resolve the YAML configs that describe which servers to run.

A config maps instance names to ``{server_type: {implementation: {settings}}}``. Several files merge
key by key, later files winning. Loading checks everything that can be checked before a process
starts, and every error names the file and the key it is about.
"""

from __future__ import annotations

import errno
import importlib
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models")
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HOST = "127.0.0.1"
INSTANCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


class ConfigError(ValueError):
    """A config that cannot be run, with the file and key that are wrong."""


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
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def module(self) -> str:
        """The importable module that defines this server's module-level ``app``."""
        entry = Path(self.settings["entrypoint"]).with_suffix("")
        return ".".join((self.server_type, self.implementation, *entry.parts))

    def to_dict(self) -> dict[str, Any]:
        return {self.name: {self.server_type: {self.implementation: dict(self.settings)}}}


def merge(base: dict, override: dict) -> dict:
    """Deep-merge two config mappings; values in ``override`` win."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_files(paths: list[str | Path]) -> tuple[dict, dict[str, str]]:
    """Read and merge YAML files.

    Returns the merged mapping and where each part came from: per instance name, the file that last
    set it, and per ``<instance>.<setting>``, the file that last set that setting. A later file that
    gives an instance another server type or implementation replaces that instance outright.
    """
    merged: dict = {}
    sources: dict[str, str] = {}
    for path in paths:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as error:
            raise ConfigError(f"{path}: cannot read config: {error.strerror}") from error
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from error
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of instance names")
        for name, body in data.items():
            name = str(name)
            if name in merged and _kind(merged[name]) != _kind(body):
                del merged[name]
                for key in [key for key in sources if key.startswith(f"{name}.")]:
                    del sources[key]
            sources[name] = str(path)
            for key in _settings(body):
                sources[f"{name}.{key}"] = str(path)
        merged = merge(merged, data)
    return merged, sources


def _kind(body: Any) -> tuple[str, str] | None:
    """An instance body's (server type, implementation), or None when it is not in that shape."""
    if isinstance(body, dict) and len(body) == 1:
        (server_type, impls), = body.items()
        if isinstance(impls, dict) and len(impls) == 1:
            return str(server_type), str(next(iter(impls)))
    return None


def _settings(body: Any) -> list[str]:
    if _kind(body) is None:
        return []
    settings = next(iter(next(iter(body.values())).values()))
    return [str(key) for key in settings] if isinstance(settings, dict) else []


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port``; other failures (a host not on this machine) raise OSError."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def parse(data: dict, sources: dict[str, str] | None = None, check_ports: bool = True) -> dict[str, Instance]:
    """Validate a merged config and return its instances with host, port and workers filled in."""
    sources = sources or {}
    instances: dict[str, Instance] = {}
    for name, body in data.items():
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


def load(paths: list[str | Path], check_ports: bool = True) -> dict[str, Instance]:
    """Read config files and check them, each instance's settings against its server's own config model."""
    data, sources = read_files(paths)
    instances = parse(data, sources, check_ports)
    check_settings(instances)
    return instances


def check_settings(instances: dict[str, Instance]) -> None:
    """Validate every instance's settings with its server class's config model (unknown keys are typos)."""
    for instance in instances.values():
        try:
            server_class = importlib.import_module(instance.module).app.server_class
        except (ImportError, AttributeError) as error:
            raise ConfigError(f"{_where(instance, 'entrypoint')}: cannot load a server app from {instance.module}: {error!r}") from error
        try:
            server_class.config_class.model_validate(instance.settings)
        except ValidationError as error:
            problem = error.errors()[0]
            key = ".".join(str(part) for part in problem["loc"])
            raise ConfigError(f"{_where(instance, key)}: {problem['msg']}") from None


def _where(instance: Instance, key: str | None = None) -> str:
    """``file: instance.type.implementation[.key]``, naming the file that set ``key`` when it is known."""
    setting = key.split(".", 1)[0] if key else None
    source = instance.key_sources.get(setting, instance.source) if setting else instance.source
    path = f"{instance.name}.{instance.server_type}.{instance.implementation}"
    return f"{source}: {path}.{key}" if key else f"{source}: {path}"


def _parse_instance(name: str, body: Any, sources: dict[str, str]) -> Instance:
    source = sources.get(name, "<config>")
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
    if not (REPO_ROOT / server_type / implementation).is_dir():
        raise ConfigError(f"{where}.{server_type}.{implementation}: no implementation directory {server_type}/{implementation}")
    if settings is not None and not isinstance(settings, dict):
        raise ConfigError(f"{where}.{server_type}.{implementation}: settings must be a mapping, got {settings!r}")
    settings = dict(settings or {})
    key_sources = {key[len(name) + 1 :]: file for key, file in sources.items() if key.startswith(f"{name}.")}
    instance = Instance(name, server_type, implementation, settings, source, key_sources)
    settings.setdefault("entrypoint", "app.py")
    settings.setdefault("host", DEFAULT_HOST)
    settings.setdefault("num_workers", 1)
    if not (REPO_ROOT / server_type / implementation / settings["entrypoint"]).is_file():
        raise ConfigError(f"{_where(instance, 'entrypoint')}: no file {server_type}/{implementation}/{settings['entrypoint']}")
    workers = settings["num_workers"]
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"{_where(instance, 'num_workers')}: must be a whole number of at least 1, got {workers!r}")
    port = settings.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        raise ConfigError(f"{_where(instance, 'port')}: must be a TCP port number, got {port!r}")
    return instance


def _check_refs(instance: Instance, instances: dict[str, Instance]) -> None:
    for key, value in instance.settings.items():
        if isinstance(value, dict) and set(value) == {"type", "name"}:
            target = instances.get(value["name"])
            if target is None:
                raise ConfigError(f"{_where(instance, key)}: refers to instance {value['name']!r}, which the config does not define")
            if target.server_type != value["type"]:
                raise ConfigError(
                    f"{_where(instance, key)}: instance {value['name']!r} is a {target.server_type}, not a {value['type']}"
                )


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def _clashes(first: str, second: str) -> bool:
    return first == second or first in WILDCARD_HOSTS or second in WILDCARD_HOSTS


def _claim_port(instance: Instance, port: int, taken: dict[int, list[Instance]]) -> None:
    """Two instances of one config cannot listen on the same address."""
    for other in taken.get(port, []):
        if _clashes(other.host, instance.host):
            raise ConfigError(f"{_where(instance, 'port')}: port {port} on {instance.host} is also the port of instance {other.name!r}")
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
            raise ConfigError(f"{_where(instance, 'port')}: port {port} on {instance.host} is already in use")
    except OSError as error:
        raise ConfigError(f"{_where(instance, 'host')}: cannot listen on {instance.host!r}: {error.strerror or error}") from None


class ServerRef(BaseModel):
    """A reference from one instance's settings to another instance: ``{type: ..., name: ...}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["resources_servers", "responses_api_agents", "responses_api_models"]
    name: str
