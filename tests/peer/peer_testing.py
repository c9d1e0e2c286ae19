"""Helpers of the peer tests (imported by name: conftest puts this folder on sys.path)."""

from __future__ import annotations

import socket
from typing import Any

from elsewhere.peer.keys import GroupKey
from elsewhere.peer.messages import Identity
from elsewhere.peer.wire import Connection, Event, Limits, Role

Pair = tuple[Connection, Connection]


def pump(a: Connection, b: Connection) -> tuple[list[Event], list[Event]]:
    """Move every queued frame between ``a`` and ``b`` until both are quiet."""
    got_a: list[Event] = []
    got_b: list[Event] = []
    for _ in range(10):
        out_a, out_b = a.data_to_send(), b.data_to_send()
        if not out_a and not out_b:
            break
        for frame in out_a:
            got_b += b.feed(frame.tobytes())
        for frame in out_b:
            got_a += a.feed(frame.tobytes())
    return got_a, got_b


def make_pair(key: GroupKey | None, limits: Limits | None = None, **kwargs: Any) -> Pair:
    """An initiator and a responder that completed their handshake."""
    a = Connection(Role.INITIATOR, key, Identity("ctrl", "alice", "hosta"), limits=limits, **kwargs)
    b = Connection(Role.RESPONDER, key, Identity("work", "bob", "hostb"), limits=limits, **kwargs)
    pump(a, b)
    return a, b


def free_udp_port() -> int:
    """A UDP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
