"""Who may use a worker: allow and refuse lists, and the same-user rule of loopback mode. Pure
except for :func:`loopback_peer_uid`, which reads ``/proc/net/tcp``.

Lists are checked against what the handshake authenticated (the peer's user
and host, as a member of the group claims them) and against the connection's
real source address (which no member can forge on a TCP connection that
completed its handshake). Refuse wins over allow; an empty allow list allows
everyone.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from ..util.errors import ConfigError

__all__ = ["AccessRules", "loopback_peer_uid", "same_user"]


def _resolve_all(name: str) -> frozenset[str]:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return frozenset()
    return frozenset(str(i[4][0]) for i in infos)


@dataclass(frozen=True)
class AccessRules:
    """Allow and refuse lists of a worker.

    ``*_hosts`` entries are IP addresses, networks (``10.1.2.0/24``) or host
    names; a name matches the peer's claimed host name or any address the
    name resolves to (resolved once, when the rules are made).
    """

    allow_users: tuple[str, ...] = ()
    refuse_users: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    refuse_hosts: tuple[str, ...] = ()
    _nets: dict[str, tuple[Any, ...]] = field(default_factory=dict, init=False, repr=False,
                                              compare=False)  # fmt: skip
    _names: dict[str, tuple[tuple[str, frozenset[str]], ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for name in ("allow_users", "refuse_users", "allow_hosts", "refuse_hosts"):
            value = tuple(getattr(self, name))
            if not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{name} must be names, got {value!r}")
            object.__setattr__(self, name, value)
        for name in ("allow_hosts", "refuse_hosts"):
            nets, names = [], []
            for entry in getattr(self, name):
                try:
                    nets.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    names.append((entry.lower(), _resolve_all(entry)))
            self._nets[name] = tuple(nets)
            self._names[name] = tuple(names)

    def _host_in(self, name: str, host: str, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            ip = None
        if ip is not None and any(ip in net for net in self._nets[name]):
            return True
        host = host.lower()
        short = host.split(".", 1)[0]
        return any(host == n or short == n or address in ips for n, ips in self._names[name])

    def check(self, user: str, host: str, address: str) -> str | None:
        """None if a peer (claimed ``user`` and ``host``, real ``address``) may use the
        worker, else why not."""
        if user in self.refuse_users:
            return f"user {user!r} is refused by this worker"
        if self.allow_users and user not in self.allow_users:
            return f"user {user!r} is not on this worker's allow list"
        if self._host_in("refuse_hosts", host, address):
            return f"host {host or address} is refused by this worker"
        if self.allow_hosts and not self._host_in("allow_hosts", host, address):
            return f"host {host or address} is not on this worker's allow list"
        return None


def _hex_addr(ip: str, port: int) -> str:
    packed = socket.inet_aton(ip)
    return f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"


def loopback_peer_uid(sock: socket.socket) -> int | None:
    """The uid owning the other end of a TCP connection on this machine, or None.

    Reads ``/proc/net/tcp``: the other end's socket is the entry whose local
    address is our remote address and whose remote address is our local one.
    """
    try:
        local = sock.getsockname()
        remote = sock.getpeername()
        mine, theirs = _hex_addr(local[0], local[1]), _hex_addr(remote[0], remote[1])
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                cols = line.split()
                if len(cols) > 7 and cols[1] == theirs and cols[2] == mine:
                    return int(cols[7])
    except (OSError, ValueError, StopIteration):
        return None
    return None


def same_user(sock: socket.socket) -> bool:
    """Whether the other end of ``sock`` (a loopback connection) runs as this process's user."""
    uid = loopback_peer_uid(sock)
    return uid is not None and uid == os.getuid()
