"""A sans-IO :class:`~.wire.Connection` on a real, non-blocking TCP socket.

Shared by the worker daemon and the controller, both single-threaded
selector loops::

    selector says readable  -> ConnectionPump.read()  -> [events]
    after handling events   -> ConnectionPump.flush() -> sendmsg(parts)   (want_write if not all sent)

Receiving: while the connection waits for a large part (a raw buffer of a
TASK or RESULT), bytes go straight into that buffer with ``recv_into``; small
parts are read 64 KiB at a time and fed in (an encrypted buffer is decrypted in
place as it arrives). Sending: frames are streamed with
:meth:`OutgoingFrame.iter_parts` (the body is encrypted, or its MAC computed,
slice by slice just before each slice is sent) and handed to ``sendmsg`` many
parts at a time: a NumPy array leaves from its own memory, or, encrypted, from
a few reused 1 MiB buffers its ciphertext is written into.

:class:`SharedBuffers` is an allocator for received raw buffers: large ones
live in anonymous shared memory (``memfd``), so the daemon can hand them to
its task-running child by file descriptor, without another copy.
"""

from __future__ import annotations

import collections
import mmap
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

from ..util.errors import PeerError, ProtocolError
from .frames import OutgoingFrame
from .wire import Buffer, Connection, ConnectionState, Event

__all__ = ["Closed", "ConnectionPump", "ReusableBuffers", "SharedBuffers", "check_open", "new_memfd"]

_SMALL_READ = 64 << 10
_HANDSHAKE_READ = 4 << 10  # a handshake frame is at most 32 + 2048 + 16 bytes
_MAX_PARTS = 256  # parts per sendmsg (IOV_MAX is 1024 on Linux)
_MAX_QUEUED = 1 << 20  # bytes of parts pulled from the frames before a sendmsg
# (a slice is sealed or MACed just before it is queued: 1 MiB ahead, it is still in cache when
# the kernel copies it; 8 MiB ahead made 100 MiB one way on loopback 8-17 % slower, encrypted
# or MACed, on a quiet machine; without a key the same)
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
        # a connection that has not proved the key yet gets a small read buffer: a worker
        # may hold dozens of those, most of them perhaps a stranger's
        ready = conn.state is ConnectionState.READY
        self._rbuf = bytearray(_SMALL_READ if ready else _HANDSHAKE_READ)
        self._rview = memoryview(self._rbuf)
        self.failed: PeerError | None = None
        """Why the connection ended, once it has; raise it after handling the events."""

    def take_frames(self) -> None:
        """Queue what the connection wants sent (call after every ``send``)."""
        frames, parts = self._frames, self._parts
        for frame in self.conn.data_to_send():
            if frame.small and not frames and len(parts) < _MAX_PARTS:
                # a small frame (its tag in one call): its parts at once, not slice by slice
                for view in frame.parts():
                    if len(view):
                        parts.append(view)
                        self._queued += len(view)
            else:
                frames.append(frame.iter_parts())

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
            batch = list(parts) if len(parts) <= _MAX_PARTS else [parts[i] for i in range(_MAX_PARTS)]
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
            del batch  # its views of sealed slices: the ring may reuse what was sent

    def read(self) -> list[Event]:
        """Read what the socket has now (up to a budget) and return the events.

        Raises :class:`Closed` at a clean end of stream, :class:`ProtocolError`
        for bad bytes or a stream cut inside a frame, :class:`OSError` for a reset.
        When good frames came before the bad bytes, their events are returned
        first and the error is kept in :attr:`failed` (the caller raises it).
        """
        conn = self.conn
        sock = self.sock
        events: list[Event] = []
        budget = _READ_BUDGET
        try:
            while budget > 0 and self.failed is None:
                if len(self._rbuf) < _SMALL_READ and conn.state is ConnectionState.READY:
                    self._rbuf = bytearray(_SMALL_READ)  # the handshake is done
                    self._rview = memoryview(self._rbuf)
                want = conn.next_size()
                try:
                    if want >= _SMALL_READ:
                        n = sock.recv_into(conn.receive_buffer())
                        if n:
                            events += conn.received(n)
                    else:
                        n = sock.recv_into(self._rbuf)
                        if n:
                            self._feed(n, events)
                except (BlockingIOError, InterruptedError):
                    return events
                if not n:
                    events += conn.receive_eof()  # raises if a frame was cut
                    self.failed = Closed("the peer closed the connection")
                    break
                self.bytes_received += n
                budget -= n
                if want < _SMALL_READ and n < len(self._rbuf):
                    break  # the socket is drained: no second call only to hear EAGAIN
        except ProtocolError as exc:
            self.failed = exc
        if self.failed is not None and not events:
            raise self.failed
        return events

    def _feed(self, n: int, events: list[Event]) -> None:
        """Feed ``n`` bytes of the read buffer part by part, so that the events of good
        frames are kept when a later frame in the same read is bad."""
        self.conn.feed(self._rview[:n], events)


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


class _Mem:
    """One memfd and a writable map of all of it."""

    __slots__ = ("capacity", "fd", "mm", "owner")

    def __init__(self, capacity: int) -> None:
        self.fd, self.mm = new_memfd(capacity)
        self.capacity = capacity
        self.owner: object = None

    def close(self) -> None:
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass  # views still exist: the map goes when they do
        try:
            os.close(self.fd)
        except OSError:
            pass


