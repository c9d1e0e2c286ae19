"""Discovery over real UDP sockets: an announcer thread and a listener thread.

::

    Announcer thread                          Listener thread
    ----------------                          ---------------
    when AnnounceTimer says (every            select() on the multicast socket,
    interval_s +- jitter, longer in a         the unicast socket and a wake-up pipe
    large group), and on update_state():        --> AnnouncementDecoder.decode()
      encode_announcement() --sendto-->         --> PeerTable.update(source address)
        multicast group:port                    tick(): held wake-ups (20 a second at
        each static peer                          most), every 0.2 s PeerTable.expire()
      <-- group size: Listener.pace_for()       callers: peers(), wait_for(), group_size()

The group's announcements are paced (:class:`~.announce.AnnounceTimer`): a peer whose
announcer is paced by a listener (``pace_by(listener.pace_for(group))``) announces less often
as the group grows, so the whole group sends about ``group_rate`` datagrams a second. Both
threads' work is sans-IO underneath (:meth:`Announcer.datagram`, :meth:`Listener.receive`,
:meth:`Listener.tick`), which ``bench/peer_sim.py`` drives with a simulated clock.

Multicast goes to a scoped group (239.255.77.77 by default) on a
configurable port; where multicast is not allowed, list the peers in
``static_peers`` (each peer on one host then needs its own port). IPv4 only.

Without a group key (loopback-only mode) everything is bound to, sent from and
sent to 127.0.0.1: multicast with ``IP_MULTICAST_IF`` 127.0.0.1 and TTL 0,
membership on 127.0.0.1 (on loopback both ends must name 127.0.0.1, or the
datagrams leave by the default route), and datagrams from other sources are
dropped.

Both classes are context managers; ``stop()`` closes every socket, and every
wait has a timeout. The sockets are opened by :mod:`.net`
(through :mod:`.discoveryconfig`, which names the cause when they cannot be).
"""

from __future__ import annotations

import logging
import math
import random
import selectors
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

from ..util.errors import ConfigError, PeerError, ProtocolError
from . import recentpeers
from .announce import (
    MAX_DATAGRAM,
    Announcement,
    AnnouncementDecoder,
    AnnounceTimer,
    ClockSkew,
    PeerState,
    announce_key,
    encode_announcement,
    is_news,
    with_fields,
)
from .discoveryconfig import (
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_PORT,
    DiscoveryConfig,
    _is_loopback,
    parse_peer,
    receiver_sockets,
    resolve_static_peer,
    sender_socket,
)
from .keys import GroupKey
from .net import Waker
from .peertable import PeerFilter, PeerInfo, PeerTable

__all__ = [
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_PORT",
    "Announcer",
    "DiscoveryConfig",
    "Listener",
    "parse_peer",
]

log = logging.getLogger(__name__)

_POLL_S = 0.2
_WAKE_S = 0.05  # waiters wake at most this often (20 a second), however busy the group
_MAX_REFUSED = 64  # sources of refused announcements remembered (for `peer list`, notes)


