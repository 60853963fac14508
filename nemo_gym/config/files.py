"""Read a config's layers and merge them with OmegaConf, remembering which source set each key.

Layers, lowest precedence first: the config files (each after the files its ``config_paths`` lists),
the ``env.yaml`` files of the search roots (a root earlier in the search order wins), then the
command-line overrides. A later layer that gives an instance another server type or implementation
replaces that instance outright instead of merging into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

ENV_FILE = "env.yaml"
COMMAND_LINE = "command line"


class ConfigError(ValueError):
    """A config that cannot be run, with the file and key that are wrong."""


class Sources(dict):
    """``dotted.key.path -> the file (or "command line") that last set it``."""

    def of(self, path: str) -> str:
        """The source of ``path``, or of its nearest parent that has one."""
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            if (source := self.get(".".join(parts[:end]))) is not None:
                return source
        return "<config>"

    def record(self, data: dict, source: str) -> None:
        for path in key_paths(data):
            self[path] = source

    def carry(self, source: str, target: str) -> None:
        """Keys under ``target`` that have no source of their own take the one of the same key under ``source``."""
        for path, file in list(self.items()):
            if path == source or path.startswith(f"{source}."):
                self.setdefault(target + path[len(source) :], file)

    def forget(self, name: str) -> None:
        for path in [path for path in self if path == name or path.startswith(f"{name}.")]:
            del self[path]


def key_paths(data: Any, prefix: str = "") -> Iterator[str]:
    """Every key of a nested mapping as a dotted path (lists are values)."""
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}{key}"
            yield path
            yield from key_paths(value, f"{path}.")


def instance_kind(body: Any) -> tuple[str, str] | None:
    """An instance body's (server type, implementation), or None when it is not ``{type: {implementation: ...}}``."""
    if isinstance(body, dict) and len(body) == 1:
        ((server_type, impls),) = body.items()
        if isinstance(impls, dict) and len(impls) == 1:
            return str(server_type), str(next(iter(impls)))
    return None


def find_file(path: str | Path, roots: list[Path]) -> Path:
    """An absolute path as given; a relative one in the working directory, else under the first search root that has it."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    return next((root / path for root in roots if (root / path).is_file()), path)


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of instance names and variables")
    return data


def file_layers(path: Path, roots: list[Path], including: tuple[Path, ...] = ()) -> Iterator[tuple[str, dict]]:
    """A file's layers: the files its ``config_paths`` lists (each with its own), then the file itself."""
    if path.resolve() in including:
        chain = " -> ".join(str(step) for step in (*including, path.resolve()))
        raise ConfigError(f"{path}: config_paths: the file includes itself ({chain})")
    data = read_yaml(path)
    included = data.get("config_paths") or []
    if not isinstance(included, list) or not all(isinstance(item, str) for item in included):
        raise ConfigError(f"{path}: config_paths: must be a list of file paths, got {included!r}")
    for item in included:
        yield from file_layers(find_file(item, roots), roots, (*including, path.resolve()))
    yield str(path), data


def parse_override(token: str) -> tuple[str, str, Any]:
    """``[+|++]key=value`` -> (prefix, key, value), the value read as YAML (as Hydra and OmegaConf do)."""
    prefix = "++" if token.startswith("++") else "+" if token.startswith("+") else ""
    key, separator, _ = token[len(prefix) :].partition("=")
    if not separator or not key:
        raise ConfigError(f"{COMMAND_LINE}: override {token!r}: expected key=value, +key=value or ++key=value")
    try:
        data = OmegaConf.to_container(OmegaConf.from_dotlist([token[len(prefix) :]]))
    except (OmegaConfBaseException, yaml.YAMLError) as error:
        raise ConfigError(f"{COMMAND_LINE}: override {token!r}: {str(error).splitlines()[0]}") from None
    value: Any = data
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"{COMMAND_LINE}: override {token!r}: keys are dotted names (a.b.c)")
        value = value[part]
    return prefix, key, value


def has_key(data: Any, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def nested(key: str, value: Any) -> dict:
    """``("a.b", 1)`` -> ``{"a": {"b": 1}}``."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def read(
    paths: Iterable[str | Path],
    roots: list[Path],
    overrides: Iterable[str] = (),
    initial: tuple[str, dict] | None = None,
) -> tuple[DictConfig, Sources]:
    """Merge an optional initial layer, the files, the env.yaml files and the overrides, in that order.

    A plain ``key=value`` override must name a key the config already has; ``+``/``++`` set or add.
    """
    parsed = [(token, *parse_override(token)) for token in overrides]
    paths = list(paths)
    for _, _, key, value in parsed:
        if key == "config_paths":
            paths += value if isinstance(value, list) else [value]
    layers: list[tuple[str, dict]] = [initial] if initial else []
    for path in paths:
        layers += file_layers(find_file(path, roots), roots)
    layers += [(str(root / ENV_FILE), read_yaml(root / ENV_FILE)) for root in reversed(roots) if (root / ENV_FILE).is_file()]
    merged, sources = merge_layers(layers, OmegaConf.create({}), Sources())
    for token, prefix, key, value in parsed:
        if key == "config_paths":
            continue
        if not prefix and not has_key(OmegaConf.to_container(merged), key):
            raise ConfigError(f"{COMMAND_LINE}: override {token!r}: the config has no key {key!r}; write +{token} to add it")
        merged, sources = merge_layers([(COMMAND_LINE, nested(key, value))], merged, sources)
    return merged, sources


def merge_layers(layers: Iterable[tuple[str, dict]], merged: DictConfig, sources: Sources) -> tuple[DictConfig, Sources]:
    for source, data in layers:
        data = {key: value for key, value in data.items() if key != "config_paths"}
        current = OmegaConf.to_container(merged)
        for name, body in data.items():
            if name in current and instance_kind(current[name]) not in (None, instance_kind(body)):
                del merged[name]
                sources.forget(str(name))
        sources.record(data, source)
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(data))
        except OmegaConfBaseException as error:
            raise ConfigError(f"{source}: {str(error).splitlines()[0]}") from None
    return merged, sources
