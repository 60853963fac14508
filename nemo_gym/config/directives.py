"""Apply upstream NeMo Gym's block directives to a merged config: ``_inherit_from``, ``_copy``, ``_delete_key``.

A block (any mapping below the top level) that says ``_inherit_from: counter`` becomes the block at
the dotted path ``counter`` with its own keys merged over it, and ``counter`` leaves the config;
``_copy`` does the same and keeps the source. ``bench: ${inherit_from:counter}`` and
``bench: ${copy:counter}`` take the source as it is. ``_delete_key: "a, b"`` then removes those keys
from the block.

Order: the directives apply to the fully merged config (files, env.yaml, command line), so an
override of a source reaches every block that takes it, an override of the block wins over the
source, and an override may add a directive. Interpolation comes after, so a ``${...}`` in a moved
block resolves at its new place (``${.key}`` among its new siblings) and a ``???`` under a deleted key
is never asked for. A source is taken with its own directives applied, so a block may inherit one
that inherits. A missing path, a cycle and a misspelt directive are errors naming the file and key.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_gym.config.files import ConfigError, Sources

INHERIT = "_inherit_from"
COPY = "_copy"
DELETE = "_delete_key"
DIRECTIVES = (INHERIT, COPY, DELETE)
INTERPOLATED = re.compile(r"\$\{(inherit_from|copy):\s*([^{}]*?)\s*\}")


def apply(config: DictConfig, sources: Sources) -> DictConfig:
    """The config with every directive applied; ``sources`` follows the keys that moved."""
    data = OmegaConf.to_container(config)
    expansion = Expansion(data, sources)
    result = expansion.expand("", data)
    for path in expansion.moved:
        remove(result, path)
        sources.forget(path)
    expansion.delete_listed("", result)
    return OmegaConf.create(result)


def join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def overlaps(first: str, second: str) -> bool:
    return first == second or first.startswith(f"{second}.") or second.startswith(f"{first}.")


def remove(data: dict, path: str) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data.get(part) if isinstance(data, dict) else None
    if isinstance(data, dict):
        data.pop(last, None)


class Expansion:
    """One pass over a merged config; reads the config as merged, never the half-expanded result."""

    def __init__(self, data: dict, sources: Sources) -> None:
        self.data = data
        self.sources = sources
        self.moved: set[str] = set()
        # The directives being applied, outermost first, as (block path, directive key path).
        self.applying: list[tuple[str, str]] = []

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.sources.of(key)}: {key}: {problem}")

    def expand(self, path: str, value: Any) -> Any:
        """``value``, found at ``path``, with every directive inside it applied."""
        if isinstance(value, str) and (match := INTERPOLATED.fullmatch(value)):
            return self.take(path, path, match[2], move=match[1] == "inherit_from", local={})
        if isinstance(value, list):
            return [self.expand(join(path, index), item) for index, item in enumerate(value)]
        if not isinstance(value, dict):
            return value
        self.check_keys(path, value)
        local = {key: self.expand(join(path, key), item) for key, item in value.items() if key not in (INHERIT, COPY)}
        if INHERIT in value or COPY in value:
            directive = INHERIT if INHERIT in value else COPY
            return self.take(path, join(path, directive), value[directive], move=directive == INHERIT, local=local)
        return local

    def check_keys(self, path: str, block: dict) -> None:
        if not path and (found := [key for key in DIRECTIVES if key in block]):
            raise self.error(found[0], "a directive goes inside a block (bench: {_inherit_from: counter}), not at the top level")
        if INHERIT in block and COPY in block:
            raise self.error(join(path, COPY), f"only one of {INHERIT} and {COPY} can be given in a block")
        for key in block:
            if str(key).startswith("_") and key not in DIRECTIVES:
                if close := difflib.get_close_matches(str(key), DIRECTIVES, n=1, cutoff=0.75):
                    raise self.error(join(path, key), f"unknown directive; did you mean {close[0]!r}?")

    def take(self, block: str, key: str, source: Any, move: bool, local: Any) -> Any:
        """The value at ``source`` (its directives applied), with ``local`` merged over it."""
        if not isinstance(source, str) or not source:
            raise self.error(key, f"must be a dotted key path such as counter or a.b, got {source!r}")
        if overlaps(block, source):
            raise self.error(key, f"{source!r} is this block, holds it or lies inside it; a block cannot take from itself")
        applying = [path for path, _ in self.applying]
        if source in applying:
            start = applying.index(source)
            chain = " -> ".join([*applying[start:], block, source])
            raise self.error(self.applying[start][1], f"the blocks take from each other in a cycle: {chain}")
        self.applying.append((block, key))
        taken = self.expand(source, self.lookup(key, source))
        self.delete_listed(source, taken)
        self.applying.pop()
        if local:
            if not isinstance(taken, dict):
                raise self.error(key, f"{source!r} is {taken!r}, not a block that keys can merge over")
            taken = OmegaConf.to_container(OmegaConf.merge(taken, local))
        self.sources.carry(source, block)
        # A block's _delete_key may list keys that only the merge brought in, so it applies after it.
        self.delete_listed(block, taken)
        if move:
            self.moved.add(source)
        return taken

    def lookup(self, key: str, source: str) -> Any:
        value: Any = self.data
        done: list[str] = []
        for part in source.split("."):
            if not isinstance(value, dict) or part not in value:
                names = [str(name) for name in value] if isinstance(value, dict) else []
                close = difflib.get_close_matches(part, names, n=1)
                hint = f"; did you mean {'.'.join([*done, close[0]])!r}?" if close else ""
                raise self.error(key, f"no key {source!r} in the config{hint}")
            value = value[part]
            done.append(part)
        return value

    def delete_listed(self, path: str, value: Any) -> None:
        """Apply, and drop, every ``_delete_key`` in ``value``, found at ``path``."""
        if isinstance(value, list):
            for index, item in enumerate(value):
                self.delete_listed(join(path, index), item)
        if not isinstance(value, dict):
            return
        if DELETE in value:
            key, listed = join(path, DELETE), value.pop(DELETE)
            if not isinstance(listed, str):
                raise self.error(key, f"must be a comma-separated string of key names, got {listed!r}")
            for name in filter(None, (name.strip() for name in listed.split(","))):
                if name not in value:
                    raise self.error(key, f"{name!r} is not a key of this block (its keys: {', '.join(map(str, value))})")
                del value[name]
                self.sources.forget(join(path, name))
        for key, item in value.items():
            self.delete_listed(join(path, key), item)
