"""What the stopped peer listeners of this process heard last.

A controller's listener (:class:`~.discovery.Listener` with ``carry_over``) leaves what it
heard here when it stops, under its keys and discovery settings; the next one of the same
(the next ``ew.map`` on peers in the same process) lists those peers at once, each until it
would have expired where it was heard, instead of waiting for their answer to its first
announcement (tens of milliseconds, every call).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .announce import Announcement
from .peertable import PeerInfo, PeerTable

__all__ = ["recall", "remember"]

Heard = list[tuple[Announcement, tuple[str, int], float]]  # (announcement, source, when heard)

_heard: dict[Any, tuple[float, Heard]] = {}
_lock = threading.Lock()


def remember(key: Any, peers: list[PeerInfo]) -> None:
    """A listener of ``key`` (its keys and settings) stops, having heard ``peers``."""
    heard = [(p.announcement, p.source, p.last_seen) for p in peers]
    with _lock:
        _heard[key] = (time.monotonic(), heard)


def recall(key: Any, table: PeerTable, expire_after_s: float) -> None:
    """List in ``table`` what the last listener of ``key`` heard, if it stopped less than
    ``expire_after_s`` ago, as heard then (those past their expiry are dropped at once)."""
    with _lock:
        stopped_at, heard = _heard.get(key, (0.0, []))
    now = time.monotonic()
    if heard and now - stopped_at < expire_after_s:
        for announcement, source, when in heard:
            table.update(announcement, source, when)
        table.expire(now)
