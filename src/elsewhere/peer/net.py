"""The peer network's sockets, and what a selector loop needs around them.

The protocol itself is sans-IO (:mod:`.wire`, :mod:`.announce`); the bytes
move through :class:`~.stream.ConnectionPump`. This module opens the real
sockets, one way for every user:

- TCP: the worker daemon's listening socket (:func:`listen_tcp`), a
  controller's connection to a worker (:func:`connect_tcp`,
  :func:`connect_error`), and both ends tuned alike (:func:`tune`: no Nagle,
  so a frame leaves at once); a connection dropped unheard (:func:`abort`);
- UDP: discovery's sender and receivers (:func:`udp_sender`,
  :func:`udp_receivers`), multicast or unicast to static peers;
- the selector loops of the controller and the daemon: a :class:`Waker` that
  another thread or a signal handler uses to wake the loop (discovery's
  listener thread uses one too), and :func:`watch_after_flush`, what the
  selector watches a socket for once queued frames were (or were not all) sent.

The two loops themselves stay with their owners: the controller's runs its
turns under a lock that a caller's thread may take to place a task itself, the
daemon's polls awake for a while after each frame; one loop for both would put
a call and a policy between every event and its handler.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import struct
from typing import Protocol

from .keys import LOOPBACK_HOST

__all__ = [
    "Waker",
    "Watched",
    "abort",
    "connect_error",
    "connect_tcp",
    "listen_tcp",
    "primary_address",
    "tune",
    "udp_receivers",
    "udp_sender",
    "watch_after_flush",
]

_READ = selectors.EVENT_READ
_READ_WRITE = selectors.EVENT_READ | selectors.EVENT_WRITE
_IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)  # Linux; absent from Python's table
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset
_BACKLOG = 1024  # connections the kernel completes before the daemon accepts them


# ---------------------------------------------------------------- selector loops


class Waker:
    """A socket pair that wakes a selector loop: :meth:`wake` from any thread (or a signal
    handler), :meth:`drain` in the loop when its read end is readable."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)

    def register(self, sel: selectors.BaseSelector) -> None:
        """Watch the read end in ``sel``; its key's data is ``("wake", None)``."""
        sel.register(self.reader, selectors.EVENT_READ, ("wake", None))

    def wake(self) -> None:
        """Make the loop's next select return (a full pipe wakes it already)."""
        with contextlib.suppress(OSError):
            self._writer.send(b"w")

    def drain(self) -> None:
        """Take the wake-ups sent so far."""
        with contextlib.suppress(OSError):
            self.reader.recv(65536)

    def close(self) -> None:
        """Close both ends."""
        for s in (self.reader, self._writer):
            with contextlib.suppress(OSError):
                s.close()


class Watched(Protocol):
    """What a selector watches a socket for now, kept by the socket's owner."""

    events: int


def watch_after_flush(sel: selectors.BaseSelector, sock: socket.socket, owner: Watched,
                      kind: str, done: bool) -> None:  # fmt: skip
    """After a flush: watch ``sock`` for reading only once all was sent (``done``), for
    writing too while frames wait. ``owner.events`` remembers what is watched (asking the
    selector costs more than the rare change); the key's data is ``(kind, owner)``."""
    events = _READ if done else _READ_WRITE
    if owner.events != events:
        with contextlib.suppress(KeyError, ValueError):
            sel.modify(sock, events, (kind, owner))
        owner.events = events


# ---------------------------------------------------------------- TCP


def tune(sock: socket.socket) -> None:
    """Make a connected TCP socket non-blocking, without Nagle's delay."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def abort(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (SO_LINGER 0): no TIME_WAIT or orphaned socket stays in
    the kernel, and what was not sent yet is dropped. For connections dropped before they
    proved anything, which may come by the thousand."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    with contextlib.suppress(OSError):
        sock.close()


def listen_tcp(address: tuple[str, int]) -> socket.socket:
    """A non-blocking socket listening on ``address`` (port 0: any free one); raises the
    OSError of ``bind`` (the caller says what it means)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.listen(_BACKLOG)
    sock.setblocking(False)
    return sock


def connect_tcp(address: tuple[str, int]) -> tuple[socket.socket | None, str]:
    """Start connecting to ``address`` without waiting: the socket (:func:`tune`\\ d), which
    is writable once the connection is made or failed (:func:`connect_error` says which),
    or None and why it failed at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tune(sock)
    err = sock.connect_ex(address)
    if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
        sock.close()
        return None, os.strerror(err)
    return sock, ""


def connect_error(sock: socket.socket) -> str:
    """Why the connection :func:`connect_tcp` started failed ("" if it was made)."""
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    return os.strerror(err) if err else ""


def primary_address() -> str:
    """The address of the interface of the default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed
            return str(s.getsockname()[0])
        except OSError:
            return LOOPBACK_HOST


# ---------------------------------------------------------------- UDP


def udp_sender(ttl: int, interface: str | None) -> socket.socket:
    """A socket to send announcements from: multicast with ``ttl`` (looped back to this
    machine too), from ``interface`` if given (unicast then leaves from it too)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        if interface is not None:
            sock.setsockopt(
                socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface)
            )
            sock.bind((interface, 0))  # unicast leaves from this address too
    except OSError:
        sock.close()
        raise
    return sock


def udp_receivers(group: str | None, port: int, interface: str | None, unicast: bool) -> list[socket.socket]:
    """Non-blocking sockets to hear announcements on ``port``: a member of the multicast
    ``group`` (on ``interface``, or the kernel's choice), and with ``unicast`` one for
    datagrams sent to this machine (static peers)."""
    socks: list[socket.socket] = []
    try:
        if group is not None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind((group, port))  # only this group's datagrams
            mreq = struct.pack(
                "4s4s",
                socket.inet_aton(group),
                socket.inet_aton(interface or "0.0.0.0"),
            )
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
        if unicast:
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
            socks.append(u)
            u.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with contextlib.suppress(OSError):  # else group datagrams arrive here twice
                u.setsockopt(socket.IPPROTO_IP, _IP_MULTICAST_ALL, 0)
            u.bind((interface or "0.0.0.0", port))
    except OSError:
        for s in socks:
            s.close()
        raise
    for s in socks:
        s.setblocking(False)
    return socks
