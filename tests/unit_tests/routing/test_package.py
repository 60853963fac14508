"""The routing package as a whole: it depends on no durable code, and its docstring is its map."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nemo_gym

NEMO_GYM = Path(nemo_gym.__file__).parent
ROUTING = NEMO_GYM / "routing"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at its top or anywhere inside (functions, ``if TYPE_CHECKING``)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_routing_never_imports_durable_sessions():
    """A dead owner's adoption crosses routing, then durable: durable is asked, and never asks back."""
    offending = {
        f"{path.relative_to(NEMO_GYM)}: {module}"
        for path in ROUTING.rglob("*.py")
        for module in imported_modules(path)
        if module == "nemo_gym.durable" or module.startswith("nemo_gym.durable.")
    }
    assert offending == set()


@pytest.mark.parametrize("package", [ROUTING, ROUTING / "transport"], ids=lambda package: package.name)
def test_each_routing_packages_docstring_names_each_of_its_modules(package):
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    children = {path.stem for path in package.glob("*.py") if path.name != "__init__.py"}
    children |= {path.parent.name for path in package.glob("*/__init__.py")}
    assert {child for child in children if f"``{child}``" not in docstring} == set()
