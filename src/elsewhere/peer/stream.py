"""A sans-IO :class:`~.wire.Connection` on a real, non-blocking TCP socket.

Shared by the worker daemon and the controller, both single-threaded
selector loops::

    selector says readable  -> ConnectionPump.read()  -> [events]
    after handling events   -> ConnectionPump.flush() -> sendmsg(parts)   (want_write if not all sent)

Receiving: while the connection waits for a large part (a raw buffer of a
TASK or RESULT), bytes go straight into that buffer with ``recv_into``; small
parts are read 64 KiB at a time and fed in. Sending: frames are streamed with
:meth:`OutgoingFrame.iter_parts` (the body MAC is computed slice by slice just
before each slice is sent) and handed to ``sendmsg`` many parts at a time,
so a NumPy array leaves from its own memory.

:class:`SharedBuffers` is an allocator for received raw buffers: large ones
live in anonymous shared memory (``memfd``), so the daemon can hand them to
its task-running child by file descriptor, without another copy.
"""

from __future__ import annotations

import collections
import mmap
import os
import socket
import weakref
from collections.abc import Iterator
from typing import Any

from ..errors import PeerError, ProtocolError
from .wire import Buffer, Connection, Event, OutgoingFrame

__all__ = ["Closed", "ConnectionPump", "SharedBuffers", "check_open", "new_memfd"]

_SMALL_READ = 64 << 10
_MAX_PARTS = 256  # parts per sendmsg (IOV_MAX is 1024 on Linux)
_MAX_QUEUED = 8 << 20  # bytes of parts pulled from the frames before a sendmsg
_READ_BUDGET = 32 << 20  # bytes read per read() call, so one peer cannot starve the others


class Closed(PeerError):
    """The other end closed the connection (cleanly, between frames)."""


class ConnectionPump:
    """Moves bytes between a non-blocking socket and a :class:`Connection`."""

    def __init__(self, sock: socket.socket, conn: Connection) -> None:
        self.sock = sock
        self.conn = conn
        self.bytes_sent = 0
        self.bytes_received = 0
        self._frames: collections.deque[Iterator[memoryview]] = collections.deque()
        self._parts: collections.deque[memoryview] = collections.deque()
        self._queued = 0
        self._rbuf = bytearray(_SMALL_READ)
        self._rview = memoryview(self._rbuf)

    def take_frames(self) -> None:
        """Queue what the connection wants sent (call after every ``send``)."""
        for frame in self.conn.data_to_send():
            self._frames.append(frame.iter_parts())

    def queue(self, frame: OutgoingFrame) -> None:
        """Queue one frame (already taken from the connection)."""
        self._frames.append(frame.iter_parts())

    @property
    def want_write(self) -> bool:
        """True while queued bytes wait for the socket."""
        return bool(self._parts or self._frames)

    def flush(self) -> bool:
        """Send what the socket takes now; True when nothing is left queued.

        Raises :class:`OSError` (reset, broken pipe) when the peer is gone.
        """
        self.take_frames()
        parts = self._parts
        frames = self._frames
        sock = self.sock
        while True:
            while frames and len(parts) < _MAX_PARTS and self._queued < _MAX_QUEUED:
                try:
                    view = next(frames[0])
                except StopIteration:
                    frames.popleft()
                    continue
                if len(view):
                    parts.append(view)
                    self._queued += len(view)
            if not parts:
                return True
            batch = [parts[i] for i in range(min(len(parts), _MAX_PARTS))]
            try:
                sent = sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return False
            self.bytes_sent += sent
            self._queued -= sent
            while sent:
                first = parts[0]
                if sent >= len(first):
                    sent -= len(first)
                    parts.popleft()
                else:
                    parts[0] = first[sent:]
                    sent = 0

    def read(self) -> list[Event]:
        """Read what the socket has now (up to a budget) and return the events.

        Raises :class:`Closed` at a clean end of stream, :class:`ProtocolError`
        for bad bytes or a stream cut inside a frame, :class:`OSError` for a reset.
        """
        conn = self.conn
        sock = self.sock
        events: list[Event] = []
        budget = _READ_BUDGET
        while budget > 0:
            want = conn.next_size()
            try:
                if want >= _SMALL_READ:
                    n = sock.recv_into(conn.receive_buffer())
                    if n:
                        events += conn.received(n)
                else:
                    n = sock.recv_into(self._rbuf)
                    if n:
                        events += conn.feed(self._rview[:n])
            except (BlockingIOError, InterruptedError):
                return events
            if not n:
                events += conn.receive_eof()  # raises if a frame was cut
                if events:
                    return events
                raise Closed("the peer closed the connection")
            self.bytes_received += n
            budget -= n
        return events


# ---------------------------------------------------------------- shared memory


def new_memfd(size: int, name: str = "elsewhere-peer") -> tuple[int, mmap.mmap]:
    """A new anonymous shared-memory file of ``size`` bytes, and a writable map of it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        if size:
            os.ftruncate(fd, size)
        mm = mmap.mmap(fd, max(size, 1))
    except OSError:
        os.close(fd)
        raise
    return fd, mm


class _MappedMemfd:
    """Keeps a memfd open exactly as long as its map lives."""

    __slots__ = ("__weakref__", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class SharedBuffers:
    """A :data:`~.wire.Allocator`: small buffers are ``bytearray``; large ones memfd maps.

    :meth:`fd_of` returns the file descriptor behind a large buffer, so the
    daemon can pass it to the child; the descriptor closes when the buffer is
    garbage collected.
    """

    def __init__(self, threshold: int = 1 << 20) -> None:
        self.threshold = threshold
        self._holders: weakref.WeakValueDictionary[int, _MappedMemfd] = (
            weakref.WeakValueDictionary()
        )

    def __call__(self, size: int) -> Buffer:
        if size < self.threshold:
            return bytearray(size)
        fd, mm = new_memfd(size)
        holder = _MappedMemfd(fd)
        weakref.finalize(mm, holder.close)  # the finalizer keeps the holder alive
        self._holders[id(mm)] = holder
        return memoryview(mm)[:size]

    def fd_of(self, buffer: Any) -> int:
        """The memfd behind a buffer this allocator made, or -1 for an ordinary one."""
        obj = buffer.obj if isinstance(buffer, memoryview) else buffer
        if not isinstance(obj, mmap.mmap):
            return -1
        holder = self._holders.get(id(obj))
        return holder.fd if holder is not None else -1


def check_open(sock: socket.socket) -> None:
    """Raise :class:`ProtocolError` if ``sock`` has a pending error (after a non-blocking connect)."""
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise ProtocolError(os.strerror(err))
