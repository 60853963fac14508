"""Finding a server: the server class a module defines, and checking every instance of a config against its
server's own code and config model before any process starts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from pydantic import ValidationError

from nemo_gym.config import RESERVED_KEYS, Instance, parse, resolve
from nemo_gym.config.files import ConfigError
from nemo_gym.config.paths import find_implementation, make_importable, search_roots, server_module_checked
from nemo_gym.ray_cluster.need import RayMissing, code_imports_ray, is_ray_missing
from nemo_gym.server import SimpleServer


def find_server_class(module: ModuleType) -> type[SimpleServer]:
    """The server a module defines: the one server class defined in it that no other class of the module extends."""
    defined = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, SimpleServer) and value.__module__ == module.__name__
    ]
    leaves = [cls for cls in defined if not any(other is not cls and issubclass(other, cls) for other in defined)]
    if len(leaves) != 1:
        found = ", ".join(cls.__name__ for cls in leaves) or "none"
        raise LookupError(f"{module.__name__} must define exactly one server class (a SimpleServer subclass); found {found}")
    return leaves[0]


def load(
    paths: Iterable[str | Path],
    check_ports: bool = True,
    overrides: Iterable[str] = (),
    roots: list[Path] | None = None,
    initial: tuple[str, dict] | None = None,
) -> dict[str, Instance]:
    """Read config files, env.yaml files and overrides, and check each instance against its server's own config model."""
    return load_config(paths, check_ports, overrides, roots, initial)[1]


def load_config(
    paths: Iterable[str | Path],
    check_ports: bool = True,
    overrides: Iterable[str] = (),
    roots: list[Path] | None = None,
    initial: tuple[str, dict] | None = None,
) -> tuple[dict, dict[str, Instance]]:
    """``load``, and the config's top-level settings (upstream's global keys it sets, such as
    ``ray_head_node_address``), which the launcher hands every server beside the instances."""
    roots = search_roots() if roots is None else roots
    data, sources = resolve(paths, overrides, roots, initial)
    instances = parse(data, sources, check_ports)
    check_settings(instances, roots)
    return {key: value for key, value in data.items() if key in RESERVED_KEYS}, instances


def check_settings(instances: dict[str, Instance], roots: list[Path] | None = None) -> None:
    """Find every instance's code and validate its settings with its server's config model (unknown keys are typos)."""
    roots = search_roots() if roots is None else roots
    for instance in instances.values():
        try:
            instance.directory = find_implementation(instance.server_type, instance.implementation, roots)
        except LookupError as error:
            raise ConfigError(f"{instance.where()}: {error}") from None
        if not (instance.directory / instance.settings["entrypoint"]).is_file():
            raise ConfigError(f"{instance.where('entrypoint')}: no file {instance.directory / instance.settings['entrypoint']}")
        make_importable(instance.directory)
        with contextlib.ExitStack() as stack:
            try:
                module = stack.enter_context(server_module_checked(instance.module))
                server_class = find_server_class(module)
            except ImportError as error:
                if is_ray_missing(error):
                    raise ConfigError(f"{instance.where('entrypoint')}: {RayMissing(f'server {instance.name!r}')}") from None
                raise ConfigError(f"{instance.where('entrypoint')}: cannot load a server app from {instance.module}: {error!r}") from error
            except LookupError as error:
                raise ConfigError(f"{instance.where('entrypoint')}: cannot load a server app from {instance.module}: {error!r}") from error
            if not Path(module.__file__).resolve().is_relative_to(instance.directory):
                raise ConfigError(f"{instance.where()}: {instance.module} was already imported from {module.__file__}, not from {instance.directory}")
            instance.needs_ray = code_imports_ray(instance.directory)
            try:
                server_class.validate_config(instance.name, instance.settings)
            except ValidationError as error:
                problem = error.errors()[0]
                key = ".".join(str(part) for part in problem["loc"])
                raise ConfigError(f"{instance.where(key)}: {problem['msg']}") from None
