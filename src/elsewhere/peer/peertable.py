"""The table of known peers, kept from announcements; sans-IO (``now`` is a monotonic clock).

Every authentic announcement of the group is *heard*: the table counts the peers of each group
(:meth:`PeerTable.group_size`, which paces the announcers, see :class:`~.announce.AnnounceTimer`)
and expires them. Only some are *listed* with all they said (:meth:`PeerTable.peers`): those the
:class:`PeerFilter` allows, in the states the owner asked for (a worker daemon lists the
controllers alone, and counts the rest).

A peer expires when it has been silent for ``expire_after_s`` times its announced interval over
``interval_s`` (the base interval: 3.5 s for a peer announcing every second, the default; 175 s
for one that announces every 50 s in a group of 10 000), never sooner than ``expire_after_s``. A
peer of the previous protocol version announces no interval: it announces every second and is
expired after ``expire_after_s``, as before; :meth:`PeerTable.previous_version` counts them, so
that nobody in their group announces less often than they expect.

Expiry is a timing wheel of 0.25 s slots (each peer in the slot of its deadline), so neither an
announcement nor :meth:`PeerTable.expire` costs more in a larger group.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .announce import Announcement, PeerState

__all__ = ["PeerFilter", "PeerInfo", "PeerTable"]

_SLOT_S = 0.25  # the timing wheel's resolution: a peer expires at most this late


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

    @property
    def everyone(self) -> bool:
        """Whether it allows every peer (nothing to check)."""
        return not (self.allow_addresses or self.refuse_addresses or self.allow_users
                    or self.refuse_users)  # fmt: skip

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


@dataclass(frozen=True, slots=True)
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


def _slot(deadline: float) -> int:
    """The wheel's slot of ``deadline`` (every time in it is at or before its end)."""
    return math.ceil(deadline / _SLOT_S)


class _Heard:
    """What the table keeps of every peer it hears, listed or not."""

    __slots__ = ("also", "group", "previous", "seen", "span")

    def __init__(self, group: str, now: float, span: float, previous: bool) -> None:
        self.group, self.seen = group, now  # the group it was first heard in, when last
        self.also: dict[str, float] | None = None  # other groups (a worker serving several)
        self.span = span  # silent for longer: expired
        self.previous = previous  # of the previous protocol version (announces no interval)

    @property
    def deadline(self) -> float:
        """When it expires, unless heard again."""
        return (self.seen if self.also is None else max(self.seen, *self.also.values())) + self.span

    def groups(self) -> dict[str, float]:
        """The groups it was heard in -> when last."""
        return {self.group: self.seen, **(self.also or {})}

    def heard_in(self, group: str, now: float) -> bool:
        """Record that it was heard in ``group``; whether it is a group new for it."""
        if group == self.group:
            self.seen = now
            return False
        if self.also is None:
            self.also = {}
        new = group not in self.also
        self.also[group] = now
        return new


