"""The public names of elsewhere.peer: complete, importable, documented."""

from __future__ import annotations

import importlib
import inspect

import pytest

import elsewhere.peer

MODULES = [
    "keys",
    "messages",
    "frames",
    "wire",
    "announce",
    "peertable",
    "discoveryconfig",
    "discovery",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_all_lists_every_public_name(name: str) -> None:
    module = importlib.import_module(f"elsewhere.peer.{name}")
    public = {
        n
        for n, obj in vars(module).items()
        if not n.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    }
    assert public <= set(module.__all__), public - set(module.__all__)
    for n in module.__all__:
        assert hasattr(module, n), n


def test_package_exports_resolve_and_are_documented() -> None:
    for n in elsewhere.peer.__all__:
        obj = getattr(elsewhere.peer, n)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{n} has no docstring"
    exported = set().union(
        *(importlib.import_module(f"elsewhere.peer.{m}").__all__ for m in MODULES)
    )
    assert set(elsewhere.peer.__all__) <= exported
