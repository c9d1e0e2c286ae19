"""UDP announcements, sans-IO: the datagram, its checks, and when a peer sends the next.

Every peer announces itself about once a second, less often in a large group (see
:class:`AnnounceTimer`; the sockets are in ``discovery.py``); receivers check each datagram and
keep a :class:`~.peertable.PeerTable`. Datagram layout (all integers big-endian)::

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
                                 best first (absent: AES-256-GCM only), its
                                 announcement interval now in ms (absent: a peer
                                 of the previous version, which announces every
                                 second) (a newer version may append fields)
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
import hmac
import math
import operator
import random
import secrets
import struct
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
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
    "AnnounceTimer",
    "Announcement",
    "AnnouncementDecoder",
    "ClockSkew",
    "PeerState",
    "announce_key",
    "encode_announcement",
    "is_news",
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


@dataclass(frozen=True, slots=True)
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
    interval_s: float = 0.0
    """How often the peer announces itself now, on average (set by its :class:`AnnounceTimer`
    for each datagram); receivers expire it after a multiple of that. 0: not said (a peer of
    the previous version, which announces every second)."""

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
        for name in ("time_s", "timestamp", "interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r:.80}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not 0 <= self.timestamp < 2**63 / 1000:
            raise ValueError(f"timestamp out of range: {self.timestamp!r}")
        if not self.interval_s < 2**32 / 1000:
            raise ValueError(f"interval_s out of range: {self.interval_s!r}")
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

    def says_the_same(self, other: Announcement) -> bool:
        """Whether ``other`` says what this one says (timestamp and counter aside)."""
        return _content(self) == _content(other)


_content = operator.attrgetter(
    *(f.name for f in fields(Announcement) if f.name not in ("timestamp", "counter"))
)


def announce_key(key: GroupKey | None) -> bytes:
    """The HMAC key that signs announcements (derived; never the group key itself)."""
    secret, group = (key.secret, key.group) if key is not None else (_LOOPBACK_SECRET, "")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"elsewhere peer v1 announce\0" + group.encode())  # fmt: skip
    return hkdf.derive(secret)


def encode_announcement(
    announcement: Announcement, key: GroupKey | None, *, signing_key: bytes | None = None
) -> bytes:
    """The signed datagram for ``announcement``; raises ValueError if over MAX_DATAGRAM.

    ``signing_key``: ``announce_key(key)``, when the caller keeps it (it is derived anew
    otherwise)."""
    a = announcement
    body = msgpack.packb(
        [a.group, a.address, a.port, a.user, a.host, int(a.state), a.slots, a.slots_free,
         a.mem_bytes, a.time_s, a.task, a.encrypt, list(a.ciphers), round(a.interval_s * 1000)],
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
    mac_key = signing_key if signing_key is not None else announce_key(key)
    return signed + hmac.digest(mac_key, signed, "sha256")


class ClockSkew(ProtocolError):
    """An authentic announcement whose time is outside the window: a member of the group
    whose clock is off (or an old announcement replayed)."""


class AnnouncementDecoder:
    """Checks and parses datagrams of one group; remembers counters to refuse replays.

    ``decode`` raises :class:`ProtocolError` for every datagram it drops; the
    caller counts or logs and goes on. ``now`` is the receiver's wall clock.
    """

    def __init__(
        self, key: GroupKey | None, *, window_s: float = 30.0, max_peers: int = 65536
    ) -> None:
        self.group = key.group if key is not None else ""
        self.window_s = window_s
        self.max_peers = max_peers
        """The most peer ids whose counters are remembered (a member of the group could
        invent ids; the least recently heard is forgotten first)."""
        self.rekey(key)
        # peer id -> (counter, its timestamp, the id), least recently heard first; that str of
        # the id is the one every announcement of the peer then holds (and so does the table)
        self._last: OrderedDict[str, tuple[int, float, str]] = OrderedDict()
        # strings and cipher lists that many peers send alike (group, user): one object each
        self._shared: dict[Any, Any] = {}

    def rekey(self, key: GroupKey | None) -> None:
        """Take ``key`` (of the same group: its file read again after a rotation); the memory
        of counters stays."""
        self._key = announce_key(key)
        # after a rotation: the previous keys, accepted until their overlap ends (sent: the current one)
        self._previous = (
            [(announce_key(GroupKey(key.group, s)), until) for s, until in key.previous]
            if key
            else []
        )

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
        signed, tag = memoryview(data)[:signed_end], data[signed_end:]
        if not hmac.compare_digest(hmac.digest(self._key, signed, "sha256"), tag) and not any(
            until > now and hmac.compare_digest(hmac.digest(k, signed, "sha256"), tag)
            for k, until in self._previous
        ):
            raise ProtocolError("announcement failed authentication (another group key?)")
        stamp = stamp_ms / 1000
        if abs(stamp - now) > self.window_s:
            off = stamp - now
            where = "ahead of" if off > 0 else "behind"
            replay = "" if off > 0 else " (or an old announcement was replayed)"
            raise ClockSkew(f"its clock is {abs(off):.0f} s {where} this machine's, more than the "
                            f"{self.window_s:.0f} s allowed{replay}: synchronise the clocks (NTP)")  # fmt: skip
        peer_id = pid.hex()
        last = self._last.get(peer_id)
        if last is not None and counter <= last[0]:
            raise ProtocolError("announcement replayed (counter not increasing)")
        try:
            fields_ = msgpack.unpackb(data[_PREFIX_SIZE:signed_end], raw=False, ext_hook=_no_ext)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ProtocolError(f"bad announcement body: {exc}") from None
        if not isinstance(fields_, list) or len(fields_) < 11:
            raise ProtocolError("announcement body is not an array of 11 fields")
        group, address, port, user, host, state, slots, free, mem, time_s, task = fields_[:11]
        more = len(fields_)
        interval_ms = fields_[13] if more > 13 else 0  # absent: a peer of the previous version
        if (
            not isinstance(interval_ms, int)
            or isinstance(interval_ms, bool)
            or not 0 <= interval_ms < 2**32
        ):
            raise ProtocolError(f"invalid announcement: interval {interval_ms!r:.80} (ms)")
        ciphers = fields_[12] if more > 12 else ()
        if isinstance(ciphers, list):
            ciphers = tuple(ciphers)
        if last is not None:
            peer_id = last[2]
        try:
            ann = Announcement(
                peer_id, self._share(group), address, port, self._share(user), host, state, slots,
                free, mem, time_s, task, stamp, counter, bool(flags & FLAG_LEAVING),
                fields_[11] if more > 11 else False, self._share(ciphers), interval_ms / 1000,
            )  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"invalid announcement: {exc}") from None
        if ann.group != self.group:
            raise ProtocolError(f"announcement of group {ann.group!r}, not {self.group!r}")
        self._remember(ann.peer_id, counter, stamp, now)
        return ann

    def _share(self, value: Any) -> Any:
        """``value``, or an equal object already made (hashable values only)."""
        try:
            return self._shared.setdefault(value, value)
        except TypeError:  # unhashable: a bad field, which the checks that follow name
            return value
        finally:
            if len(self._shared) > 1024:  # a member sending many names: start again
                self._shared.clear()

    def _remember(self, pid: str, counter: int, stamp: float, now: float) -> None:
        last = self._last
        last[pid] = (counter, stamp, pid)
        last.move_to_end(pid)
        # forget the least recently heard: over the bound, or older than the window (whose
        # datagrams the time check refuses anyway); each datagram costs the same in any group
        while last and (
            len(last) > self.max_peers or now - next(iter(last.values()))[1] > self.window_s
        ):
            last.popitem(last=False)


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed")


class AnnounceTimer:
    """When a peer sends its next announcement: sans-IO (``now`` is a monotonic clock).

    The group as a whole sends about ``group_rate`` announcements a second, whatever its size,
    the way RTCP scales its report interval with the session (RFC 3550, section 6.2): a peer
    that hears ``n`` peers in its group announces every ``T = max(interval_s, n / group_rate)``
    seconds on average, each interval drawn from ``T * (1 +- jitter)`` so that peers started
    together drift apart. Up to ``interval_s * group_rate`` peers (200 by default) nothing
    changes: a datagram every second.

    A change (``changed()``: a new state, free slots, a new controller heard) is announced at
    once out of the share of the rate that periodic announcements leave: a peer gets
    ``group_rate / n`` datagrams a second, the periodic ones use ``1 / T``, and the rest fills a
    one-datagram credit. In a small group that is at once (a group of 2 has 99 a second to
    spare); where the periodic ones use it all, a change waits for the next one.

    Receivers expire a peer after a multiple of the interval its last datagram announced
    (:meth:`sent` returns it), so that interval is a promise: when the group grows, the next
    datagram still comes within it (and announces the longer one); when the group shrinks, the
    next comes sooner (the time is reconsidered with the group's size at every look).
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        jitter: float = 0.2,
        group_rate: float = 200.0,
        rng: random.Random | None = None,
    ) -> None:
        if not interval_s > 0 or not 0 <= jitter < 1 or not group_rate > 0:
            raise ValueError(f"need interval_s > 0, jitter in [0, 1), group_rate > 0; got "
                             f"{interval_s}, {jitter}, {group_rate}")  # fmt: skip
        self.interval_s = interval_s
        self.jitter = jitter
        self.group_rate = group_rate
        self._rng = rng if rng is not None else random.Random()
        self._last: float | None = None  # when the last datagram went
        self._promised = interval_s  # the interval it announced
        self._factor = 1.0  # this interval's random part
        self._credit = 1.0  # datagrams that a change may send at once (at most one)
        self._credit_at = 0.0
        self._change = False

    def interval(self, group_size: int) -> float:
        """The mean interval in a group of ``group_size`` peers."""
        return max(self.interval_s, group_size / self.group_rate)

    def changed(self, news: bool = True) -> None:
        """Something changed: announce it as soon as the pace allows (``news``; False: it
        was undone, or is too small to say before the next periodic datagram)."""
        self._change = news

    def due(self, now: float, group_size: int) -> float:
        """When the next datagram is due (at or before ``now``: send it)."""
        if self._last is None:
            return -math.inf
        periodic = self._last + min(self.interval(group_size), self._promised) * self._factor
        if not self._change:
            return periodic
        spare = self._spare(group_size)
        credit = self._credit_now(now, spare)
        if credit >= 1:
            return now
        return periodic if spare <= 0 else min(periodic, now + (1 - credit) / spare)

    def sent(self, now: float, group_size: int) -> float:
        """A datagram goes at ``now``: returns the interval it announces."""
        spare = self._spare(group_size)
        credit = self._credit_now(now, spare)
        if self._last is not None and self._change:  # sent before it was due: a change's
            periodic = self._last + min(self.interval(group_size), self._promised) * self._factor
            if now < periodic:
                credit = max(0.0, credit - 1)
        self._credit, self._credit_at = credit, now
        self._last, self._change = now, False
        self._promised = self.interval(group_size)
        self._factor = 1 + self._rng.uniform(-self.jitter, self.jitter)
        return self._promised

    def _spare(self, group_size: int) -> float:
        """Datagrams a second left to this peer beyond its periodic ones."""
        return max(0.0, self.group_rate / max(1, group_size) - 1 / self.interval(group_size))

    def _credit_now(self, now: float, spare: float) -> float:
        return min(1.0, self._credit + max(0.0, now - self._credit_at) * spare)