class Announcer:
    """Sends ``announcement`` when its :class:`~.announce.AnnounceTimer` says: about every
    ``interval_s``, less often in a large group, and soon after a change.

    Each datagram gets a fresh timestamp and counter, and the interval it promises. Without
    :meth:`pace_by` it announces as in a group of one (every ``interval_s``). ``stop()`` sends
    a last LEAVING datagram (unless ``goodbye=False``) so listeners drop the peer at once
    instead of waiting for it to expire.
    """

    def __init__(
        self,
        announcement: Announcement,
        key: GroupKey | None,
        config: DiscoveryConfig | None = None,
        *,
        rng: random.Random | None = None,
        group_size: Callable[[], int] | None = None,
    ) -> None:
        self.key = key
        self.config = (config if config is not None else DiscoveryConfig()).for_key(key)
        group = key.group if key is not None else ""
        if announcement.group != group:
            raise ConfigError(
                f"announcement of group {announcement.group!r} with a key of {group!r}"
            )
        self._signing_key = announce_key(key)
        # too large? fail here, not in the thread
        encode_announcement(announcement, key, signing_key=self._signing_key)
        self._announcement = announcement
        cfg = self.config
        self.timer = AnnounceTimer(cfg.interval_s, cfg.jitter, cfg.group_rate, rng)
        self._group_size = group_size
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._destinations: list[tuple[str, int]] = []
        self._counter = 0
        self._sent: Announcement | None = None  # the last datagram's announcement
        self._nudged = False
        self.sent = 0
        """Datagrams sent (to all destinations) so far."""

    @property
    def announcement(self) -> Announcement:
        """The announcement as it is now (without per-datagram timestamp/counter)."""
        with self._lock:
            return self._announcement

    def pace_by(self, group_size: Callable[[], int]) -> None:
        """Pace the announcements by ``group_size()``, the peers heard in the group now
        (:meth:`Listener.pace_for`); it is asked at every look at the timer."""
        self._group_size = group_size
        self._wake.set()

    def group_size(self) -> int:
        """The size of the group the pace follows (1 when not paced)."""
        size = self._group_size
        return max(1, size()) if size is not None else 1

    def start(self) -> Announcer:
        """Open the socket and start the thread; returns self."""
        if self._thread is not None:
            raise PeerError("announcer already started")
        cfg = self.config
        self._sock = sender_socket(cfg)
        dests: list[tuple[str, int]] = []
        if cfg.multicast_group is not None:
            dests.append((cfg.multicast_group, cfg.port))
        for host, port in cfg.static_peers:
            resolved = resolve_static_peer(host, port)
            if resolved is not None:
                dests.append(resolved)
        self._destinations = dests
        self._thread = threading.Thread(target=self._run, name="elsewhere-announcer", daemon=True)
        self._thread.start()
        return self

    def update_state(self, **changes: Any) -> Announcement:
        """Change fields of the announcement (state, slots_free, task, ...) and announce soon
        if that is news (:func:`~.announce.is_news`; with no fields: the same again, as news)
        (at once, unless a large group's pace holds it to the next datagram due)."""
        with self._lock:
            updated = with_fields(self._announcement, changes)
            if (
                updated.peer_id != self._announcement.peer_id
                or updated.group != self._announcement.group
            ):
                raise ConfigError("peer_id and group of a running announcer cannot change")
            encode_announcement(updated, self.key, signing_key=self._signing_key)
            self._announcement = updated
            self._nudged = self._nudged or not changes  # (said again at once: a controller is new)
            self.timer.changed(self._nudged or is_news(updated, self._sent))
        self._wake.set()
        return updated

    def due(self, now: float, group_size: int) -> float:
        """When the next datagram is due, on the monotonic clock ``now``."""
        with self._lock:
            return self.timer.due(now, group_size)

    def datagram(self, now: float, wall: float, group_size: int, *, leaving: bool = False) -> bytes:
        """The next datagram, stamped with the wall clock ``wall``; the timer counts it as
        sent at ``now`` (monotonic). Sans-IO: what the thread sends."""
        with self._lock:
            self._counter += 1
            interval = self.timer.sent(now, group_size)
            ann = replace(self._announcement, timestamp=wall, counter=self._counter,
                          leaving=leaving, interval_s=interval)  # fmt: skip
            self._sent, self._nudged = ann, False
            return encode_announcement(ann, self.key, signing_key=self._signing_key)

    def stop(self, *, goodbye: bool = True, timeout: float = 2.0) -> None:
        """Stop the thread, send a LEAVING datagram (if ``goodbye``), close the socket."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("announcer thread did not stop within %.1f s", timeout)
        if goodbye and self._sock is not None and self._thread is not None:
            self._send(leaving=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Announcer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def _run(self) -> None:
        look_s = self.config.interval_s  # the group's size is looked at again at least this often
        while not self._stop.is_set():
            now = time.monotonic()
            due = self.due(now, self.group_size())
            if due <= now:
                self._send()
                continue
            self._wake.wait(min(due - now, look_s))
            self._wake.clear()

    def _send(self, *, leaving: bool = False) -> None:
        data = self.datagram(time.monotonic(), time.time(), self.group_size(), leaving=leaving)
        with self._lock:
            sock = self._sock
            if sock is None:
                return
            for dest in self._destinations:
                try:
                    sock.sendto(data, dest)
                except OSError as exc:  # network down, no route: try again next interval
                    log.debug("announcement to %s:%d failed: %s", dest[0], dest[1], exc)
            self.sent += 1


class Listener:
    """Receives announcements and keeps a :class:`PeerTable` of the group's peers (of each
    group, with ``more_keys``: a worker that serves several).

    ``only_states``: list only peers in these states and count the others (a worker daemon
    needs the controllers alone; the count still paces its announcers). Waiters
    (:meth:`wait_for`) wake when the listing changes, not at every repeated announcement, and
    at most 20 times a second: a change within 50 ms of the last wake-up waits for the next.
    """

    def __init__(
        self,
        key: GroupKey | None,
        config: DiscoveryConfig | None = None,
        *,
        peer_filter: PeerFilter | None = None,
        more_keys: Sequence[GroupKey] = (),
        only_states: Collection[PeerState] | None = None,
        carry_over: bool = False,
    ) -> None:
        if more_keys and key is None:
            raise PeerError("more_keys are for a keyed listener")
        self.config = (config if config is not None else DiscoveryConfig()).for_key(key)
        self.loopback_only = key is None
        # one decoder per group heard (a worker of several groups: one socket for them all,
        # so that a unicast datagram, which reaches one socket of a port, is never lost)
        self._decoders = [
            AnnouncementDecoder(k, window_s=self.config.window_s) for k in (key, *more_keys)
        ]
        self._fingerprints = tuple(k.fingerprint if k is not None else "" for k in (key, *more_keys))
        self.carry_over = carry_over
        self._table = PeerTable(expire_after_s=self.config.expire_after_s, peer_filter=peer_filter,
                                interval_s=self.config.interval_s, only_states=only_states)  # fmt: skip
        self._expired_at = -math.inf
        self._woke_at = -math.inf
        self._wake_held = False  # a change waiters have not been woken for yet
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._socks: list[socket.socket] = []
        self._waker: Waker | None = None  # stop() wakes the thread
        self.dropped = 0
        """Datagrams dropped: not authentic, stale, replayed, malformed, or not from loopback."""
        # source -> (count, why, when, authentic)
        self._refused: dict[str, tuple[int, str, float, bool]] = {}
        self.received = 0
        """Datagrams accepted."""

    def _recent_key(self) -> tuple[Any, ...]:
        return self._fingerprints, repr(self.config)

    def start(self) -> Listener:
        """Bind the sockets and start the thread; returns self. With ``carry_over`` (a
        controller's, which connects to what it lists and so finds out at once who is gone),
        the peers a listener of the same keys and configuration in this process heard before
        it stopped are listed at once, as heard then (each expires on time unless it
        announces again); without (``peer list``), only what this one hears."""
        if self._thread is not None:
            raise PeerError("listener already started")
        if self.carry_over:
            with self._cond:
                recentpeers.recall(self._recent_key(), self._table, self.config.expire_after_s)
        self._socks = receiver_sockets(self.config)
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="elsewhere-listener", daemon=True)
        self._thread.start()
        return self

    def peers(self) -> list[PeerInfo]:
        """The peers listed now."""
        with self._cond:
            return self._table.peers()

    def group_size(self, group: str) -> int:
        """How many peers are heard in ``group`` now, listed or not."""
        with self._cond:
            return self._table.group_size(group)

    def pace_for(self, group: str) -> Callable[[], int]:
        """What paces an :class:`Announcer` of ``group`` (:meth:`Announcer.pace_by`): the
        group's size as heard here, or 1 (no slower than ``interval_s``) while a peer of the
        previous protocol version is heard in it, which expires peers after a fixed time."""

        def size() -> int:
            with self._cond:
                if self._table.previous_version(group):
                    return 1
                return self._table.group_size(group)

        return size

    def _note_refusal(
        self, source: str, why: ProtocolError | None, now: float | None = None
    ) -> None:
        now = time.monotonic() if now is None else now
        with self._cond:
            count = self._refused.get(source, (0, "", 0.0, False))[0]
            if count == 0 and len(self._refused) >= _MAX_REFUSED:  # bounded: sources can be forged
                del self._refused[min(self._refused, key=lambda s: self._refused[s][2])]
            authentic = isinstance(why, ClockSkew)
            self._refused[source] = (count + 1, str(why or "dropped"), now, authentic)

    def refusals(self, *, within_s: float = 10.0) -> dict[str, tuple[int, str, bool]]:
        """Sources whose announcements were refused lately: address -> (how many, why the
        last one was, whether it was authentic, i.e. of a member of the group whose clock
        is off). A wrong key's, another group's and garbage are not authentic."""
        now = time.monotonic()
        with self._cond:
            return {src: (n, why, authentic) for src, (n, why, when, authentic) in self._refused.items()
                    if now - when <= within_s}  # fmt: skip

    def rekey(self, keys: Sequence[GroupKey]) -> None:
        """New keys of the groups it listens in, in their order (key files read again after a
        rotation): announcements under a previous key still in its overlap are accepted."""
        for decoder, key in zip(self._decoders, keys):
            decoder.rekey(key)

    def groups_of(self, peer_id: str) -> list[str]:
        """The groups ``peer_id`` was heard in lately: with ``more_keys``, a worker that
        serves several of them is listed once, in each."""
        with self._cond:
            return self._table.groups(peer_id, time.monotonic())

    def wait_for(self, predicate: Callable[[list[PeerInfo]], bool], timeout: float) -> bool:
        """Wait until ``predicate(peers)`` holds; False if ``timeout`` seconds ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._table.peers()), timeout)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread and close the sockets; waiters (:meth:`wait_for`) look again now
        (a controller's watch of the workers ends with it, not at its timeout)."""
        if self.carry_over and self._thread is not None and not self._stop.is_set():
            with self._cond:
                recentpeers.remember(self._recent_key(), self._table.peers())
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._waker is not None:
            self._waker.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("listener thread did not stop within %.1f s", timeout)
        for s in self._socks:
            s.close()
        if self._waker is not None:
            self._waker.close()
        self._socks = []
        self._waker = None

    def __enter__(self) -> Listener:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            for s in self._socks:
                sel.register(s, selectors.EVENT_READ)
            assert self._waker is not None  # set by start()
            wake = self._waker.reader
            sel.register(wake, selectors.EVENT_READ)
            while not self._stop.is_set():
                for sk, _ in sel.select(timeout=_WAKE_S if self._wake_held else _POLL_S):
                    if sk.fileobj is not wake:
                        self._drain(sk.fileobj)  # type: ignore[arg-type]
                self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        """What the thread does after every batch of datagrams (``now``: the monotonic clock):
        wake the waiters of a change held back, and every 0.2 s drop the peers that fell
        silent. Sans-IO."""
        with self._cond:
            if self._wake_held and now - self._woke_at >= _WAKE_S:
                self._wake(now)
            if now - self._expired_at < _POLL_S:
                return
            self._expired_at = now
            if self._table.expire(now):
                self._wake(now)

    def _wake(self, now: float) -> None:
        """Wake the waiters (under the lock)."""
        self._woke_at, self._wake_held = now, False
        self._cond.notify_all()

    @property
    def changes(self) -> int:
        """How many times the listing has changed: a waiter that only needs to know whether
        something changed since it last looked compares this, without reading the table."""
        with self._cond:
            return self._table.changes

    def _drain(self, sock: socket.socket) -> None:
        for _ in range(64):  # bounded, so expiry and stop are never starved
            try:
                data, source = sock.recvfrom(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("discovery recvfrom failed: %s", exc)
                return
            self._handle(data, source)

    def _handle(self, data: bytes, source: tuple[str, int]) -> None:
        self.receive(data, source, time.time(), time.monotonic())

    def receive(self, data: bytes, source: tuple[str, int], wall: float, now: float) -> None:
        """One datagram from ``source``, received at ``wall`` (the wall clock, which its
        timestamp must be near) and ``now`` (monotonic). Sans-IO: what the thread does with
        each datagram."""
        if self.loopback_only and not _is_loopback(source[0]):
            self.dropped += 1
            return
        why: ProtocolError | None = None
        for decoder in self._decoders:
            try:
                ann = decoder.decode(data, wall)
                break
            except ClockSkew as exc:
                why = exc  # authentic, of this group: the reason that matters
            except ProtocolError as exc:
                why = why or exc  # the first group's reason
            except Exception:  # a bug must not silence discovery: log it, keep listening
                self.dropped += 1
                log.exception("announcement from %s could not be decoded", source[0])
                return
        else:
            self.dropped += 1
            log.debug("dropped announcement from %s: %s", source[0], why)
            self._note_refusal(source[0], why, now)
            return
        with self._cond:
            self.received += 1
            changes = self._table.changes
            self._table.update(ann, source, now)
            if self._table.changes != changes:
                if now - self._woke_at >= _WAKE_S:
                    self._wake(now)
                else:
                    self._wake_held = True
