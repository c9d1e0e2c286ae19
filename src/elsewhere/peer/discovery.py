"""Discovery over real UDP sockets: an announcer thread and a listener thread.

::

    Announcer thread                          Listener thread
    ----------------                          ---------------
    every interval_s (+- jitter),             select() on the multicast socket,
    and at once on update_state():            the unicast socket and a wake-up pipe
      encode_announcement() --sendto-->         --> AnnouncementDecoder.decode()
        multicast group:port                    --> PeerTable.update(source address)
        each static peer                        every 0.2 s: PeerTable.expire()
                                                callers: peers(), wait_for()

Multicast goes to a scoped group (239.255.77.77 by default) on a
configurable port; where multicast is not allowed, list the peers in
``static_peers`` (each peer on one host then needs its own port). IPv4 only.

Without a group key (loopback-only mode) everything is bound to, sent from and
sent to 127.0.0.1: multicast with ``IP_MULTICAST_IF`` 127.0.0.1 and TTL 0,
membership on 127.0.0.1 (on loopback both ends must name 127.0.0.1, or the
datagrams leave by the default route), and datagrams from other sources are
dropped.

Both classes are context managers; ``stop()`` closes every socket, and every
wait has a timeout. The sockets are opened by :mod:`.net`.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import random
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from ..util.errors import ConfigError, PeerError, ProtocolError
from .announce import (
    MAX_DATAGRAM,
    Announcement,
    AnnouncementDecoder,
    ClockSkew,
    PeerFilter,
    PeerInfo,
    PeerTable,
    encode_announcement,
    with_fields,
)
from .keys import LOOPBACK_HOST, GroupKey
from .net import Waker, udp_receivers, udp_sender

__all__ = [
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_PORT",
    "Announcer",
    "DiscoveryConfig",
    "Listener",
    "parse_peer",
]

log = logging.getLogger(__name__)

DEFAULT_MULTICAST_GROUP = "239.255.77.77"
DEFAULT_PORT = 17700
_POLL_S = 0.2
_MAX_REFUSED = 64  # sources of refused announcements remembered (for `peer list`, notes)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True)
class DiscoveryConfig:
    """Where and how often peers announce themselves.

    ``multicast_group`` None turns multicast off (then ``static_peers`` is the
    only way). ``interface`` is the local IPv4 address to send multicast from,
    join the group on, and bind unicast to; None lets the kernel choose (its
    default route). ``ttl`` bounds how many routers multicast crosses (1: the
    local network). Peers silent for ``expire_after_s`` are dropped.
    """

    port: int = DEFAULT_PORT
    multicast_group: str | None = DEFAULT_MULTICAST_GROUP
    interface: str | None = None
    static_peers: tuple[tuple[str, int], ...] = ()
    ttl: int = 1
    interval_s: float = 1.0
    jitter: float = 0.2
    expire_after_s: float = 3.5
    window_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise ConfigError(f"discovery port must be 1..65535, got {self.port!r}")
        if self.multicast_group is not None:
            try:
                group = ipaddress.IPv4Address(self.multicast_group)
            except ValueError:
                raise ConfigError(
                    f"multicast_group {self.multicast_group!r} is not an IPv4 address"
                )
            if not group.is_multicast:
                raise ConfigError(
                    f"multicast_group {self.multicast_group} is not a multicast address"
                )
        if self.interface is not None:
            try:
                ipaddress.IPv4Address(self.interface)
            except ValueError:
                raise ConfigError(f"interface must be a local IPv4 address, got {self.interface!r}")
        peers = []
        for entry in self.static_peers:
            try:
                host, port = entry
            except (TypeError, ValueError):
                raise ConfigError(f"a static peer is (host, port), got {entry!r}")
            if not isinstance(host, str) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ConfigError(f"static peer {entry!r}: need (host name, port 1..65535)")
            peers.append((host, port))
        object.__setattr__(self, "static_peers", tuple(peers))
        if not isinstance(self.ttl, int) or not 0 <= self.ttl <= 255:
            raise ConfigError(f"ttl must be 0..255, got {self.ttl!r}")
        if not self.interval_s > 0 or not 0 <= self.jitter < 1:
            raise ConfigError("interval_s must be > 0 and jitter in [0, 1)")
        if not self.expire_after_s > self.interval_s * (1 + self.jitter):
            raise ConfigError("expire_after_s must be longer than one announcement interval")
        if self.multicast_group is None and not self.static_peers:
            raise ConfigError("discovery needs a multicast group or a list of static peers")

    def for_key(self, key: GroupKey | None) -> DiscoveryConfig:
        """This configuration as it applies with ``key``: without one, loopback only."""
        if key is not None:
            return self
        if self.interface not in (None, LOOPBACK_HOST):
            raise ConfigError(
                f"without a group key peers talk on {LOOPBACK_HOST} only, not on {self.interface}"
                " (make a group key with `elsewhere peer keygen GROUP` and give it with --key or group=)"
            )
        peers = []
        for host, port in self.static_peers:
            if not _is_loopback(host):
                raise ConfigError(
                    f"without a group key, static peer {host} must be a loopback address"
                )
            peers.append((LOOPBACK_HOST if host == "localhost" else host, port))
        return replace(self, interface=LOOPBACK_HOST, ttl=0, static_peers=tuple(peers))


def _resolve(host: str, port: int) -> tuple[str, int] | None:
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:
        log.warning("static peer %s:%d cannot be resolved: %s", host, port, exc)
        return None
    if not infos:
        return None
    addr = infos[0][4]
    return (str(addr[0]), int(addr[1]))


class Announcer:
    """Sends ``announcement`` about every ``interval_s``, and at once on a change.

    Each datagram gets a fresh timestamp and counter. ``stop()`` sends a last
    LEAVING datagram (unless ``goodbye=False``) so listeners drop the peer at
    once instead of waiting for it to expire.
    """

    def __init__(
        self,
        announcement: Announcement,
        key: GroupKey | None,
        config: DiscoveryConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.key = key
        self.config = (config if config is not None else DiscoveryConfig()).for_key(key)
        group = key.group if key is not None else ""
        if announcement.group != group:
            raise ConfigError(
                f"announcement of group {announcement.group!r} with a key of {group!r}"
            )
        encode_announcement(announcement, key)  # too large? fail here, not in the thread
        self._announcement = announcement
        self._rng = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._destinations: list[tuple[str, int]] = []
        self._counter = 0
        self.sent = 0
        """Datagrams sent (to all destinations) so far."""

    @property
    def announcement(self) -> Announcement:
        """The announcement as it is now (without per-datagram timestamp/counter)."""
        with self._lock:
            return self._announcement

    def start(self) -> Announcer:
        """Open the socket and start the thread; returns self."""
        if self._thread is not None:
            raise PeerError("announcer already started")
        cfg = self.config
        self._sock = _sender_socket(cfg)
        dests: list[tuple[str, int]] = []
        if cfg.multicast_group is not None:
            dests.append((cfg.multicast_group, cfg.port))
        for host, port in cfg.static_peers:
            resolved = _resolve(host, port)
            if resolved is not None:
                dests.append(resolved)
        self._destinations = dests
        self._thread = threading.Thread(target=self._run, name="elsewhere-announcer", daemon=True)
        self._thread.start()
        return self

    def update_state(self, **changes: Any) -> Announcement:
        """Change fields of the announcement (state, slots_free, task, ...) and announce now."""
        with self._lock:
            updated = with_fields(self._announcement, changes)
            if (
                updated.peer_id != self._announcement.peer_id
                or updated.group != self._announcement.group
            ):
                raise ConfigError("peer_id and group of a running announcer cannot change")
            encode_announcement(updated, self.key)
            self._announcement = updated
        self._wake.set()
        return updated

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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        cfg = self.config
        while not self._stop.is_set():
            self._send()
            delay = cfg.interval_s * (1 + self._rng.uniform(-cfg.jitter, cfg.jitter))
            self._wake.wait(delay)
            self._wake.clear()

    def _send(self, *, leaving: bool = False) -> None:
        with self._lock:
            self._counter += 1
            ann = replace(self._announcement, timestamp=time.time(), counter=self._counter,
                          leaving=leaving)  # fmt: skip
            data = encode_announcement(ann, self.key)
            sock = self._sock
            if sock is None:
                return
            for dest in self._destinations:
                try:
                    sock.sendto(data, dest)
                except OSError as exc:  # network down, no route: try again next interval
                    log.debug("announcement to %s:%d failed: %s", dest[0], dest[1], exc)
            self.sent += 1


def _sender_socket(cfg: DiscoveryConfig) -> socket.socket:
    try:
        return udp_sender(cfg.ttl, cfg.interface)
    except OSError as exc:
        _not_here(exc, cfg, "announce")
        raise


def _not_here(exc: OSError, cfg: DiscoveryConfig, what: str) -> None:
    """Raise a ConfigError that names the cause when ``exc`` says ``cfg.interface`` is not
    an address of this machine (the usual reason a socket cannot be set up on it)."""
    if cfg.interface is not None and exc.errno in (errno.ENODEV, errno.EADDRNOTAVAIL):
        raise ConfigError(f"cannot {what} on interface {cfg.interface} ({exc.strerror}): it must be an "
                          "IPv4 address of this machine (`ip -4 addr` lists them)") from exc  # fmt: skip


def _receiver_sockets(cfg: DiscoveryConfig) -> list[socket.socket]:
    try:
        return udp_receivers(cfg.multicast_group, cfg.port, cfg.interface, bool(cfg.static_peers))
    except OSError as exc:
        _not_here(exc, cfg, "listen for peers")
        raise


class Listener:
    """Receives announcements and keeps a :class:`PeerTable` of the group's peers (of each
    group, with ``more_keys``: a worker that serves several)."""

    def __init__(
        self,
        key: GroupKey | None,
        config: DiscoveryConfig | None = None,
        *,
        peer_filter: PeerFilter | None = None,
        more_keys: Sequence[GroupKey] = (),
    ) -> None:
        if more_keys and key is None:
            raise PeerError("more_keys are for a keyed listener")
        self.config = (config if config is not None else DiscoveryConfig()).for_key(key)
        self.loopback_only = key is None
        # one decoder per group heard (a worker of several groups: one socket for them all,
        # so that a unicast datagram, which reaches one socket of a port, is never lost)
        self._decoders = [AnnouncementDecoder(k, window_s=self.config.window_s) for k in (key, *more_keys)]
        self._table = PeerTable(expire_after_s=self.config.expire_after_s, peer_filter=peer_filter)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._socks: list[socket.socket] = []
        self._waker: Waker | None = None  # stop() wakes the thread
        self.dropped = 0
        """Datagrams dropped: not authentic, stale, replayed, malformed, or not from loopback."""
        self._refused: dict[str, tuple[int, str, float, bool]] = {}  # source -> (count, why, when, authentic)
        self.received = 0
        """Datagrams accepted."""

    def start(self) -> Listener:
        """Bind the sockets and start the thread; returns self."""
        if self._thread is not None:
            raise PeerError("listener already started")
        self._socks = _receiver_sockets(self.config)
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="elsewhere-listener", daemon=True)
        self._thread.start()
        return self

    def peers(self) -> list[PeerInfo]:
        """The peers listed now."""
        with self._cond:
            return self._table.peers()

    def _note_refusal(self, source: str, why: ProtocolError | None) -> None:
        with self._cond:
            count = self._refused.get(source, (0, "", 0.0, False))[0]
            if count == 0 and len(self._refused) >= _MAX_REFUSED:  # bounded: sources can be forged
                del self._refused[min(self._refused, key=lambda s: self._refused[s][2])]
            self._refused[source] = (count + 1, str(why or "dropped"), time.monotonic(), isinstance(why, ClockSkew))

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
        """Stop the thread and close the sockets."""
        self._stop.set()
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            for s in self._socks:
                sel.register(s, selectors.EVENT_READ)
            assert self._waker is not None  # set by start()
            wake = self._waker.reader
            sel.register(wake, selectors.EVENT_READ)
            while not self._stop.is_set():
                for sk, _ in sel.select(timeout=_POLL_S):
                    if sk.fileobj is not wake:
                        self._drain(sk.fileobj)  # type: ignore[arg-type]
                with self._cond:
                    if self._table.expire(time.monotonic()):
                        self._cond.notify_all()

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
        if self.loopback_only and not _is_loopback(source[0]):
            self.dropped += 1
            return
        now = time.time()
        why: ProtocolError | None = None
        for decoder in self._decoders:
            try:
                ann = decoder.decode(data, now)
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
            self._note_refusal(source[0], why)
            return
        with self._cond:
            self.received += 1
            self._table.update(ann, source, time.monotonic())
            self._cond.notify_all()


def parse_peer(entry: str | tuple[str, int] | list[Any], default_port: int) -> tuple[str, int]:
    """``"host"``, ``"host:port"`` or ``(host, port)`` -> ``(host, port)``."""
    if isinstance(entry, (tuple, list)):
        if len(entry) != 2:
            raise ConfigError(f"a peer is 'host', 'host:port' or (host, port), not {entry!r}")
        return str(entry[0]), int(entry[1])
    if not isinstance(entry, str) or not entry:
        raise ConfigError(f"a peer is 'host', 'host:port' or (host, port), not {entry!r}")
    host, sep, port = entry.rpartition(":")
    if not sep:
        return entry, default_port
    try:
        return host, int(port)
    except ValueError:
        raise ConfigError(f"peer {entry!r}: the port must be a number")