_NEWS_FRACTION = 8  # memory or time on offer that moved by more than 1/8 is news
_steady = operator.attrgetter(*(f.name for f in fields(Announcement)
                                if f.name not in ("timestamp", "counter", "mem_bytes", "time_s", "interval_s", "leaving")))  # fmt: skip


def is_news(now: Announcement, sent: Announcement | None) -> bool:
    """Whether ``now`` tells listeners something that ``sent``, the last datagram, did not: a
    new state, free slots, task (or any other field), or memory or time on offer moved by
    more than an eighth. Less is not worth a datagram of its own (the next periodic one
    carries it; a worker's admission checks both anyway): the free memory moves at every
    look, and a slot freed and filled again at once (a held ASK admitted) changed nothing by
    the time the datagram would go."""
    if sent is None or _steady(now) != _steady(sent):
        return True
    return _moved(now.mem_bytes, sent.mem_bytes) or _moved(now.time_s, sent.time_s)


def _moved(now: float, before: float) -> bool:
    return now != before and (math.isinf(now) or math.isinf(before) or abs(now - before) * _NEWS_FRACTION > before)


def with_fields(announcement: Announcement, changes: dict[str, Any]) -> Announcement:
    """``announcement`` with ``changes``; raises ValueError naming an unknown field."""
    unknown = set(changes) - set(Announcement.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Announcement has no field(s) {', '.join(sorted(unknown))}")
    return replace(announcement, **changes)

