"""Strict JSON for every ``--json`` output of the command line.

What every JSON parser reads (RFC 8259), whatever a task returned:

- a float that is not a number or infinite is written as the string ``"NaN"``, ``"Infinity"``
  or ``"-Infinity"`` (as protobuf's JSON mapping writes them): kept apart from a missing value
  (``null``), and read by ``float()`` in Python, ``Number()`` in JavaScript, ``tonumber`` in jq;
- a NumPy array or scalar is its ``tolist()``, a pandas DataFrame its records, a set or a
  tuple a list, a mapping's keys text (``1`` -> ``"1"``, ``None`` -> ``"null"``);
- anything else, a complex number included, is its ``repr`` as a string; a container that
  holds itself is ``"<circular>"`` where it recurs.

``json.dumps(..., allow_nan=False)`` then checks that nothing non-standard is left.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["dumps", "plain"]

_NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def dumps(value: Any, *, indent: int | None = 2) -> str:
    """``value`` as strict JSON text (see the module's docstring for what becomes what)."""
    return json.dumps(plain(value), indent=indent, allow_nan=False)


def plain(value: Any) -> Any:
    """``value`` made of what strict JSON has: dicts with text keys, lists, text, finite
    numbers, booleans and None."""
    return _plain(value, set())


def _float(x: float) -> float | str:
    return x if math.isfinite(x) else _NONFINITE[repr(float(x))]


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if k is None or isinstance(k, (bool, int)):
        return json.dumps(k)
    if isinstance(k, float):
        return str(_float(k)) if not math.isfinite(k) else json.dumps(k)
    return repr(k)


def _plain(value: Any, active: set[int]) -> Any:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)  # an IntEnum, a NumPy bool's int: the number
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        if id(value) in active:
            return "<circular>"
        active.add(id(value))
        try:
            if isinstance(value, Mapping):
                return {_key(k): _plain(v, active) for k, v in value.items()}
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            return [_plain(v, active) for v in items]
        finally:
            active.discard(id(value))
    return _plain_other(value, active)


def _plain_other(value: Any, active: set[int]) -> Any:
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # a pandas DataFrame
        return _plain(value.to_dict("records"), active)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):  # NumPy arrays and scalars
        try:
            converted = tolist()
        except Exception:
            converted = None
        if converted is not None and converted is not value and not isinstance(converted, complex):
            return _plain(converted, active)
    return repr(value)
