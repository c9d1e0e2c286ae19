"""Where and how often peers announce themselves (:class:`DiscoveryConfig`), how a peer is
written (:func:`parse_peer`), and the sockets a configuration opens (by :mod:`.net`, with an
error that names the cause when the interface is not this machine's). The threads that
announce and listen are in :mod:`.discovery`."""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import socket
from dataclasses import dataclass, replace
from typing import Any

from ..util.errors import ConfigError
from .keys import LOOPBACK_HOST, GroupKey
from .net import udp_receivers, udp_sender

__all__ = [
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_PORT",
    "DiscoveryConfig",
    "parse_peer",
    "receiver_sockets",
    "resolve_static_peer",
    "sender_socket",
]

log = logging.getLogger("elsewhere.peer.discovery")

DEFAULT_MULTICAST_GROUP = "239.255.77.77"
DEFAULT_PORT = 17700


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
    local network). Peers silent for ``expire_after_s`` are dropped (a peer that announces
    less often, in a large group, after as many of its own intervals). ``group_rate``: the
    datagrams a second that the whole group may send, periodic and prompted together (see
    :class:`~.announce.AnnounceTimer`); a group of up to ``interval_s * group_rate`` peers
    announces every ``interval_s``.
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
    group_rate: float = 200.0

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
        if not (self.group_rate > 0 and math.isfinite(self.group_rate)):
            raise ConfigError(
                f"group_rate must be > 0 (datagrams a second), got {self.group_rate!r}"
            )
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


def resolve_static_peer(host: str, port: int) -> tuple[str, int] | None:
    """The address ``host`` resolves to (IPv4), or None (logged)."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:
        log.warning("static peer %s:%d cannot be resolved: %s", host, port, exc)
        return None
    if not infos:
        return None
    addr = infos[0][4]
    return (str(addr[0]), int(addr[1]))


def sender_socket(cfg: DiscoveryConfig) -> socket.socket:
    """The socket announcements go out on, by ``cfg``."""
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


def receiver_sockets(cfg: DiscoveryConfig) -> list[socket.socket]:
    """The sockets announcements arrive on, by ``cfg``."""
    try:
        return udp_receivers(cfg.multicast_group, cfg.port, cfg.interface, bool(cfg.static_peers))
    except OSError as exc:
        _not_here(exc, cfg, "listen for peers")
        raise
