"""The messages between a peer worker daemon and its task processes (``child.py``).

On the Unix socket, a message is a 16-byte head ``<IIQ`` (number of file descriptors, msgpack
header length, body length), the msgpack header, the body. File descriptors (``SCM_RIGHTS``)
travel with the first bytes of their message; a reader keeps them in order and hands each
message the number it declares. A *part* list ``[[length, where], ...]`` says how to cut the
body: ``where`` 0 means the next ``length`` bytes of the body, 1 means the next file
descriptor (a memfd of that length, for large buffers: no copy). In a result,
``[length, 2, position, offset]`` is a slice of the batch's own input buffer ``position`` (a
value that is its argument, or a view of it: the daemon keeps that buffer and sends the result
from it, nothing is copied), and ``[length, 1, id, capacity]`` one of the task process's warm
memfds, which the daemon gives back with a "release".

    op         from    header
    "ready"    child   pid, rss: started
    "run"      daemon  batch, job, diary, items [[index, attempt], ...], fn, jpart, ntask, nfn,
                       parts, forget, group_bytes, poll: run a batch (see ``runs.py``)
    "results"  child   batch, items, group, last (and, with the last: dirty, user_files,
                       released, polls): outcomes of the batch's tasks (``childresults.py``)
    "release"  daemon  ids: result memfds the daemon is done with
    "exit"     daemon  -
"""

from __future__ import annotations

import array
import collections
import enum
import mmap
import os
import socket
import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack

if TYPE_CHECKING:
    from ..util.system import CoreWatch

__all__ = [
    "GROUP_BYTES",
    "HEAD",
    "MAX_FDS",
    "OOB_MEMFD_BYTES",
    "MessageReader",
    "Outcome",
    "cut_parts",
    "pack_message",
    "send_message",
]

HEAD = struct.Struct("<IIQ")
OOB_MEMFD_BYTES = 1 << 20
"""Out-of-band buffers at least this large cross to the other process as a memfd."""
MAX_FDS = 253  # SCM_MAX_FD
GROUP_BYTES = 64 << 20
"""The largest group of values a task process sends together (unless the daemon says less:
``group_bytes``)."""
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class Outcome(enum.IntEnum):
    """What happened to one task of a batch. The numbers are part of the RESULT format.

    A task process reports OK or ERROR (the ``ok`` of its runner's outcome); the daemon
    LOST, REQUEUE or KILLED for a task that did not report.
    """

    OK = 0
    ERROR = 1
    """It raised: the value is its error record (``folder/errorrecord.py``)."""
    LOST = 2
    """Its process died under it (crash, out of memory): retried while the budget lasts."""
    REQUEUE = 3
    """Not run (its batch was handed back): run it elsewhere; no value."""
    KILLED = 4
    """Killed for exceeding the time or memory it was admitted under: an error."""


def pack_message(header: dict[str, Any], body: Sequence[bytes | bytearray | memoryview],
                 nfds: int = 0) -> list[Any]:  # fmt: skip
    """The parts of one message, ready for ``sendmsg``."""
    head = msgpack.packb(header, use_bin_type=True)
    size = sum(len(b) for b in body)
    return [HEAD.pack(nfds, len(head), size), head, *body]


def send_message(sock: socket.socket, header: dict[str, Any],
                 body: Sequence[bytes | bytearray | memoryview] = (),
                 fds: Sequence[int] = ()) -> None:  # fmt: skip
    """Send one message on a blocking socket (the child's side)."""
    if len(fds) > MAX_FDS:
        raise ValueError(f"at most {MAX_FDS} file descriptors per message")
    parts = [memoryview(p).cast("B") for p in pack_message(header, body, len(fds)) if len(p)]
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    while parts:
        n = sock.sendmsg(parts[:512], anc)
        anc = []
        while n:
            if n >= len(parts[0]):
                n -= len(parts[0])
                parts.pop(0)
            else:
                parts[0] = parts[0][n:]
                n = 0


