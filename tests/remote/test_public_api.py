"""elsewhere.hosts re-exports its public names, and only names that exist."""

from __future__ import annotations

import inspect

import elsewhere.hosts as remote
from elsewhere.hosts import local, session, ssh, transport


def test_all_is_complete_and_importable() -> None:
    for name in remote.__all__:
        assert hasattr(remote, name), name
    for module in (transport, local, ssh, session):
        for name in module.__all__:
            if name != "TREE_SCRIPT" and name != "tree_functions":
                assert name in remote.__all__, f"{module.__name__}.{name} is not re-exported"


def test_public_names_have_docstrings() -> None:
    for name in remote.__all__:
        obj = getattr(remote, name)
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    assert inspect.getdoc(member), f"{name}.{attr} has no docstring"
