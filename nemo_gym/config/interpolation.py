"""Resolve a merged config's ``${...}`` interpolations and ``???`` required values, all problems at once.

OmegaConf does the resolving (``${a.b}``, ``${oc.env:VAR,default}``); this module walks every value
first so that each ``???`` left unset and each interpolation that cannot resolve is reported together,
with the file that set it, before anything starts.
"""

from __future__ import annotations

from typing import Any

from omegaconf import Container, DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from nemo_gym.config.files import ConfigError, Sources


def problems(node: Container, sources: Sources, prefix: str = "") -> list[str]:
    found: list[str] = []
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        path = f"{prefix}{key}"
        try:
            value = node[key]
        except MissingMandatoryValue:
            found.append(f"{sources.of(path)}: {path}: required value (???) is not set; set it in a config, env.yaml or with ++{path}=VALUE")
            continue
        except InterpolationResolutionError as error:
            found.append(f"{sources.of(path)}: {path}: {str(error).splitlines()[0]}")
            continue
        if isinstance(value, Container):
            found += problems(value, sources, f"{path}.")
    return found


def resolve(config: DictConfig, sources: Sources) -> dict[str, Any]:
    """The config as plain data with every interpolation resolved; a ConfigError lists every problem."""
    found = problems(config, sources)
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigError(f"{len(found)} config values cannot be resolved:\n" + "\n".join(found))
    return OmegaConf.to_container(config, resolve=True)