class SharedBuffers:
    """Large receive buffers in shared memory (memfd), reused while warm.

    :meth:`allocator` gives a connection its :data:`~.wire.Allocator`: small
    buffers are ``bytearray``; large ones are slices of pooled memfd maps, so
    the daemon can hand them to its child by file descriptor (no copy), and
    the next task of that size lands in memory whose pages are already there
    (on a virtual machine a fresh page costs microseconds: 100 MB of fresh
    pages cost more than moving the bytes).

    Every large buffer has an *owner* (the connection that received it, then
    the run that uses it) and goes back to the pool only by :meth:`free` or
    :meth:`reclaim`: the pool never reuses memory that something may still use.
    """

    def __init__(self, threshold: int = 1 << 20, keep_bytes: int = 1 << 30, keep: int = 8) -> None:
        self.threshold = threshold
        self.keep_bytes = keep_bytes
        self.keep = keep
        self._free: list[_Mem] = []
        self._used: dict[int, _Mem] = {}  # id(mm) -> mem

    def allocator(self, owner: object) -> Any:
        """An allocator for one connection; its large buffers belong to ``owner``."""

        def allocate(size: int) -> Buffer:
            if size < self.threshold:
                return bytearray(size)
            return self._take(size, owner)

        return allocate

    def _take(self, size: int, owner: object) -> memoryview:
        fits = [m for m in self._free if size <= m.capacity <= 2 * size]
        if fits:
            mem = min(fits, key=lambda m: m.capacity)
            self._free.remove(mem)
        else:
            mem = _Mem(-(-size // (1 << 20)) << 20)
        mem.owner = owner
        self._used[id(mem.mm)] = mem
        return memoryview(mem.mm)[:size]

    def _mem(self, buffer: Any) -> _Mem | None:
        obj = buffer.obj if isinstance(buffer, memoryview) else buffer
        return self._used.get(id(obj)) if isinstance(obj, mmap.mmap) else None

    def fd_of(self, buffer: Any) -> int:
        """The memfd behind a large buffer of this pool, or -1 for an ordinary buffer."""
        mem = self._mem(buffer)
        return mem.fd if mem is not None else -1

    def claim(self, buffer: Any, owner: object) -> None:
        """Give a large buffer a new owner (a connection hands it to a run)."""
        mem = self._mem(buffer)
        if mem is not None:
            mem.owner = owner

    def free(self, buffer: Any) -> None:
        """Nothing uses this buffer any more (nor its memfd in another process): reuse it."""
        mem = self._mem(buffer)
        if mem is not None:
            self._release(mem)

    def discard(self, buffer: Any) -> None:
        """Never reuse this buffer (another process keeps a map of it); close our side."""
        mem = self._mem(buffer)
        if mem is not None:
            self._used.pop(id(mem.mm), None)
            mem.close()

    def reclaim(self, owner: object) -> int:
        """Free every large buffer ``owner`` still has; returns how many."""
        mine = [m for m in self._used.values() if m.owner is owner]
        for mem in mine:
            self._release(mem)
        return len(mine)

    def _release(self, mem: _Mem) -> None:
        self._used.pop(id(mem.mm), None)
        mem.owner = None
        kept = sum(m.capacity for m in self._free)
        if len(self._free) < self.keep and kept + mem.capacity <= self.keep_bytes:
            self._free.append(mem)
        else:
            mem.close()

    def close(self) -> None:
        """Close the pooled memory (buffers in use are left to their owners)."""
        for mem in self._free:
            mem.close()
        self._free.clear()


class ReusableBuffers:
    """An :data:`~.wire.Allocator` of large ``bytearray`` buffers, reused once freed
    (a controller frees a RESULT's buffers once it has written them to the job folder).

    A freed buffer may still back a value handed out (an Executor's future holds the
    NumPy array unpickled from it without a copy): it is reused only once nothing
    but this pool refers to it (its reference count says so), so a value is never
    overwritten under its holder. Not thread-safe: one thread allocates and frees.
    """

    def __init__(self, threshold: int = 1 << 20, keep_bytes: int = 512 << 20, keep: int = 8) -> None:
        self.threshold = threshold
        self.keep_bytes = keep_bytes
        self.keep = keep
        self._free: list[bytearray] = []
        probe = [bytearray(1)]
        self._base = max(_refs(b) for b in probe)  # references of a buffer only the pool holds

    def __call__(self, size: int) -> Buffer:
        if size < self.threshold:
            return bytearray(size)
        best = None
        for b in self._free:
            if size <= len(b) <= 2 * size and _refs(b) <= self._base and (best is None or len(b) < len(best)):
                best = b
        if best is not None:
            self._free.remove(best)
            return memoryview(best)[:size]
        return memoryview(bytearray(-(-size // (1 << 20)) << 20))[:size]

    def free(self, buffer: Any) -> None:
        """The caller is done with ``buffer`` (from this allocator): keep it for a later
        one, to be reused once nothing else holds it."""
        obj = buffer.obj if isinstance(buffer, memoryview) else None
        if not isinstance(obj, bytearray) or len(obj) < self.threshold:
            return
        if any(b is obj for b in self._free):
            return
        if len(self._free) >= self.keep or sum(map(len, self._free)) + len(obj) > self.keep_bytes:
            self._free = [b for b in self._free if _refs(b) <= self._base]  # make room: drop held ones
        if len(self._free) < self.keep and sum(map(len, self._free)) + len(obj) <= self.keep_bytes:
            self._free.append(obj)


def _refs(obj: object) -> int:
    return sys.getrefcount(obj)


def check_open(sock: socket.socket) -> None:
    """Raise :class:`ProtocolError` if ``sock`` has a pending error (after a non-blocking connect)."""
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise ProtocolError(os.strerror(err))
