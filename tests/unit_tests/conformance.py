"""Checking that a class implements a declared protocol: every method, with the same parameters, async where it is."""

from __future__ import annotations

import inspect


def protocol_methods(protocol: type) -> dict[str, object]:
    return {name: value for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("_")}


def assert_implements(cls: type, protocol: type) -> None:
    methods = protocol_methods(protocol)
    assert methods, f"{protocol.__name__} declares no methods"
    for name, declared in methods.items():
        implemented = getattr(cls, name, None)
        assert implemented is not None, f"{cls.__name__} lacks {name}"
        assert list(inspect.signature(implemented).parameters) == list(inspect.signature(declared).parameters), name
        # An async context manager's maker is a plain function that returns one: compare what it returns.
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared), name
