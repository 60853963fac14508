"""The unit tests mirror the code: each module's tests are in one file, found by the module's path alone.

The map: ``nemo_gym/<package>/<module>.py`` is tested by ``tests/unit_tests/<package>/test_<module>.py``
(``nemo_gym/judge.py`` by ``tests/unit_tests/test_judge.py``); a package's ``__init__.py`` by the
``test_package.py`` of its folder, a ``__main__.py`` by ``test_main.py``. The scripts' tests mirror
``scripts/`` the same way (``scripts/bench/driving.py`` by ``tests/unit_tests/bench/test_driving.py``).

Both directions are checked, for every package:

- every module of ``nemo_gym`` with logic has its mirrored test file. A module has logic when it defines, at
  its top level, a function, or a class with a method whose body does something. Not counted: the methods of
  a ``Protocol`` (a body of only a docstring, ``...`` or ``pass``), and a module's ``__getattr__`` and
  ``__dir__`` (a lazy re-export). So an ``__init__.py`` that re-exports, and a module of constants, types and
  exceptions only, need no test file of their own. ``scripts/`` (benchmarks, reports) is held to the reverse
  direction only: a script gets a test file when it has one, named by the map;
- every ``tests/unit_tests/**/test_*.py`` names a module that exists (with logic or not: a package's
  ``test_package.py`` may test what the package holds together), except the few contract files of
  ``CONTRACTS``, which are about no one module.

``NOT_YET_MIRRORED`` names the modules with logic whose test file is still to be written; an entry that
gets its file must leave the list, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "unit_tests"
SOURCES = ("nemo_gym", "scripts")

CONTRACTS = {
    "test_package_map.py": "this map itself, over every module and test file",
    "test_import_circles.py": "the import graph of the whole nemo_gym package",
    "test_docs.py": "the README and docs/, no module",
    "test_upstream_names.py": "upstream NeMo Gym's names, each from the module upstream has it in",
    "test_upstream_paths.py": "upstream NeMo Gym's module paths, as the compatibility reference lists them",
    "test_hosts_skips.py": "the test harness (tests/programs.py, tests/hosts.py): a test skips naming a missing program",
    "durable/test_postgres_server.py": "the test harness's PostgreSQL (tests/postgres.py)",
    "test_failed_runs.py": "the test harness's kept logs of a failed test (tests/failed_runs.py)",
}

NOT_YET_MIRRORED: set[str] = set()

LAZY_RE_EXPORT = {"__getattr__", "__dir__"}


def does_something(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    return not all(isinstance(node, ast.Pass) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def has_logic(source: str) -> bool:
    """Whether a module defines a function, or a class with a method that does something (see the docstring)."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.parse(source).body:
        if isinstance(node, functions) and node.name not in LAZY_RE_EXPORT:
            return True
        if isinstance(node, ast.ClassDef) and any(isinstance(item, functions) and does_something(item) for item in node.body):
            return True
    return False


def mirror(module: Path) -> str:
    """The test file of a module (a path relative to its source root), relative to tests/unit_tests."""
    name = {"__init__.py": "test_package.py", "__main__.py": "test_main.py"}.get(module.name, f"test_{module.name}")
    return (module.parent / name).as_posix()


def modules(source: str) -> list[Path]:
    return sorted(path.relative_to(ROOT / source) for path in (ROOT / source).rglob("*.py"))


def missing_test_files() -> set[str]:
    return {f"nemo_gym/{module.as_posix()}" for module in modules("nemo_gym") if has_logic((ROOT / "nemo_gym" / module).read_text()) and not (TESTS / mirror(module)).exists()}


@pytest.mark.parametrize(
    "source, logic",
    [
        ("from a import b\n__all__ = ['b']\n", False),
        ("X = 1\nclass E(Exception):\n    '''Why.'''\n", False),
        ("from typing import Protocol\nclass P(Protocol):\n    def f(self) -> int: ...\n    def g(self):\n        '''Doc.'''\n", False),
        ("def __getattr__(name):\n    return name\ndef __dir__():\n    return []\n", False),
        ("def f():\n    return 1\n", True),
        ("async def f():\n    return 1\n", True),
        ("class C:\n    '''Doc.'''\n    def f(self):\n        return 1\n", True),
    ],
)
def test_a_module_has_logic_when_it_defines_a_function_or_a_method_that_does_something(source, logic):
    assert has_logic(source) is logic


def test_every_module_with_logic_has_its_mirrored_test_file_or_is_named_not_yet_mirrored():
    missing = missing_test_files()
    assert missing - NOT_YET_MIRRORED == set(), "modules with logic and no test file at their mirrored path"
    assert NOT_YET_MIRRORED - missing == set(), "now mirrored (or gone): remove them from NOT_YET_MIRRORED"


def test_every_test_file_names_a_module_that_exists_or_is_a_named_contract():
    mirrored = {mirror(module) for source in SOURCES for module in modules(source)}
    test_files = {path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")}
    assert test_files - mirrored - set(CONTRACTS) == set(), "test files that name no module: move them to their module's mirror"
    assert set(CONTRACTS) <= test_files, "a contract file that is gone: remove it from CONTRACTS"
    assert not set(CONTRACTS) & mirrored, "a contract file that names a module is that module's test file, not a contract"


def test_no_two_modules_share_a_test_file():
    owners: dict[str, list[str]] = {}
    for source in SOURCES:
        for module in modules(source):
            owners.setdefault(mirror(module), []).append(f"{source}/{module.as_posix()}")
    assert {test: paths for test, paths in owners.items() if len(paths) > 1} == {}
