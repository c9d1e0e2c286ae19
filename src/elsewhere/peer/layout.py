"""The peer frame's layout: its byte table, the protocol's numbers, and its caps.

What every frame looks like before any message is read from it: the protocol
constants, the message types and flags (their numbers never change), the 32
fixed bytes every frame starts with (:class:`FixedHeader`, :data:`FIXED`), the
buffer table after them (:func:`lengths_struct`, :func:`head_struct`), and the
caps a receiver checks every length against before it reads or allocates
anything (:class:`Limits`). The messages inside a frame are in :mod:`.messages`;
the keys and MACs of its tags in :mod:`.frames`; the connection that frames,
sends and receives them in :mod:`.wire` (its reading in :mod:`.reader`, its
handshake in :mod:`.handshake`).

Frame layout (all integers big-endian)::

    offset  size   field
    ------  -----  ------------------------------------------------------------
       0      4    magic            b"ELSW"
       4      1    version          1 (PROTOCOL_VERSION)
       5      1    message type     MessageType; numbers never change
       6      2    flags            Flags; unknown bits are refused
       8      8    sequence number  per direction: 0, 1, 2, ...; refused unless
                                    exactly the next one (no replay, no reorder)
      16      4    header length    H, bytes of the msgpack header, 1 <= H <= cap
      20      8    body length      B, total bytes of the raw buffers, <= cap
      28      2    buffer count     N, raw buffers (only TASK and RESULT have any)
      30      2    reserved         0
      32    8*N    buffer lengths   N x uint64; their sum must equal B
    32+8N     H    msgpack header   a map: the message's fields (encrypted: the
                                    same length of ciphertext)
      ...    16    head tag         keyed only: the AEAD's tag (AES-256-GCM or
                                    ChaCha20-Poly1305, chosen in the handshake;
                                    see .ciphers), nonce = seq || 0;
                                    encrypted: of the header, bytes 0..32+8N as
                                    associated data; else the tag of no plaintext,
                                    every byte before it as associated data (GMAC or
                                    Poly1305; HMAC-SHA256/128 in the handshake)
      ...     B    raw buffers      N buffers, back to back (pickle-5 out-of-band
                                    data; encrypted: the same length of ciphertext)
      ...    16    body tag         keyed and N > 0 only: the AEAD's tag, nonce =
                                    seq || 1; encrypted: of the buffers, the head as
                                    associated data; else the tag of no plaintext,
                                    every byte of the frame before it as associated data

Every length is checked against :class:`Limits` from the 32 fixed bytes,
before anything else is read or allocated; the head tag is checked before the
msgpack header is parsed (and decrypts it), and before any buffer is allocated;
the body tag is checked before the frame is handed on. With a key, encryption is
on unless both ends turned it off (see :mod:`.handshake`); the fixed bytes and
the buffer table are never encrypted, so that they can be checked first.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ..util.errors import ProtocolError

__all__ = [
    "FIXED",
    "FIXED_SIZE",
    "FLAG_VALUES",
    "HANDSHAKE_HEADER_CAP",
    "HANDSHAKE_TYPES",
    "LANE_SUFFIX",
    "MAGIC",
    "NONCE_BYTES",
    "PAYLOAD_TYPES",
    "PROTOCOL_VERSION",
    "TAG_SIZE",
    "FixedHeader",
    "Flags",
    "Limits",
    "MessageType",
    "RefuseReason",
    "head_struct",
    "lengths_struct",
]

MAGIC = b"ELSW"
PROTOCOL_VERSION = 1
FIXED_SIZE = 32
TAG_SIZE = 16
NONCE_BYTES = 32
HANDSHAKE_HEADER_CAP = 2048
"""Largest msgpack header of a HELLO, CHALLENGE, AUTH or handshake ERROR."""
LANE_SUFFIX = "/lane"
"""The end of the peer id a controller names a lane connection with (its own peer id before
it; see "Lanes" in docs/peer-protocol.md)."""

FIXED = struct.Struct(">4sBBHQIQHH")
"""The 32 fixed bytes as a :mod:`struct` (what :class:`FixedHeader` packs and parses)."""


class MessageType(enum.IntEnum):
    """Message types. The numbers are part of the protocol and never change."""

    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    ASK = 10
    ACCEPT = 11
    REFUSE = 12
    TASK = 13
    RESULT = 14
    ACK = 15
    CANCEL = 16
    PING = 20
    PONG = 21
    BYE = 30
    ERROR = 31


class Flags(enum.IntFlag):
    """Frame flags. The codec passes them through; unknown bits are refused."""

    NONE = 0
    COMPRESSED = 1
    """The sender compressed the buffers (zstandard); the receiver decompresses."""


class RefuseReason(enum.IntEnum):
    """Why a worker refused an ASK. The numbers never change."""

    BUSY = 1
    MEMORY = 2
    TIME = 3
    FAIR_SHARE = 4
    NOT_ALLOWED = 5
    DRAINING = 6


_KNOWN_FLAGS = int(Flags.COMPRESSED)
_TYPES = {int(t): t for t in MessageType}
FLAG_VALUES: Mapping[int, Flags] = {v: Flags(v) for v in range(_KNOWN_FLAGS + 1) if not v & ~_KNOWN_FLAGS}
"""Every known combination of flags, by its number (a number not here has unknown bits)."""
HANDSHAKE_TYPES = frozenset({MessageType.HELLO, MessageType.CHALLENGE, MessageType.AUTH})
"""The types of message only the handshake sends."""
PAYLOAD_TYPES = frozenset({MessageType.TASK, MessageType.RESULT})
"""The types of message that carry raw buffers (the rest carry none)."""


class FixedHeader(NamedTuple):
    """The 32 fixed bytes at the start of every frame (a tuple: one is made per frame read)."""

    msg_type: MessageType
    flags: Flags
    seq: int
    header_len: int
    body_len: int
    nbuf: int

    def pack(self) -> bytes:
        """The 32 bytes of this header."""
        return FIXED.pack(
            MAGIC, PROTOCOL_VERSION, self.msg_type, self.flags, self.seq,
            self.header_len, self.body_len, self.nbuf, 0,
        )  # fmt: skip

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> FixedHeader:
        """Parse and check magic, version, type, flags; raise :class:`ProtocolError`."""
        if len(data) != FIXED_SIZE:
            raise ProtocolError(f"a frame header is {FIXED_SIZE} bytes, got {len(data)}")
        magic, version, mtype, flags, seq, hlen, blen, nbuf, reserved = FIXED.unpack(data)
        if magic != MAGIC:
            raise ProtocolError(f"not an elsewhere peer frame (magic {bytes(magic)!r})")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"peer speaks protocol version {version}, this is version {PROTOCOL_VERSION}"
            )
        msg_type = _TYPES.get(mtype)
        if msg_type is None:
            raise ProtocolError(f"unknown message type {mtype}")
        if flags & ~_KNOWN_FLAGS:
            raise ProtocolError(f"unknown flags {flags:#06x}")
        if reserved:
            raise ProtocolError("reserved header bytes are not zero")
        return cls(msg_type, FLAG_VALUES[flags], seq, hlen, blen, nbuf)


@functools.lru_cache(maxsize=64)
def lengths_struct(nbuf: int) -> struct.Struct:
    """A buffer table of ``nbuf`` lengths."""
    return struct.Struct(f">{nbuf}Q")


@functools.lru_cache(maxsize=64)
def head_struct(nbuf: int) -> struct.Struct:
    """The fixed header and a buffer table of ``nbuf`` lengths, as one :mod:`struct`."""
    return struct.Struct(f"{FIXED.format}{nbuf}Q")


@dataclass(frozen=True)
class Limits:
    """Caps on what a peer may make us read or allocate for one frame."""

    max_header_bytes: int = 1 << 20
    """msgpack header of a TASK or RESULT."""
    max_control_header_bytes: int = 64 << 10
    """msgpack header of every other message after the handshake."""
    max_buffers: int = 1024
    max_body_bytes: int = 4 << 30
    max_pending_asks: int = 1024
    """ASKs a peer may have open (not yet answered) on one connection."""

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_control_header_bytes", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value < 2**63:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_buffers, int) or not 0 <= self.max_buffers <= 0xFFFF:
            raise ValueError(f"Limits.max_buffers must be 0..65535, got {self.max_buffers!r}")
        if not isinstance(self.max_pending_asks, int) or self.max_pending_asks < 1:
            raise ValueError(f"Limits.max_pending_asks must be >= 1, got {self.max_pending_asks!r}")
