"""The task-running child of a peer worker daemon, and how the two talk.

The daemon never unpickles anything: it hands the authenticated bytes of a
TASK to a child process and gets pickled results back. A child is started
once (``python -m elsewhere.peer.child SOCK_FD CUR_FD``) and runs batch after
batch, so a task does not pay for a fresh interpreter. When a task crashes it,
or the daemon kills it for running past the time or memory it was admitted
under, only the child dies; the daemon starts another::

    daemon                                    child
    ------                                    -----
    "run" {job, items, parts}  + memfds  -->  unpickle (fn, job_data) and the batch
                                              per task: cwd, sys.path, env, seeds,
                                              ew.task(); run; pickle the value
                                      <--     "results" {items, parts} + memfds
                                              (every 10 ms and at the end of a batch)
    reads CUR (shared map) after a crash:     CUR = (task now running, since, log offset)
    which task was running

Messages on the Unix socket: a 16-byte head ``<IIQ`` (number of file
descriptors, msgpack header length, body length), the msgpack header, the
body. File descriptors (``SCM_RIGHTS``) travel with the first bytes of their
message; a reader keeps them in order and hands each message the number it
declares. A *part* list ``[[length, where], ...]`` says how to cut the body:
``where`` 0 means the next ``length`` bytes of the body, 1 means the next
file descriptor (a memfd of that length, for large buffers: no copy). In a
result, ``[length, 2, position, offset]`` is a slice of the batch's own input
buffer ``position`` (a value that is its argument, or a view of it: the
daemon keeps that buffer and sends the result from it, nothing is copied).

The child's stdout and stderr (file descriptors 1 and 2) are a memfd the
daemon also holds: each task's output is the bytes written while it ran,
which the daemon can still read after a crash (a faulthandler traceback).
"""

from __future__ import annotations

import array
import collections
import contextlib
import enum
import mmap
import os
import pickle
import resource
import socket
import struct
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import msgpack

__all__ = [
    "CUR",
    "HEAD",
    "LOG_CAP",
    "OOB_MEMFD_BYTES",
    "MessageReader",
    "Outcome",
    "cut_parts",
    "main",
    "pack_message",
    "send_message",
]

HEAD = struct.Struct("<IIQ")
CUR = struct.Struct("<qdq")  # task now running (-1: none), since (unix time), log offset
OOB_MEMFD_BYTES = 1 << 20
"""Out-of-band buffers at least this large cross to the other process as a memfd."""
LOG_CAP = 4 << 20
"""Most output kept per task (the end of it is kept)."""
_MAX_FDS = 253  # SCM_MAX_FD
_FLUSH_S = 0.01
_MAX_RESULT_OOB = 1000  # RESULT frames carry at most 1024 buffers: 2 + these
GROUP_BYTES = 64 << 20
"""The largest group of values sent together (unless the daemon says less: ``group_bytes``)."""
_RESET_LOG_AT = 16 << 20
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_KEEP_OUT = 4  # warm result memfds a child keeps for the next large result
_KEEP_IN = 8  # maps of the daemon's input memfds a child keeps


class Outcome(enum.IntEnum):
    """What happened to one task of a batch. The numbers are part of the RESULT format."""

    OK = 0
    ERROR = 1
    """It raised: the value is the error description (``jobrun._describe_error``)."""
    LOST = 2
    """Its process died under it (crash, out of memory): retried while the budget lasts."""
    REQUEUE = 3
    """Not run (its batch was handed back): run it elsewhere; no value."""
    KILLED = 4
    """Killed for exceeding the time or memory it was admitted under: an error."""


