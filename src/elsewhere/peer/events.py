"""What a :class:`~.wire.Connection` is and what it says: its role, its state, its events.

A connection is the end that connected or the one that accepted (:class:`Role`);
it is in its handshake, ready, or closed (:class:`ConnectionState`); and what it
reads comes out as events (:data:`Event`): :class:`HandshakeComplete` once, then
one :class:`Received` per frame, whose raw buffers are what an :data:`Allocator`
made (:data:`Buffer`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Union

from .layout import Flags
from .messages import Greeting, Message

__all__ = ["Allocator", "Buffer", "ConnectionState", "Event", "HandshakeComplete", "Received", "Role"]


class Role(enum.Enum):
    """Which end of the connection: the one that connected, or the one that accepted."""

    INITIATOR = "initiator"
    RESPONDER = "responder"


class ConnectionState(enum.Enum):
    """Where a connection is in its life."""

    HANDSHAKE = "handshake"
    READY = "ready"
    CLOSED = "closed"


Buffer = Union[bytearray, memoryview]
"""A received raw buffer: what the allocator returned, filled."""


@dataclass(frozen=True)
class HandshakeComplete:
    """The peer proved it holds the group key (or, keyless, said hello)."""

    peer: Greeting


class Received(NamedTuple):
    """A message, and its raw buffers (filled, authenticated, never unpickled); a tuple,
    as one is made for every frame received."""

    message: Message
    buffers: tuple[Buffer, ...] = ()
    flags: Flags = Flags.NONE


Event = Union[HandshakeComplete, Received]
"""What :meth:`~.wire.Connection.received` and :meth:`~.wire.Connection.feed` return."""
Allocator = Callable[[int], Buffer]
"""Returns a writable buffer of exactly the given size (e.g. from a pool)."""
