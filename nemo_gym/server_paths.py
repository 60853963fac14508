"""Where server code lives: ``<root>/<server_type>/<implementation>/`` under each search root.

The roots, first match wins: ``--search-dir`` flags, ``NEMO_GYM_EXTRA_ROOTS`` (paths joined by
``os.pathsep``), the working directory, then the directory this package is installed in.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from pathlib import Path

SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models")
INSTALL_ROOT = Path(__file__).resolve().parent.parent
EXTRA_ROOTS_ENV = "NEMO_GYM_EXTRA_ROOTS"


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