# ---------------------------------------------------------------- messages


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
    if len(fds) > _MAX_FDS:
        raise ValueError(f"at most {_MAX_FDS} file descriptors per message")
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
        self._anc = socket.CMSG_SPACE(_MAX_FDS * 4)
        # received into, and reused: recvmsg(256 KiB) allocates that much at every call
        # (about 10 us here, even for a call that finds nothing to read)
        self._rbuf = bytearray(1 << 18)
        self._rview = memoryview(self._rbuf)
        self._eof = False  # the end of the stream was read (while polling)
        self.polls = 0  # reads that found nothing while polling

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
        """Non-blocking: the whole messages readable now, and whether the stream is still open."""
        out = []
        open_ = True
        while True:
            try:
                n = self._recv(1 << 18)
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
        end of the stream) came, False if nothing did."""
        while True:
            try:
                n = self._recv(1 << 18, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                self.polls += 1
                if time.monotonic() >= until:
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


# ---------------------------------------------------------------- the child


def _is_system_path(path: str) -> bool:
    """Paths that belong to an interpreter installation, not to the user's code."""
    return any(s in path for s in ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python3")) or path.endswith(".zip")


class _Child:
    """The state of one child process: its job context and its caches."""

    def __init__(self, sock: socket.socket, cur: mmap.mmap) -> None:
        self.sock = sock
        self.cur = cur
        self.reader = MessageReader(sock)
        self.host = socket.gethostname()
        self.base_path = list(sys.path)
        self.base_modules = set(sys.modules)
        self._n_modules = len(sys.modules)
        self._dirty = False
        self.new_files: list[list[Any]] = []  # user modules' [file, mtime_ns, size] not yet reported
        self.job_id: str | None = None
        self.saved_env: dict[str, str | None] = {}
        self.common: dict[str, tuple[Any, Any]] = {}  # digest -> (fn, job_data) or (job_data, files)
        self.attached: set[tuple[str, str]] = set()  # (folder, digest) of files unpacked
        from ..folder import serial
        from ..run import context
        from ..run.jobrun import _describe_error, flush_output
        from ..run.seeding import TaskSeeder
        from ..run.threads import ThreadLimits

        self.seeder = TaskSeeder()  # the same seeds, and costs, as on every other backend
        self.threads = ThreadLimits()  # BLAS and OpenMP threads: the job's cores per task
        # looked up once: an import statement in the per-task path costs a few microseconds
        self.context = context
        self.serial = serial
        self.describe_error = _describe_error
        self.flush_output = flush_output
        self.warned = False
        self.out_pool: dict[int, _Lease] = {}
        self.in_maps: dict[Any, mmap.mmap] = {}  # (device, inode) of the daemon's memfds -> map
        self._lease_id = 0
        self._show = warnings.showwarning
        warnings.showwarning = self._showwarning

    def _showwarning(self, *args: Any, **kwargs: Any) -> None:
        self.warned = True
        self._show(*args, **kwargs)

    # -- the job's surroundings ------------------------------------------
    def enter_job(self, job: dict[str, Any]) -> None:
        if job.get("id") == self.job_id:
            return
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        env = job.get("env") or {}
        self.threads.enter(job.get("cores", 1), env)
        self.saved_env = {k: os.environ.get(k) for k in env}
        for k, v in env.items():
            os.environ[str(k)] = str(v)
        cwd = job.get("cwd")
        if not (isinstance(cwd, str) and os.path.isdir(cwd)):
            cwd = self.scratch(str(job.get("id", "job")))
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir(self.scratch(str(job.get("id", "job"))))
        front = [p for p in job.get("sys_path") or []
                 if isinstance(p, str) and p and not _is_system_path(p) and os.path.isdir(p)]  # fmt: skip
        seen: set[str] = set()
        sys.path[:] = [p for p in [*front, *self.base_path] if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]
        self.job_id = job.get("id")

    def attach_files(self, job: dict[str, Any], files: tuple[str, Any]) -> None:
        """The job's ``files=`` (digest, tar stream): unpacked into its scratch folder once,
        which goes in front of ``sys.path`` (see attached.py)."""
        dest = self.scratch(str(job.get("id", "job")))
        key = (dest, files[0])
        if key not in self.attached:
            from importlib import invalidate_caches

            from .attached import unpack_files

            unpack_files(files[1], dest)
            invalidate_caches()  # modules just written there are found
            self.attached.add(key)
        if sys.path[:1] != [dest]:
            with contextlib.suppress(ValueError):
                sys.path.remove(dest)
            sys.path.insert(0, dest)

    @staticmethod
    def scratch(job_id: str) -> str:
        import tempfile

        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)[:80] or "job"
        base = os.path.join(tempfile.gettempdir(), f"elsewhere-peer-{os.getuid()}")
        os.makedirs(base, mode=0o700, exist_ok=True)
        path = os.path.join(base, safe)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def dirty(self) -> bool:
        """Whether user modules (not the installation's) were imported by tasks.

        Checks only modules imported since the last call (a batch of tiny tasks
        must not pay for looking at every module again)."""
        if self._dirty or len(sys.modules) == self._n_modules:
            return self._dirty
        for name in set(sys.modules) - self.base_modules:
            self.base_modules.add(name)
            f = getattr(sys.modules.get(name), "__file__", None)
            if f and not _is_system_path(f) and "elsewhere" not in name:
                self._dirty = True
                try:
                    st = os.stat(f)
                    self.new_files.append([os.path.abspath(f), st.st_mtime_ns, st.st_size])
                except OSError:
                    self.new_files.append([os.path.abspath(f), -1, -1])  # never found unchanged
        self._n_modules = len(sys.modules)
        return self._dirty

    # -- one batch -------------------------------------------------------
    def run(self, header: dict[str, Any], body: memoryview, fds: list[int]) -> None:
        maps: list[tuple[int, Any, mmap.mmap]] = []
        parts = cut_parts(header["parts"], body, fds, maps=maps, cache=self.in_maps)
        ntask = int(header["ntask"])
        nfn = int(header.get("nfn", len(parts) - ntask))
        task_parts, fn_parts, job_parts = parts[:ntask], parts[ntask : ntask + nfn], parts[ntask + nfn :]
        job = header.get("job") or {}
        digest = header.get("fn") or ""
        jdigest = header.get("jpart") or ""
        items: list[list[Any]] = header["items"]
        failure: BaseException | None = None
        entries: list[Any] = []
        try:
            self.enter_job(job)
            for old in header.get("forget") or ():  # the daemon bounds what is kept here
                self.common.pop(old, None)
            if fn_parts and digest not in self.common:
                self.common[digest] = pickle.loads(fn_parts[0], buffers=fn_parts[1:])
            if job_parts and jdigest not in self.common:  # (job data, files or None)
                self.common[jdigest] = pickle.loads(job_parts[0], buffers=job_parts[1:])
            if jdigest and self.common.get(jdigest, (None, None))[1] is not None:
                self.attach_files(job, self.common[jdigest][1])
            entries = pickle.loads(task_parts[0], buffers=task_parts[1:])
            if not isinstance(entries, list) or len(entries) < len(items):  # items: what to run
                raise ValueError("the batch does not match its items")
        except BaseException as exc:  # e.g. a module that is not installed here
            failure = exc
        del task_parts, fn_parts, job_parts, parts
        common = self.common.get(digest, (None, None))
        if jdigest:  # the job data came in a part of its own
            common = (common[0], self.common.get(jdigest, (None, None))[0])
        out = self._run_items(header, items, entries, common, failure, maps)
        if maps:
            out.send(last=False)  # values that share memory with the inputs are copied out now
            del entries, failure
            released = []
            for position, key, mm in maps:
                try:
                    mm.resize(len(mm))  # a no-op that fails while a task keeps a view of it
                    released.append(position)
                except BufferError:  # kept by the task (a global?): the daemon must not reuse it
                    self.in_maps.pop(key, None)
            while len(self.in_maps) > _KEEP_IN:
                old = self.in_maps.pop(next(iter(self.in_maps)))
                with contextlib.suppress(BufferError):
                    old.close()
            out.released = released
        out.send(last=True)

    # -- warm memory for large results -------------------------------------------
    def lease(self, data: memoryview) -> tuple[int, int, int]:
        """A memfd holding a copy of ``data``: (fd, id, capacity). Reused once the daemon
        releases it, and kept mapped: the copy lands in pages that are already there (a
        fresh page costs more than copying it). The fd stays the child's."""
        view = memoryview(data).cast("B")
        n = len(view)
        fits = [i for i, lease in self.out_pool.items() if lease.free and lease.capacity >= n]
        if fits:
            lid = min(fits, key=lambda i: self.out_pool[i].capacity)
            lease = self.out_pool[lid]
        else:
            self._lease_id += 1
            lid = self._lease_id
            lease = self.out_pool[lid] = _Lease(-(-n // (1 << 20)) << 20)
        lease.mm[:n] = view
        lease.free = False
        return lease.fd, lid, lease.capacity

    def release(self, ids: list[int]) -> None:
        """The daemon is done with these result memfds: reuse (some of) them."""
        for lid in ids:
            lease = self.out_pool.get(lid)
            if lease is not None:
                lease.free = True
        free = [i for i, lease in self.out_pool.items() if lease.free]
        for lid in free[:-_KEEP_OUT] if len(free) > _KEEP_OUT else []:
            self.out_pool.pop(lid).close()

    def _run_items(self, header: dict[str, Any], items: list[list[Any]], entries: list[Any],
                   common: tuple[Any, Any], failure: BaseException | None,
                   maps: list[tuple[int, Any, mmap.mmap]]) -> _Results:  # fmt: skip
        """Run the batch; the last group of outcomes is left in the returned ``_Results``."""
        context = self.context
        _describe_error = self.describe_error
        flush_output = self.flush_output
        job = header.get("job") or {}
        diary = header.get("diary", "always")
        seeding = job.get("seed") is not None
        seeder = self.seeder
        if seeding and not seeder.armed:
            seeder.rearm()
        elif not seeding and seeder.armed:
            seeder.disarm()
        job_seed = int(job.get("seed") or 0)
        ctx = context.TaskContext(index=-1, job=str(job.get("name", "")), job_id=str(job.get("id", "")),
                          cores=int(job.get("cores", 1)), seed=0, job_seed=job_seed,
                          host=self.host, _job_data=lambda: common[1])  # fmt: skip
        token = context.set_current(ctx)
        out = _Results(self, header["batch"], maps)
        out.group_bytes = int(header.get("group_bytes") or GROUP_BYTES)
        try:
            for pos, (index, attempt) in enumerate(items):
                seed = job_seed + index
                log_start = os.lseek(1, 0, os.SEEK_CUR)
                t0 = time.time()
                CUR.pack_into(self.cur, 0, index, t0, log_start)
                ctx.index, ctx.seed, ctx.attempt = index, seed, attempt
                self.warned = False
                ok = True
                with warnings.catch_warnings():
                    warnings.simplefilter("default")  # each task sees its warnings once
                    try:
                        if failure is not None:
                            raise _Unusable
                        if seeding:
                            if seeder.fired:
                                seeder.rearm()
                            seeder.begin(job_seed, index)
                        fn, args, kwargs = entries[pos]
                        if fn is None:
                            fn = common[0]
                        value: Any = fn(*args, **kwargs)
                    except BaseException as exc:
                        ok = False
                        cause = failure if isinstance(exc, _Unusable) and failure else exc
                        value = _describe_error(cause, self.host, index, seed)
                        if isinstance(exc, KeyboardInterrupt):
                            value["message"] = value["message"] or "interrupted"
                flush_output()
                t1 = time.time()
                log = self._log(log_start, diary, ok)
                out.add(index, attempt, ok, value, t0, t1, log)
                del value
                if t1 - out.since >= _FLUSH_S:
                    out.send(last=False)
            CUR.pack_into(self.cur, 0, -1, 0.0, 0)
            return out
        finally:
            context._current.reset(token)

    def _log(self, start: int, diary: str, ok: bool) -> bytes:
        end = os.lseek(1, 0, os.SEEK_CUR)
        keep = end > start and (
            diary == "always" or (diary == "warning" and (self.warned or not ok))
            or (diary == "error" and not ok)
        )  # fmt: skip
        data = b""
        if keep:
            length = end - start
            if length > LOG_CAP:
                cut = length - LOG_CAP
                data = f"[elsewhere: {cut} bytes of output cut here]\n".encode() + os.pread(1, LOG_CAP, end - LOG_CAP)
            else:
                data = os.pread(1, length, start)
        if end > _RESET_LOG_AT:
            os.ftruncate(1, 0)
            os.lseek(1, 0, os.SEEK_SET)
        return data


class _Lease:
    """A warm memfd for large results, mapped for the life of the child."""

    def __init__(self, capacity: int) -> None:
        self.fd = os.memfd_create("elsewhere-result", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, capacity)
        self.mm = mmap.mmap(self.fd, capacity, flags=mmap.MAP_SHARED | _POPULATE)
        self.capacity = capacity
        self.free = True

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class _Unusable(Exception):
    """The batch could not be unpickled here; every task reports why."""


class _Results:
    """Outcomes of a batch, sent to the daemon in groups.

    A group is the values of the tasks that ended since the last send (at
    most 10 ms apart), pickled together as one list, like the local worker's
    result bodies: one write and one read per group, not per task.
    """

    def __init__(self, child: _Child, batch: str,
                 maps: list[tuple[int, Any, mmap.mmap]] | None = None) -> None:  # fmt: skip
        self.child = child
        self.batch = batch
        self.maps = maps or []  # the batch's inputs in shared memory: (position, key, map)
        self._spans: list[tuple[int, int, int]] | None = None  # (position, address, size) of maps
        self.since = time.time()
        self.values: list[Any] = []
        self.items: list[list[Any]] = []
        self.logs: list[bytes] = []
        self.oob = 0
        self.released: list[int] = []
        self.group_bytes = GROUP_BYTES

    def add(self, index: int, attempt: int, ok: bool, value: Any, t0: float, t1: float,
            log: bytes) -> None:  # fmt: skip
        status = Outcome.OK if ok else Outcome.ERROR
        self.items.append([index, attempt, int(status), len(self.values), t0, t1, 0, len(log)])
        self.values.append(value)
        self.logs.append(log)

    def _pickle(self) -> tuple[bytes, list[memoryview]]:
        serial = self.child.serial
        _describe_error = self.child.describe_error
        try:
            if self.oob >= _MAX_RESULT_OOB:  # a RESULT carries at most 1024 buffers
                return pickle.dumps(self.values, protocol=5), []
            return serial.dumps_plain(self.values)
        except Exception:
            pass
        for j, value in enumerate(self.values):  # find the values that cannot be pickled
            try:
                serial.dumps_plain(value)
            except Exception as exc:
                index = self.items[j][0]
                err = _describe_error(exc, self.child.host, index, 0)
                err["message"] = f"the result of task {index} cannot be serialised: {err['message']}"
                self.values[j] = err
                self.items[j][2] = int(Outcome.ERROR)
        return serial.dumps_plain(self.values)

    def _within_input(self, data: memoryview) -> tuple[int, int] | None:
        """(position, offset) of ``data`` inside one of the batch's input maps, if it lies
        wholly in one: a result that is (a slice of) its argument needs no copy."""
        start = _address(data)
        if start is None:
            return None
        if self._spans is None:
            self._spans = []
            for position, _key, mm in self.maps:
                base = _address(mm)
                if base is not None:
                    self._spans.append((position, base, len(mm)))
        for position, base, size in self._spans:
            if base <= start and start + len(data) <= base + size:
                return position, start - base
        return None

    def send(self, *, last: bool) -> None:
        pickled = self._pickle() if self.items else None
        if pickled is None or len(self.items) < 2 or _size(pickled) <= self.group_bytes:
            self._send_group(pickled, last=last)
            return
        # A large group goes in parts of at most group_bytes (a value larger goes alone):
        # the daemon replaces a group that cannot travel (a RESULT is one frame) by errors,
        # and then only for the values too large themselves.
        items, values, logs = self.items, self.values, self.logs
        sizes = []
        for value in values:
            try:
                sizes.append(_size(self.child.serial.dumps_plain([value])))
            except Exception:
                sizes.append(0)  # it fails again below, and becomes an error there
        parts: list[list[int]] = [[]]
        total = 0
        for k, size in enumerate(sizes):
            if parts[-1] and total + size > self.group_bytes:
                parts.append([])
                total = 0
            parts[-1].append(k)
            total += size
        for n, part in enumerate(parts):
            self.items, self.values, self.logs = [items[k] for k in part], [values[k] for k in part], [
                logs[k] for k in part]  # fmt: skip
            for pos, item in enumerate(self.items):
                item[3] = pos
            self._send_group(self._pickle(), last=last and n == len(parts) - 1)

    def _send_group(self, pickled: tuple[bytes, list[memoryview]] | None, *, last: bool) -> None:
        header: dict[str, Any] = {"op": "results", "batch": self.batch, "items": self.items,
                                  "last": last, "group": None}  # fmt: skip
        body: list[Any] = []
        fds: list[int] = []
        if pickled is not None:
            data, bufs = pickled
            parts: list[list[int]] = []
            body.append(data)
            for b in bufs:
                within = self._within_input(b) if len(b) >= OOB_MEMFD_BYTES and self.maps else None
                if within is not None:  # a view of an input (returned as given, or changed
                    parts.append([len(b), 2, *within])  # in place): the daemon sends it from there
                elif len(b) >= OOB_MEMFD_BYTES and len(fds) < _MAX_FDS:
                    fd, lid, capacity = self.child.lease(b)
                    fds.append(fd)
                    parts.append([len(b), 1, lid, capacity])
                else:
                    body.append(b)
                    parts.append([len(b), 0])
            self.oob += len(bufs)
            header["group"] = [len(data), parts]
            rss = _peak_rss()
            for item in self.items:
                item[6] = rss
            body.extend(self.logs)
        if last:
            header["dirty"] = self.child.dirty()
            if self.child.new_files:
                header["user_files"], self.child.new_files = self.child.new_files, []
            header["released"] = self.released
            reader = self.child.reader
            if reader.polls:  # how often it polled, awake, since its last batch
                header["polls"], reader.polls = reader.polls, 0
        send_message(self.child.sock, header, body, fds)
        self.values, self.items, self.logs = [], [], []
        self.since = time.time()


def _size(pickled: tuple[bytes, list[memoryview]]) -> int:
    return len(pickled[0]) + sum(memoryview(b).nbytes for b in pickled[1])


def _address(data: Any) -> int | None:
    """Where a contiguous buffer's bytes start in this process (None if it cannot be told)."""
    import ctypes

    try:
        holder = ctypes.c_char.from_buffer(data)  # a writable buffer
    except (TypeError, ValueError):
        np = sys.modules.get("numpy")  # read-only: NumPy, when loaded, reads any buffer
        if np is None:
            return None
        try:
            return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)
        except (TypeError, ValueError):
            return None
    address = ctypes.addressof(holder)
    del holder  # the export ends here: the map can be released (resized) afterwards
    return address


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m elsewhere.peer.child SOCK_FD CUR_FD``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m elsewhere.peer.child SOCK_FD CUR_FD (started by the peer daemon)",
              file=sys.stderr)  # fmt: skip
        return 2
    import faulthandler
    import signal

    faulthandler.enable(file=sys.stderr, all_threads=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which drains
    sock = socket.socket(fileno=int(args[0]))
    cur_fd = int(args[1])
    cur = mmap.mmap(cur_fd, CUR.size)
    os.close(cur_fd)
    child = _Child(sock, cur)
    send_message(sock, {"op": "ready", "pid": os.getpid(), "rss": _peak_rss()})
    poll_until = 0.0
    while True:
        msg = child.reader.read_one(poll_until)
        if msg is None:
            return 0
        header, body, fds = msg
        op = header.get("op")
        if op == "run":
            child.run(header, body, fds)
            # The next batch of a stream of short ones (an Executor's next task) often comes
            # within moments: polling meanwhile saves a wake-up on its path (the daemon's
            # --busy-poll; 0: sleep at once).
            poll_until = time.monotonic() + float(header.get("poll", 0.0))
        elif op == "release":
            child.release([int(i) for i in header.get("ids", [])])
        elif op == "exit":
            return 0
        else:
            for fd in fds:
                os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
