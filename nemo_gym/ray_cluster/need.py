"""Which servers need Ray: those whose own code imports ``ray``.

A server needs Ray when a module of its directory that importing its entrypoint loads has an
``import ray`` or ``from ray ... import`` statement anywhere (at the top or inside a function), as
upstream's Ray servers do (``import ray``, ``@ray.remote``). Only those servers join the cluster, so a
config without one costs no Ray start. Ray is an optional extra: a server that imports it where it is
not installed fails at load with ``RayMissing``, naming the extra.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from pathlib import Path

RAY_EXTRA = "pip install -e '.[ray]'"


class RayMissing(ImportError):
    """A server needs Ray, which is not installed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs Ray, which is not installed: install the ray extra ({RAY_EXTRA})", name="ray")


def is_ray_missing(error: ImportError) -> bool:
    return (error.name or "").split(".")[0] == "ray"


@functools.cache
def file_imports_ray(path: str, mtime: float) -> bool:
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "ray" for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ray":
            return True
    return False


@functools.cache
def real_folder(path: str) -> str:
    """``path`` with its links resolved, once per process: a loaded module's folder does not move, and resolving
    every loaded module's on each call was most of a ``gym env`` command's time."""
    return os.path.realpath(path)


def loaded_files(directory: str | Path) -> list[str]:
    """The source files of the modules this process has loaded from ``directory`` (its folders, links resolved)."""
    root = os.path.realpath(directory)
    inside = os.path.join(root, "")
    files = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py"):
            folder = real_folder(os.path.dirname(path))
            if folder == root or folder.startswith(inside):
                files.append(path)
    return files


def code_imports_ray(directory: str | Path) -> bool:
    """Whether a module this process loaded from a server's directory imports ``ray``."""
    return any(file_imports_ray(path, os.stat(path).st_mtime) for path in loaded_files(directory))
