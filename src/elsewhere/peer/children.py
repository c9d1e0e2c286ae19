"""The daemon's side of its task-running children: start, talk to, watch, replace.

A :class:`ChildProcess` is one ``python -m elsewhere.peer.child`` process as
the worker daemon sees it: its Unix socket (with an outbox for non-blocking
sends, file descriptors included), the shared map where the child says which
task it runs, the memfd its output goes to, and the maps of its warm result
memfds. The message format is in ``childmsg.py``. What the daemon runs on a
child (a ``runs.Run``) is its business: a child holds it, typed by the daemon.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import selectors
import signal
import socket
import subprocess
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from ..folder.store import CUR
from ..hosts.spawn import spawn_python
from ..util.signals import ended
from .childmsg import MessageReader, pack_message
from .stream import new_memfd

__all__ = ["ChildProcess", "describe_exit", "read_capture", "tree_rss"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_R = TypeVar("_R")


class ChildProcess(Generic[_R]):
    """A task-running child process, as the daemon sees it; ``run`` is the batch (of type
    ``_R``) the daemon runs on it now, if any."""

    def __init__(self: ChildProcess[Any], python: str, capture_fd: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cur_fd, self.cur = new_memfd(CUR.size, "elsewhere-cur")
        CUR.pack_into(self.cur, 0, -1, 0.0, 0)
        self.capture_fd = capture_fd
        try:
            self.popen = spawn_python(["-m", "elsewhere.peer.child", str(theirs.fileno()), str(cur_fd)],
                                      python=python, log=capture_fd, cwd="/", pass_fds=(theirs.fileno(), cur_fd))
        finally:
            theirs.close()
            os.close(cur_fd)
        ours.setblocking(False)
        self.sock = ours
        self.reader = MessageReader(ours)
        self.out: collections.deque[tuple[collections.deque[memoryview], list[int]]] = (
            collections.deque()
        )
        self.pid = self.popen.pid
        self.ready = False
        self.base_rss = 0
        self.run: _R | None = None
        self.fns: dict[str, None] = {}  # function parts the child holds, oldest first
        self.job_id: str | None = None
        self.dirty = False  # it imported user modules: see PeerWorker._may_run
        self.context: tuple[Any, ...] | None = None  # of the job it imported them for
        self.user_files: list[tuple[str, int, int]] = []  # (file, mtime_ns, size) of those modules
        self.retiring = False
        self.dead = False
        self.maps: dict[int, mmap.mmap] = {}
        self.events = selectors.EVENT_READ  # what the daemon's selector watches for now

    def send(self, header: dict[str, Any], body: list[Any], fds: list[int]) -> None:
        parts = pack_message(header, body, len(fds))
        self.out.append((collections.deque(memoryview(p).cast("B") for p in parts if len(p)), fds))

    def flush(self) -> bool:
        """Send what the socket takes; True when all is sent."""
        import array

        while self.out:
            parts, fds = self.out[0]
            if not parts:
                self.out.popleft()
                continue
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            try:
                n = self.sock.sendmsg(list(parts)[:256], anc)
            except (BlockingIOError, InterruptedError):
                return False
            if fds:
                self.out[0] = (parts, [])
            while n:
                if n >= len(parts[0]):
                    n -= len(parts[0])
                    parts.popleft()
                else:
                    parts[0] = parts[0][n:]
                    n = 0
        return True

    def lease_map(self, lid: int, capacity: int, fd: int) -> mmap.mmap:
        """The daemon's (read-only, populated) map of the child's result memfd ``lid``:
        kept while the child reuses that memfd, so its pages are mapped only once."""
        cached = self.maps.get(lid)
        if cached is not None and len(cached) == capacity:
            return cached
        mm = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
        self.maps[lid] = mm
        while len(self.maps) > 8:  # the child keeps a few; older ones it has closed
            self.maps.pop(next(iter(self.maps)))
        return mm

    def current(self) -> tuple[int, float, int]:
        """(task running now or -1, since, its output offset), from the shared map."""
        idx, since, off = CUR.unpack_from(self.cur, 0)
        return int(idx), float(since), int(off)

    def kill(self) -> None:
        if self.dead:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def reap(self) -> int | None:
        self.dead = True
        try:
            return self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        self.reader.close_pending_fds()
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(BufferError, ValueError):
            self.cur.close()


def describe_exit(code: int | None) -> str:
    """How a task process ended, after "its process": "was killed by SIGSEGV (signal 11: a
    crash)", "exited with code 3" (see :mod:`elsewhere.util.signals`)."""
    return "did not exit" if code is None else ended(code)


def read_capture(fd: int, offset: int, cap: int = 64 << 10) -> bytes:
    """What a crashed task printed (its last ``cap`` bytes), from the child's output memfd."""
    try:
        end = os.fstat(fd).st_size
        start = max(offset, end - cap)
        return os.pread(fd, end - start, start) if end > start else b""
    except OSError:
        return b""


def tree_rss(pids: Iterable[int]) -> dict[int, int]:
    """The resident memory, in bytes, of each of ``pids`` with all its descendants, from one
    pass over ``/proc`` for all of them (a pass per process, as a process tree library makes
    it, costs a millisecond or more on a desktop, every quarter of a second per task)."""
    page = os.sysconf("SC_PAGE_SIZE")
    kids: dict[int, list[int]] = collections.defaultdict(list)
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2 :].split()
            pid = int(name)
            kids[int(fields[1])].append(pid)
            rss[pid] = int(fields[21]) * page
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    out = {}
    for root in pids:
        total, stack, seen = 0, [root], set()
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                total += rss.get(p, 0)
                stack.extend(kids.get(p, ()))
        out[root] = total
    return out
