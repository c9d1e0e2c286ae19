"""The checks of a peer message's fields, as a receiver reads them (:mod:`.messages`):
each raises ValueError, which the parser turns into a protocol error."""

from __future__ import annotations

import math

MAX_ACKS = 1000
"""Most task ids one ACK acknowledges (its ``task_id`` and ``more``)."""

MAX_TEXT = 1024
"""Most characters of a text field (a task id, a reason, a host)."""

MAX_TASK_NUMBERS = 100_000
"""Most task numbers one CANCEL names (``tasks``: those of a batch sent on a lane)."""


def text(value: object, name: str, *, empty: bool = True) -> None:
    if not isinstance(value, str) or len(value) > MAX_TEXT or (not empty and not value):
        raise ValueError(f"{name} must be a str of 1..{MAX_TEXT} characters, got {value!r:.80}")


def count(value: object, name: str, low: int = 0) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**63:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r:.80}")


def task_ids(value: object, name: str) -> tuple[str, ...]:
    """Check a list of fewer than ``MAX_ACKS`` task ids; returns it as a tuple."""
    if not isinstance(value, (list, tuple)) or len(value) >= MAX_ACKS:
        raise ValueError(f"{name} must be a list of fewer than {MAX_ACKS} task ids")
    for task_id in value:
        text(task_id, "task_id", empty=False)
    return tuple(value)


def task_numbers(value: object, name: str) -> tuple[int, ...]:
    """Check a list of at most ``MAX_TASK_NUMBERS`` task numbers (ints >= 0); returns it as a tuple."""
    if not isinstance(value, (list, tuple)) or len(value) > MAX_TASK_NUMBERS:
        raise ValueError(f"{name} must be a list of at most {MAX_TASK_NUMBERS} task numbers")
    for number in value:
        count(number, name)
    return tuple(value)


def check_info(info: object) -> None:
    # set(map(type, ...)): the keys' types in one C loop (msgpack gives exact str)
    if not isinstance(info, dict) or (info and set(map(type, info)) != {str}):
        raise ValueError(f"info must be a dict with str keys, got {type(info).__name__}")


def check_ask(mem_bytes: object, time_s: object, cores: object, lane: object = False) -> float:
    """Check an ASK's figures; returns ``time_s`` as a float."""
    count(mem_bytes, "mem_bytes")
    count(cores, "cores", 1)
    if not isinstance(lane, bool):
        raise ValueError(f"lane must be a bool, got {lane!r:.80}")
    if isinstance(time_s, bool) or not isinstance(time_s, (int, float)) or math.isnan(time_s) or time_s < 0:
        raise ValueError(f"time_s must be a number >= 0, got {time_s!r:.80}")
    return float(time_s)
