"""Where server code lives: ``<root>/<server_type>/<implementation>/`` under each search root.

The roots, first match wins: ``--search-dir`` flags, ``NEMO_GYM_EXTRA_ROOTS`` (paths joined by
``os.pathsep``), the working directory, then the directory this package is installed in.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

from nemo_gym.env import EXTRA_ROOTS_ENV

SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models")
INSTALL_ROOT = Path(__file__).resolve().parents[2]


def search_roots(search_dirs: Iterable[str | Path] = (), cwd: str | Path | None = None) -> list[Path]:
    """The roots to look in, in order, each once."""
    extra = [part for part in os.environ.get(EXTRA_ROOTS_ENV, "").split(os.pathsep) if part]
    roots: list[Path] = []
    for root in (*search_dirs, *extra, cwd or Path.cwd(), INSTALL_ROOT):
        root = Path(root).resolve()
        if root not in roots:
            roots.append(root)
    return roots


def find_implementation(server_type: str, implementation: str, roots: list[Path]) -> Path:
    """The first ``<root>/<server_type>/<implementation>`` directory; the error lists every place looked."""
    places = [root / server_type / implementation for root in roots]
    for place in places:
        if place.is_dir():
            return place
    looked = "".join(f"\n  {place}" for place in places)
    raise LookupError(
        f"no implementation directory {server_type}/{implementation}; looked in (--search-dir, {EXTRA_ROOTS_ENV},"
        f" working directory, install root):{looked}"
    )


def servers_found(roots: list[Path]) -> list[tuple[str, str, Path]]:
    """(server type, implementation, directory) of every directory with an ``app.py``; a name found twice keeps its first."""
    found: dict[tuple[str, str], Path] = {}
    for root in roots:
        for server_type in SERVER_TYPES:
            for app in sorted((root / server_type).glob("*/app.py")):
                found.setdefault((server_type, app.parent.name), app.parent)
    return [(server_type, name, directory) for (server_type, name), directory in sorted(found.items())]


def extend_package_path(path: list[str], server_type: str) -> list[str]:
    """A server-type package's ``__path__`` with the ``NEMO_GYM_EXTRA_ROOTS`` copies of it first.

    The launcher hands a server process the roots its servers were found in through that variable,
    so ``<server_type>.<implementation>`` imports from the same directory the config was checked against.
    """
    extra = [str(Path(root, server_type)) for root in os.environ.get(EXTRA_ROOTS_ENV, "").split(os.pathsep) if root]
    return list(dict.fromkeys([*(place for place in extra if os.path.isdir(place)), *path]))


def make_importable(directory: Path) -> None:
    """Let this process import ``<server_type>.<implementation>`` from ``directory`` (put first)."""
    package = importlib.import_module(directory.parent.name)
    place = str(directory.parent)
    if place in package.__path__:
        package.__path__.remove(place)
    package.__path__.insert(0, place)


def server_directory(module_name: str) -> str:
    """The directory the import system finds a server's ``<server_type>.<implementation>`` package in."""
    package = ".".join(module_name.split(".")[:2])
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"no package {package}", name=package)
    return os.path.realpath(next(iter(spec.submodule_search_locations)))


def import_server_module(module_name: str) -> ModuleType:
    """Import a server's entrypoint module with the server's own directory first on ``sys.path``, as upstream
    starts a server, so that its app can import the modules next to it bare (``import util``)."""
    directory = server_directory(module_name)
    if directory in sys.path:
        sys.path.remove(directory)
    sys.path.insert(0, directory)
    return importlib.import_module(module_name)


@contextlib.contextmanager
def server_module_checked(module_name: str, forget_package: bool = False) -> Iterator[ModuleType]:
    """``import_server_module`` for a process that only checks the server (and may check others after it):
    on leaving, the directory is off ``sys.path`` again and its bare modules are forgotten, so that the next
    server's ``import util`` finds its own. With ``forget_package``, the server's package modules (the
    entrypoint itself) are forgotten too, so that the next import runs their code again."""
    path_before = list(sys.path)
    modules_before = set(sys.modules)
    directory = server_directory(module_name)
    package = ".".join(module_name.split(".")[:2])
    try:
        yield import_server_module(module_name)
    finally:
        sys.path[:] = path_before
        for name in set(sys.modules) - modules_before:
            ours = "." not in name or (forget_package and (name == package or name.startswith(package + ".")))
            if ours and _is_inside(getattr(sys.modules[name], "__file__", None), directory):
                del sys.modules[name]


def _is_inside(path: str | None, directory: str) -> bool:
    return path is not None and Path(os.path.realpath(path)).is_relative_to(directory)