class MessageReader:
    """Reassembles messages (and their file descriptors) from a stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._anc = socket.CMSG_SPACE(MAX_FDS * 4)
        # received into, and reused: recvmsg(256 KiB) allocates that much at every call
        # (about 10 us here, even for a call that finds nothing to read)
        self._rbuf = bytearray(1 << 18)
        self._rview = memoryview(self._rbuf)
        self._eof = False  # the end of the stream was read (while polling)
        self.polls = 0  # reads that found nothing while polling
        self.cores: CoreWatch | None = None  # polls only while a core is free (None: always)

    def _recv(self, size: int, flags: int = 0) -> int:
        """Read up to ``size`` bytes; how many (0 at the end of the stream)."""
        if self._eof:
            return 0
        n, anc, _flags, _addr = self.sock.recvmsg_into([self._rview[:size]], self._anc, flags)
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self._fds.extend(fds)
        if n:
            self._buf += self._rview[:n]
        return n

    def _pop(self) -> tuple[dict[str, Any], memoryview, list[int]] | None:
        buf = self._buf
        if len(buf) < HEAD.size:
            return None
        nfds, hlen, blen = HEAD.unpack_from(buf)
        end = HEAD.size + hlen + blen
        if len(buf) < end or len(self._fds) < nfds:
            return None
        header = msgpack.unpackb(bytes(buf[HEAD.size : HEAD.size + hlen]), raw=False)
        body = memoryview(bytes(buf[HEAD.size + hlen : end]))
        del buf[:end]
        fds = [self._fds.popleft() for _ in range(nfds)]
        return header, body, fds

    def read_available(self) -> tuple[list[tuple[dict[str, Any], memoryview, list[int]]], bool]:
        """Non-blocking (whatever the socket's mode): the whole messages readable now, and
        whether the stream is still open."""
        out = []
        open_ = True
        while True:
            try:
                n = self._recv(1 << 18, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                open_ = False
                break
            if not n:
                open_ = False
                break
            if n < 1 << 18:
                break  # drained: no second call only to hear EAGAIN
        while (msg := self._pop()) is not None:
            out.append(msg)
        return out, open_

    def read_one(self, poll_until: float = 0.0) -> tuple[dict[str, Any], memoryview, list[int]] | None:
        """Blocking: the next message, or None at the end of the stream. Until the
        ``time.monotonic()`` instant ``poll_until`` it polls, awake, yielding the core to
        any process that wants it, rather than sleeping (see ``WorkerOptions.poll_s``)."""
        while True:
            msg = self._pop()
            if msg is not None:
                return msg
            if self._eof:
                return None
            if time.monotonic() < poll_until and self._poll(poll_until):
                continue
            if not self._recv(1 << 18):
                return None

    def _poll(self, until: float) -> bool:
        """Read what comes before ``until`` without sleeping: True if something (or the
        end of the stream) came, False if nothing did (or every core is wanted: see
        :class:`~elsewhere.util.system.CoreWatch`)."""
        cores = self.cores
        while True:
            try:
                n = self._recv(1 << 18, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                self.polls += 1
                now = time.monotonic()
                if now >= until or (cores is not None and not cores.may_spin(now)):
                    return False
                os.sched_yield()
                continue
            if not n:
                self._eof = True
            return True

    def close_pending_fds(self) -> None:
        """Close descriptors received but not handed out (the stream ended mid-message)."""
        while self._fds:
            try:
                os.close(self._fds.popleft())
            except OSError:
                pass


def cut_parts(parts: Sequence[Sequence[int]], body: memoryview, fds: Sequence[int], *,
              writable: bool = True, maps: list[tuple[int, Any, mmap.mmap]] | None = None,
              cache: dict[Any, mmap.mmap] | None = None) -> list[memoryview]:  # fmt: skip
    """The buffers a part list describes: slices of ``body`` and maps of ``fds`` (closed here).

    Maps are shared and populated at once (one system call instead of a page
    fault per page), and kept in ``cache`` by file identity: the daemon reuses
    its memfds, so the next task of that size finds its map ready. ``maps``
    collects ``(position, key, map)`` so that the caller can say which it
    released when done.
    """
    out: list[memoryview] = []
    pos = 0
    fd_iter = iter(fds)
    for i, part in enumerate(parts):
        length, where = int(part[0]), int(part[1])
        if where == 0:
            out.append(body[pos : pos + length])
            pos += length
        else:
            fd = next(fd_iter)
            try:
                if length == 0:
                    out.append(memoryview(b""))
                    continue
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                mm = cache.get(key) if cache is not None else None
                if mm is None or len(mm) != max(st.st_size, length):
                    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
                    mm = mmap.mmap(fd, max(st.st_size, length), flags=mmap.MAP_SHARED | _POPULATE,
                                   prot=prot)  # fmt: skip
                    if cache is not None:
                        cache[key] = mm
                out.append(memoryview(mm)[:length])
                if maps is not None:
                    maps.append((i, key, mm))
            finally:
                os.close(fd)
    return out

