"""Fixtures of the peer tests; puts ``src`` (if not installed) and this folder on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("elsewhere") is None:  # not installed: test the source tree
    sys.path.insert(0, str(_HERE.parents[1] / "src"))
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from elsewhere.peer.keys import GroupKey, generate_key


@pytest.fixture
def key() -> GroupKey:
    """A fresh group key."""
    return GroupKey("test", generate_key())


@pytest.fixture
def other_key() -> GroupKey:
    """Same group name, another secret: an outsider who guessed the name."""
    return GroupKey("test", generate_key())