class PeerTable:
    """Known peers, kept from announcements (see the module doc). Not thread-safe: the
    listener guards it with its lock.

    ``interval_s`` is the base announcement interval; ``only_states`` lists peers in those
    states alone (None: all) and counts the others.
    """

    def __init__(
        self,
        *,
        expire_after_s: float = 3.5,
        peer_filter: PeerFilter | None = None,
        interval_s: float = 1.0,
        only_states: Collection[PeerState] | None = None,
    ) -> None:
        if not 0 < interval_s < expire_after_s:
            raise ValueError(
                f"need 0 < interval_s < expire_after_s, got {interval_s}, {expire_after_s}"
            )
        self.expire_after_s = expire_after_s
        self.peer_filter = peer_filter if peer_filter is not None else PeerFilter()
        self.only_states = frozenset(only_states) if only_states is not None else None
        self._per_interval = expire_after_s / interval_s
        self._peers: dict[str, PeerInfo] = {}  # listed
        self._heard: dict[str, _Heard] = {}  # every peer heard, listed or not
        self._sizes: dict[str, int] = {}  # group -> peers heard in it
        self._previous: dict[str, int] = {}  # group -> of them, of the previous version
        self._wheel: dict[int, dict[str, None]] = {}  # slot -> peers whose deadline is in it
        self._next_slot: int | None = None  # the first slot expire() has not emptied
        self._order: list[str] | None = None  # listed peer ids, sorted (None: to sort again)
        self.changes = 0
        """Bumped whenever the listing changes: a peer listed or dropped, or one that says
        something new (not a mere repeat of what it said); a listener wakes its waiters then."""

    def update(
        self, announcement: Announcement, source: tuple[str, int], now: float
    ) -> PeerInfo | None:
        """Record an announcement from ``source``; return the entry, or None if not listed.

        A LEAVING announcement removes the peer; one the filter refuses, or in a state not
        listed, is counted but not listed.
        """
        pid, group = announcement.peer_id, announcement.group
        if announcement.leaving:
            self._forget(pid)
            return None
        previous = announcement.interval_s == 0
        span = max(self.expire_after_s, announcement.interval_s * self._per_interval)
        heard = self._heard.get(pid)
        if heard is None:
            heard = self._heard[pid] = _Heard(group, now, span, previous)
            self._count(group, previous, 1)
        else:
            self._unslot(pid, heard)
            if heard.heard_in(group, now):
                self._count(group, heard.previous, 1)
            if previous != heard.previous:
                for g in heard.groups():
                    self._previous[g] = self._previous.get(g, 0) + (1 if previous else -1)
                heard.previous = previous
            heard.span = span
        slot = _slot(heard.deadline)
        self._wheel.setdefault(slot, {})[pid] = None
        if self._next_slot is None or slot < self._next_slot:
            self._next_slot = slot
        return self._list(announcement, source, now)

    def _list(
        self, announcement: Announcement, source: tuple[str, int], now: float
    ) -> PeerInfo | None:
        pid = announcement.peer_id
        old = self._peers.get(pid)
        if (self.only_states is not None and announcement.state not in self.only_states) or (
            not self.peer_filter.everyone and not self.peer_filter.allows(announcement, source[0])
        ):
            if old is not None:
                self._unlist(pid)
            return None
        if old is None:
            ip = announcement.address if announcement.address == source[0] else source[0]  # one str
            info = PeerInfo(announcement, (ip, source[1]), now, now)
            self._order = None
            self.changes += 1
        else:
            info = PeerInfo(announcement, old.source if old.source == source else (source[0], source[1]),
                            old.first_seen, now)  # fmt: skip
            if info.source is not old.source or not old.announcement.says_the_same(announcement):
                self.changes += 1
        self._peers[pid] = info
        return info

    def _count(self, group: str, previous: bool, by: int) -> None:
        self._sizes[group] = self._sizes.get(group, 0) + by
        if previous:
            self._previous[group] = self._previous.get(group, 0) + by

    def _unlist(self, pid: str) -> PeerInfo | None:
        info = self._peers.pop(pid, None)
        if info is not None:
            self._order = None
            self.changes += 1
        return info

    def _unslot(self, pid: str, heard: _Heard) -> None:
        slot = _slot(heard.deadline)
        peers = self._wheel.get(slot)
        if peers is not None:
            peers.pop(pid, None)
            if not peers:
                del self._wheel[slot]

    def _forget(self, pid: str) -> PeerInfo | None:
        heard = self._heard.pop(pid, None)
        if heard is not None:
            self._unslot(pid, heard)
            for g in heard.groups():
                self._count(g, heard.previous, -1)
        return self._unlist(pid)

    def expire(self, now: float) -> list[PeerInfo]:
        """Drop the peers silent for longer than their span; return those that were listed."""
        gone: list[PeerInfo] = []
        last = math.floor(now / _SLOT_S)
        if self._next_slot is None or self._next_slot > last:
            return gone
        if last - self._next_slot > len(self._wheel):  # a long gap: visit the slots there are
            slots: Iterable[int] = sorted(s for s in self._wheel if s <= last)
        else:
            slots = range(self._next_slot, last + 1)
        for slot in slots:
            for pid in self._wheel.pop(slot, {}):  # (their deadlines: at or before now)
                info = self._forget(pid)
                if info is not None:
                    gone.append(info)
        self._next_slot = last + 1
        return gone

    def groups(self, peer_id: str, now: float) -> list[str]:
        """The groups ``peer_id`` was heard in lately (a worker may serve several); "" is
        loopback-only mode."""
        heard = self._heard.get(peer_id)
        if heard is None or peer_id not in self._peers:
            return []
        return sorted(g for g, t in heard.groups().items() if now - t <= heard.span)

    def group_size(self, group: str) -> int:
        """How many peers are heard in ``group`` (listed or not)."""
        return self._sizes.get(group, 0)

    def previous_version(self, group: str) -> int:
        """How many of them are of the previous protocol version (they announce no interval,
        and expire their peers after a fixed time)."""
        return self._previous.get(group, 0)

    def peers(self) -> list[PeerInfo]:
        """The listed peers, by peer id."""
        if self._order is None:
            self._order = sorted(self._peers)
        peers = self._peers
        return [peers[p] for p in self._order]

    def get(self, peer_id: str) -> PeerInfo | None:
        """The entry of ``peer_id``, if listed."""
        return self._peers.get(peer_id)

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers
