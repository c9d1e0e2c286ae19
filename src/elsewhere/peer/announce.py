"""UDP announcements and the table of known peers, sans-IO.

Every peer sends an announcement about once a second (see ``discovery.py``);
receivers check it and keep a :class:`PeerTable`. Datagram layout (all
integers big-endian)::

    offset  size  field
    ------  ----  ---------------------------------------------------------
       0      4   magic          b"ELSA"
       4      1   version        1 (ANNOUNCE_VERSION)
       5      1   flags          bit 0: LEAVING (the peer is going away)
       6      2   body length    n, bytes of the msgpack body
       8      8   timestamp      milliseconds since the Unix epoch
      16      8   counter        per peer id, +1 for every datagram
      24     16   peer id        random, fixed for the life of the peer
      40      n   msgpack body   an array: group, address, port, user, host,
                                 state, slots, free slots, memory (bytes),
                                 time on offer (s), current task or nil (always
                                 nil from a peer that encrypts), encrypts (a
                                 bool; absent: false), the ciphers it offers,
                                 best first (absent: AES-256-GCM only) (a newer
                                 version may append fields)
    40+n     32   tag            HMAC-SHA256 of bytes 0..40+n, under a key
                                 derived from the group key with HKDF

A receiver drops a datagram, before it parses the msgpack body, when its
length, magic, version, flags or tag is wrong, when its timestamp is more
than ``window_s`` (30 s) away from the receiver's clock, or when its counter
is not above the last one seen from that peer id (a replay). In loopback-only
mode (no group key) the tag is made with a fixed, public key: it only catches
damage, and such datagrams must only ever travel over 127.0.0.1. A receiver
with a group key never accepts them (their tag is wrong under its key).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import math
import secrets
import struct
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..util.errors import ProtocolError
from .keys import GroupKey

__all__ = [
    "ANNOUNCE_MAGIC",
    "ANNOUNCE_VERSION",
    "FLAG_LEAVING",
    "MAX_DATAGRAM",
    "Announcement",
    "AnnouncementDecoder",
    "ClockSkew",
    "PeerFilter",
    "PeerInfo",
    "PeerState",
    "PeerTable",
    "announce_key",
    "encode_announcement",
    "new_peer_id",
    "with_fields",
]

ANNOUNCE_MAGIC = b"ELSA"
ANNOUNCE_VERSION = 1
MAX_DATAGRAM = 1400
"""Largest announcement: fits one Ethernet frame, so it is never fragmented."""
FLAG_LEAVING = 1

_PREFIX = struct.Struct(">4sBBHQQ16s")
_PREFIX_SIZE = _PREFIX.size
_TAG_SIZE = 32
_MIN_DATAGRAM = _PREFIX_SIZE + 1 + _TAG_SIZE
_LOOPBACK_SECRET = b"elsewhere loopback-only: not a secret"
_MAX_TEXT = 256


class PeerState(enum.IntEnum):
    """What a peer is doing (FieldTrip's peer states). Numbers never change."""

    ZOMBIE = 0
    """Running but offering nothing (starting, stopping, or switched off)."""
    CONTROLLER = 1
    """Hands out tasks; runs none."""
    IDLE = 2
    """A worker with free slots."""
    BUSY = 3
    """A worker with no free slot."""


def new_peer_id() -> str:
    """A fresh random peer id: 32 hex digits."""
    return secrets.token_hex(16)


def _text(value: object, name: str, *, empty: bool = True) -> None:
    if not isinstance(value, str) or len(value) > _MAX_TEXT or (not empty and not value):
        raise ValueError(
            f"{name} must be a str of at most {_MAX_TEXT} characters, got {value!r:.80}"
        )


def _int(value: object, name: str, high: int = 2**63) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < high:
        raise ValueError(f"{name} must be an int in 0..{high - 1}, got {value!r:.80}")


@dataclass(frozen=True)
class Announcement:
    """What one peer says about itself in one datagram.

    ``timestamp`` (seconds since the epoch) and ``counter`` are set by the
    sender for each datagram; ``time_s`` may be ``math.inf`` (no limit).
    """

    peer_id: str
    group: str
    address: str
    port: int
    user: str = ""
    host: str = ""
    state: PeerState = PeerState.ZOMBIE
    slots: int = 0
    slots_free: int = 0
    mem_bytes: int = 0
    time_s: float = 0.0
    task: str | None = None
    timestamp: float = 0.0
    counter: int = 0
    leaving: bool = False
    encrypt: bool = False
    """Whether the peer encrypts its connections (``--no-encrypt``, ``encrypt=False``: not);
    a controller skips a worker whose choice differs from its own, and says why."""
    ciphers: tuple[str, ...] = ()
    """The ciphers the peer offers, best first (absent, from an older peer: AES-256-GCM only);
    ``elsewhere peer list`` shows the one a connection from this machine would use."""

    def __post_init__(self) -> None:
        if not isinstance(self.peer_id, str) or len(self.peer_id) != 32:
            raise ValueError(f"peer_id must be 32 hex digits, got {self.peer_id!r:.80}")
        try:
            bytes.fromhex(self.peer_id)
        except ValueError:
            raise ValueError(f"peer_id must be 32 hex digits, got {self.peer_id!r:.80}") from None
        _text(self.group, "group")
        _text(self.address, "address")
        _int(self.port, "port", 65536)
        _text(self.user, "user")
        _text(self.host, "host")
        if isinstance(self.state, bool) or not isinstance(self.state, int):
            raise ValueError(f"state must be a PeerState, got {self.state!r:.80}")
        object.__setattr__(self, "state", PeerState(self.state))
        _int(self.slots, "slots", 2**31)
        _int(self.slots_free, "slots_free", 2**31)
        _int(self.mem_bytes, "mem_bytes")
        _int(self.counter, "counter", 2**64)
        for name in ("time_s", "timestamp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r:.80}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not 0 <= self.timestamp < 2**63 / 1000:
            raise ValueError(f"timestamp out of range: {self.timestamp!r}")
        if self.task is not None:
            _text(self.task, "task")
        for name in ("leaving", "encrypt"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r:.80}")
        if not isinstance(self.ciphers, (list, tuple)) or len(self.ciphers) > 8:
            raise ValueError(f"ciphers must be a list of at most 8 names, got {self.ciphers!r:.80}")
        for name in self.ciphers:
            _text(name, "a cipher", empty=False)
        object.__setattr__(self, "ciphers", tuple(self.ciphers))


def announce_key(key: GroupKey | None) -> bytes:
    """The HMAC key that signs announcements (derived; never the group key itself)."""
    secret, group = (key.secret, key.group) if key is not None else (_LOOPBACK_SECRET, "")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"elsewhere peer v1 announce\0" + group.encode())  # fmt: skip
    return hkdf.derive(secret)


def encode_announcement(announcement: Announcement, key: GroupKey | None) -> bytes:
    """The signed datagram for ``announcement``; raises ValueError if over MAX_DATAGRAM."""
    a = announcement
    body = msgpack.packb(
        [a.group, a.address, a.port, a.user, a.host, int(a.state), a.slots, a.slots_free,
         a.mem_bytes, a.time_s, a.task, a.encrypt, list(a.ciphers)],
        use_bin_type=True,
    )  # fmt: skip
    size = _PREFIX_SIZE + len(body) + _TAG_SIZE
    if size > MAX_DATAGRAM:
        raise ValueError(f"announcement of {size} bytes is over {MAX_DATAGRAM} (long names?)")
    prefix = _PREFIX.pack(
        ANNOUNCE_MAGIC, ANNOUNCE_VERSION, FLAG_LEAVING if a.leaving else 0, len(body),
        round(a.timestamp * 1000), a.counter, bytes.fromhex(a.peer_id),
    )  # fmt: skip
    signed = prefix + body
    return signed + hmac.new(announce_key(key), signed, hashlib.sha256).digest()


class ClockSkew(ProtocolError):
    """An authentic announcement whose time is outside the window: a member of the group
    whose clock is off (or an old announcement replayed)."""


class AnnouncementDecoder:
    """Checks and parses datagrams of one group; remembers counters to refuse replays.

    ``decode`` raises :class:`ProtocolError` for every datagram it drops; the
    caller counts or logs and goes on. ``now`` is the receiver's wall clock.
    """

    def __init__(
        self, key: GroupKey | None, *, window_s: float = 30.0, max_peers: int = 4096
    ) -> None:
        self.group = key.group if key is not None else ""
        self.window_s = window_s
        self.max_peers = max_peers
        self.rekey(key)
        self._last: dict[bytes, tuple[int, float]] = {}  # peer id -> (counter, its timestamp)
        self._last_prune = 0.0

    def rekey(self, key: GroupKey | None) -> None:
        """Take ``key`` (of the same group: its file read again after a rotation); the memory
        of counters stays."""
        self._key = announce_key(key)
        # after a rotation: the previous keys, accepted until their overlap ends (sent: the current one)
        self._previous = [(announce_key(GroupKey(key.group, s)), until) for s, until in key.previous] if key else []

    def decode(self, datagram: bytes | bytearray | memoryview, now: float) -> Announcement:
        """Check ``datagram`` and return its announcement, or raise ProtocolError."""
        data = bytes(datagram)
        size = len(data)
        if not _MIN_DATAGRAM <= size <= MAX_DATAGRAM:
            raise ProtocolError(
                f"announcement of {size} bytes (allowed {_MIN_DATAGRAM}..{MAX_DATAGRAM})"
            )
        magic, version, flags, body_len, stamp_ms, counter, pid = _PREFIX.unpack_from(data)
        if magic != ANNOUNCE_MAGIC:
            raise ProtocolError("not an elsewhere announcement")
        if version != ANNOUNCE_VERSION:
            raise ProtocolError(
                f"announcement version {version}, this peer speaks {ANNOUNCE_VERSION}"
            )
        if flags & ~FLAG_LEAVING:
            raise ProtocolError(f"unknown announcement flags {flags:#04x}")
        if _PREFIX_SIZE + body_len + _TAG_SIZE != size:
            raise ProtocolError("announcement body length does not match the datagram")
        signed_end = size - _TAG_SIZE
        expected = hmac.new(self._key, data[:signed_end], hashlib.sha256).digest()
        if not hmac.compare_digest(expected, data[signed_end:]) and not any(
            until > now and hmac.compare_digest(hmac.new(k, data[:signed_end], hashlib.sha256).digest(),
                                                data[signed_end:])
            for k, until in self._previous
        ):  # fmt: skip
            raise ProtocolError("announcement failed authentication (another group key?)")
        stamp = stamp_ms / 1000
        if abs(stamp - now) > self.window_s:
            off = stamp - now
            where = "ahead of" if off > 0 else "behind"
            replay = "" if off > 0 else " (or an old announcement was replayed)"
            raise ClockSkew(f"its clock is {abs(off):.0f} s {where} this machine's, more than the "
                            f"{self.window_s:.0f} s allowed{replay}: synchronise the clocks (NTP)")  # fmt: skip
        last = self._last.get(pid)
        if last is not None and counter <= last[0]:
            raise ProtocolError("announcement replayed (counter not increasing)")
        try:
            fields_ = msgpack.unpackb(data[_PREFIX_SIZE:signed_end], raw=False, ext_hook=_no_ext)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"bad announcement body: {exc}") from None
        if not isinstance(fields_, list) or len(fields_) < 11:
            raise ProtocolError("announcement body is not an array of 11 fields")
        group, address, port, user, host, state, slots, free, mem, time_s, task = fields_[:11]
        try:
            ann = Announcement(
                pid.hex(), group, address, port, user, host, state, slots, free, mem, time_s,
                task, stamp, counter, bool(flags & FLAG_LEAVING), fields_[11] if len(fields_) > 11 else False,
                fields_[12] if len(fields_) > 12 else (),
            )  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"invalid announcement: {exc}") from None
        if ann.group != self.group:
            raise ProtocolError(f"announcement of group {ann.group!r}, not {self.group!r}")
        self._remember(pid, counter, stamp, now)
        return ann

    def _remember(self, pid: bytes, counter: int, stamp: float, now: float) -> None:
        self._last[pid] = (counter, stamp)
        if len(self._last) > self.max_peers or now - self._last_prune > self.window_s:
            # a counter older than the window is refused by the time check anyway
            self._last = {p: v for p, v in self._last.items() if now - v[1] <= self.window_s}
            self._last_prune = now
            while len(self._last) > self.max_peers:
                oldest = min(self._last, key=lambda p: self._last[p][1])
                del self._last[oldest]


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed")


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class PeerFilter:
    """Which peers to list: by the datagram's real source address, and by user.

    Empty ``allow_*`` means everyone. ``refuse_*`` wins over ``allow_*``.
    Addresses are IP addresses or networks ("10.1.2.0/24"). Users are what the
    peers claim: meaningful only among members of the group, who could lie.
    """

    allow_addresses: tuple[str, ...] = ()
    refuse_addresses: tuple[str, ...] = ()
    allow_users: tuple[str, ...] = ()
    refuse_users: tuple[str, ...] = ()
    _allow_nets: tuple[Any, ...] = field(default=(), init=False, repr=False, compare=False)
    _refuse_nets: tuple[Any, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("allow_addresses", "refuse_addresses"):
            nets = []
            for text in getattr(self, name):
                try:
                    nets.append(ipaddress.ip_network(text, strict=False))
                except ValueError:
                    raise ValueError(f"PeerFilter.{name}: {text!r} is not an address or network")
            object.__setattr__(self, "_" + name.replace("addresses", "nets"), tuple(nets))

    def allows(self, announcement: Announcement, source_ip: str) -> bool:
        """Whether a peer announcing ``announcement`` from ``source_ip`` is listed."""
        try:
            ip = ipaddress.ip_address(source_ip)
        except ValueError:
            return False
        if any(ip in net for net in self._refuse_nets):
            return False
        if self._allow_nets and not any(ip in net for net in self._allow_nets):
            return False
        if announcement.user in self.refuse_users:
            return False
        return not self.allow_users or announcement.user in self.allow_users


@dataclass(frozen=True)
class PeerInfo:
    """A peer as the table knows it.

    ``source`` is where its datagrams really come from; connect to
    :attr:`connect_address` (the source IP, the announced port), not to the
    address it claims.
    """

    announcement: Announcement
    source: tuple[str, int]
    first_seen: float
    last_seen: float

    @property
    def peer_id(self) -> str:
        """The peer's random id."""
        return self.announcement.peer_id

    @property
    def connect_address(self) -> tuple[str, int]:
        """(source IP of its datagrams, announced TCP port)."""
        return (self.source[0], self.announcement.port)


class PeerTable:
    """Known peers, kept from announcements; sans-IO (``now`` is a monotonic clock).

    Not thread-safe: the listener guards it with its lock.
    """

    def __init__(
        self, *, expire_after_s: float = 3.5, peer_filter: PeerFilter | None = None
    ) -> None:
        self.expire_after_s = expire_after_s
        self.peer_filter = peer_filter if peer_filter is not None else PeerFilter()
        self._peers: dict[str, PeerInfo] = {}
        self._groups: dict[str, dict[str, float]] = {}  # peer id -> group -> last heard in it

    def update(
        self, announcement: Announcement, source: tuple[str, int], now: float
    ) -> PeerInfo | None:
        """Record an announcement from ``source``; return the entry, or None if not listed.

        A LEAVING announcement, or one the filter refuses, removes the peer.
        """
        pid = announcement.peer_id
        if announcement.leaving or not self.peer_filter.allows(announcement, source[0]):
            self._peers.pop(pid, None)
            self._groups.pop(pid, None)
            return None
        old = self._peers.get(pid)
        info = PeerInfo(announcement, (source[0], source[1]),
                        old.first_seen if old is not None else now, now)  # fmt: skip
        self._peers[pid] = info
        self._groups.setdefault(pid, {})[announcement.group] = now
        return info

    def expire(self, now: float) -> list[PeerInfo]:
        """Drop and return peers silent for more than ``expire_after_s``."""
        gone = [p for p in self._peers.values() if now - p.last_seen > self.expire_after_s]
        for p in gone:
            del self._peers[p.peer_id]
            self._groups.pop(p.peer_id, None)
        return gone

    def groups(self, peer_id: str, now: float) -> list[str]:
        """The groups ``peer_id`` was heard in lately (a worker may serve several); "" is
        loopback-only mode."""
        heard = self._groups.get(peer_id, {})
        return sorted(g for g, t in heard.items() if now - t <= self.expire_after_s)

    def peers(self) -> list[PeerInfo]:
        """The listed peers, by peer id."""
        return sorted(self._peers.values(), key=lambda p: p.peer_id)

    def get(self, peer_id: str) -> PeerInfo | None:
        """The entry of ``peer_id``, if listed."""
        return self._peers.get(peer_id)

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers


def with_fields(announcement: Announcement, changes: dict[str, Any]) -> Announcement:
    """``announcement`` with ``changes``; raises ValueError naming an unknown field."""
    unknown = set(changes) - set(Announcement.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Announcement has no field(s) {', '.join(sorted(unknown))}")
    return replace(announcement, **changes)
