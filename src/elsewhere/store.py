"""The job folder: the single source of truth about a job.

Layout (``docs/job-folder.md`` explains each file)::

    <job>/job.json            metadata; written by the client, atomically
    <job>/payload.log         function, job data and task inputs, in chunks
    <job>/queue.json          which tasks are claimed, by whom; under queue.lock
    <job>/queue.lock          flock(2) guard of queue.json
    <job>/cluster.json        the backend's own data (scheduler ids, hosts, pids)
    <job>/journal/<w>.rec     per-worker append-only journal of task outcomes
    <job>/results/<w>.bin     per-worker result bodies the journal points into
    <job>/logs/<w>.log        per-worker captured stdout+stderr
    <job>/workers/<w>.json    who a worker given its tasks is (host, pid, python); others: queue.json
    <job>/workers/<w>.cur     the task a worker runs now (shared memory, see worker.py)
    <job>/notify.fifo         a worker writes a byte here after new results
    <job>/files/              files attached with ``files=``

Every file has one writer, or is guarded by ``queue.lock``. Whole-file
writes go to a temporary name and are renamed; appends are whole,
checksummed frames.

This module is imported by the worker: keep its imports light.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import os
import struct
import time
import zlib

from . import records
from .records import Kind, Record

TYPE_CHECKING = False  # neither typing nor pathlib at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from typing import Any

META = "job.json"
PAYLOAD = "payload.log"
QUEUE = "queue.json"
QUEUE_B = "queue.b.json"  # the queue's second slot (see write_queue)
QUEUE_LOCK = "queue.lock"
CLUSTER = "cluster.json"
NOTIFY = "notify.fifo"
CONTROL = "_control"  # pseudo-worker id of records written by reapers and cancel

CUR = struct.Struct("<qdq")  # task now running (-1: none), since (unix time), its log offset


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def atomic_write(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


def write_json(path: str | os.PathLike[str], obj: Any, *, fsync: bool = True) -> None:
    """Atomically write ``obj`` as JSON."""
    atomic_write(path, _json_bytes(obj), fsync=fsync)


def write_new(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON in place, no temporary file, no rename: for a file that no
    one reads before it is whole (one of a job folder being made, a worker's own info)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, _json_bytes(obj))
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file."""
    with open(path, "rb") as f:
        return json.loads(f.read())


def writev_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """Write all ``parts`` to ``fd`` (handles short writes and the iovec limit)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        n = os.writev(fd, views[:512])
        while n:
            first = views[0]
            if n >= first.nbytes:
                n -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[n:]
                n = 0


class JobStore:
    """Access to one job folder."""

    _held: tuple[int, int, int] | None = None
    seen_submitted = False  # a queue state read or written here said "submitted" (never unset)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.dir = os.fspath(path)

    def hold_queue(self) -> None:
        """Keep queue.lock and the queue's two slots open until ``release_queue`` (a
        worker inside the job: a claim is then a lock, two reads and a write)."""
        if self._held is None:
            fds: list[int] = []
            try:
                for name in (QUEUE_LOCK, QUEUE, QUEUE_B):
                    fds.append(os.open(self._p(name), os.O_RDWR))
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            self._held = (fds[0], fds[1], fds[2])

    def release_queue(self) -> None:
        held, self._held = self._held, None
        for fd in held or ():
            os.close(fd)

    @property
    def path(self) -> Path:
        """The job folder, as a Path (for the client; workers use ``dir``)."""
        from pathlib import Path

        return Path(self.dir)

    def _p(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def __repr__(self) -> str:
        return f"JobStore({self.dir!r})"

    # -- creation ---------------------------------------------------------
    @classmethod
    def create(cls, path: Path, meta: dict[str, Any]) -> JobStore:  # client only
        """Make a new job folder (mode 0700) with its metadata."""
        from . import housekeeping

        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        housekeeping.make_job_folder(path)  # subfolders, queue.lock, notify.fifo, empty files
        store = cls(path)
        write_new(path / META, meta)  # made durable when the job is submitted
        return store

    # -- metadata ---------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """The job's metadata."""
        return read_json(self._p(META))

    def update_meta(self, *, fsync: bool = True, **changes: Any) -> dict[str, Any]:
        """Change metadata fields (the client is the only writer)."""
        meta = self.meta()
        meta.update(changes)
        write_json(self._p(META), meta, fsync=fsync)
        return meta

    def cluster_data(self) -> dict[str, Any]:
        """What the backend stored with ``set_job_cluster_data``."""
        try:
            return read_json(self._p(CLUSTER))
        except FileNotFoundError:
            return {}

    def set_cluster_data(self, data: dict[str, Any]) -> None:
        """Store the backend's own data (scheduler ids, hosts, pids)."""
        write_json(self._p(CLUSTER), data)

    # -- the queue ----------------------------------------------------------
    def locked_queue(self) -> _LockedQueue:
        """The queue state under its lock; changes are written back on exit::

            with store.locked_queue() as q:
                q["next"] += 1
        """
        return _LockedQueue(self)

    def queue(self) -> dict[str, Any]:
        """A snapshot of the queue state (no lock: the file is replaced atomically)."""
        try:
            q = read_queue(self)[2]
        except FileNotFoundError:
            return new_queue(0)
        if q.get("submitted"):
            self.seen_submitted = True
        return q

    def notify(self) -> None:
        """Wake a client waiting on this job, if any (never blocks)."""
        try:
            fd = os.open(self._p(NOTIFY), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # no reader (ENXIO) or no fifo: nobody waits
        try:
            os.write(fd, b"!")
        except OSError:
            pass  # full (EAGAIN): the reader is awake anyway
        finally:
            os.close(fd)

    # -- journals and results -----------------------------------------------
    def journal_path(self, wid: str) -> str:
        return self._p("journal", f"{wid}.rec")

    def results_path(self, wid: str) -> str:
        return self._p("results", f"{wid}.bin")

    def log_path(self, wid: str) -> str:
        return self._p("logs", f"{wid}.log")

    def workers(self) -> list[str]:
        """Ids of every worker that has written a journal."""
        try:
            names = os.listdir(self._p("journal"))
        except FileNotFoundError:
            return []
        return [n[:-4] for n in names if n.endswith(".rec")]

    def append_control(self, recs: list[Record]) -> None:
        """Append records written by a reaper or by cancel (caller holds the queue lock)."""
        fd = os.open(self.journal_path(CONTROL), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, records.pack_frame(recs))
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_running(self, wid: str) -> tuple[int, float, int]:
        """(task index, since, log offset) of what worker ``wid`` runs now; index -1 if none."""
        try:
            with open(self._p("workers", f"{wid}.cur"), "rb") as f:
                data = f.read(CUR.size)
        except FileNotFoundError:
            return -1, 0.0, 0
        if len(data) < CUR.size:
            return -1, 0.0, 0
        idx, since, log_off = CUR.unpack(data)
        return int(idx), float(since), int(log_off)

    def worker_info(self, wid: str) -> dict[str, Any]:
        """Who worker ``wid`` is (host, pid, python): its queue member entry, or, for a
        worker given its tasks (no membership), ``workers/<wid>.json``."""
        try:
            return read_json(self._p("workers", f"{wid}.json"))
        except (FileNotFoundError, ValueError):
            pass
        try:
            member = self.queue().get("members", {}).get(wid)
        except (OSError, ValueError):
            return {}
        return dict(member) if member else {}


class _LockedQueue:
    """``with store.locked_queue() as q``: flock, read, yield, write back if changed."""

    __slots__ = ("body", "fd", "gen", "q", "slot", "store")

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def __enter__(self) -> dict[str, Any]:
        held = self.store._held
        self.fd = held[0] if held else os.open(self.store._p(QUEUE_LOCK), os.O_RDWR)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            if held and os.fstat(held[1]).st_nlink == 0:  # the folder was purged: as if opened by path
                raise FileNotFoundError(self.store._p(QUEUE))
            try:
                self.gen, self.slot, q, self.body = _read_newest(self.store)
            except FileNotFoundError:
                self.gen, self.slot, q, self.body = 0, 1, new_queue(0), b""
        except BaseException:
            self._release()
            raise
        self.q = q
        return q

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if exc_type is None:
                body = _json_bytes(self.q)  # the state read encodes to the bytes read: unchanged
                if body != self.body:
                    # over the older slot: the one just read stays whole if this write is torn
                    _write_slot(self.store, body, self.gen + 1, 1 - self.slot)
                if self.q.get("submitted"):
                    self.store.seen_submitted = True
        finally:
            self._release()

    def _release(self) -> None:
        if self.store._held:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        else:
            os.close(self.fd)  # releases the lock


_QUEUE_MAGIC = b"EWQ1"


def write_queue(store: JobStore, q: dict[str, Any], gen: int, slot: int) -> None:
    """Write queue state ``q`` as generation ``gen`` into ``slot`` (0: queue.json, 1: queue.b.json).

    The queue is rewritten at every claim, join and leave, always under
    queue.lock. It is written *in place*, into the slot that does not hold the
    newest state, as one line ``EWQ1 <generation> <length> <crc32>`` and the
    JSON; a reader takes the newest slot whose checksum holds. A write torn by
    a crash leaves the other slot, the state before it, to be read; a reader
    without the lock that meets a slot being written does the same. No file is
    created or renamed per update (on many disks that costs more than the rest
    of a claim).
    """
    _write_slot(store, _json_bytes(q), gen, slot)


def _write_slot(store: JobStore, body: bytes, gen: int, slot: int) -> None:
    data = b"%s %d %d %08x\n%s" % (_QUEUE_MAGIC, gen, len(body), zlib.crc32(body), body)
    held = store._held
    fd = held[1 + slot] if held else os.open(store._p(QUEUE_B if slot else QUEUE), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        view = memoryview(data)
        off = 0
        while off < len(data):
            off += os.pwrite(fd, view[off:], off)
        os.ftruncate(fd, len(data))
    finally:
        if not held:
            os.close(fd)


def _pread_all(fd: int) -> bytes:
    data = os.pread(fd, 65536, 0)
    if len(data) < 65536:
        return data
    parts = [data]
    off = len(data)
    while chunk := os.pread(fd, 1 << 20, off):
        parts.append(chunk)
        off += len(chunk)
    return b"".join(parts)


def _parse_slot(data: bytes) -> tuple[int, dict[str, Any], bytes] | None:
    """(generation, state, JSON body) of one slot's bytes; None if not whole."""
    if data[:1] == b"{":  # a plain JSON file (job folders from before the slots)
        try:
            return 0, json.loads(data), b""
        except ValueError:
            return None
    nl = data.find(b"\n")
    head = data[:nl].split() if nl > 0 else []
    if len(head) != 4 or head[0] != _QUEUE_MAGIC:
        return None
    try:
        gen, length, crc = int(head[1]), int(head[2]), int(head[3], 16)
        body = data[nl + 1:nl + 1 + length]
        if len(body) != length or zlib.crc32(body) != crc:
            return None
        return gen, json.loads(body), body
    except ValueError:
        return None


def _read_newest(store: JobStore) -> tuple[int, int, dict[str, Any], bytes]:
    """(generation, slot, state, JSON body) of the newest whole queue state; FileNotFoundError if none."""
    best: tuple[int, int, dict[str, Any], bytes] | None = None
    found = False
    held = store._held
    for slot, name in ((0, QUEUE), (1, QUEUE_B)):
        if held:
            data = _pread_all(held[1 + slot])
        else:
            try:
                fd = os.open(store._p(name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                data = _pread_all(fd)
            finally:
                os.close(fd)
        found = True
        got = _parse_slot(data)
        if got is not None and (best is None or got[0] > best[0]):
            best = (got[0], slot, got[1], got[2])
    if best is None:
        if found:
            raise ValueError(f"the queue of job folder {store.dir} is damaged (no slot whole)")
        raise FileNotFoundError(store._p(QUEUE))
    return best


def read_queue(store: JobStore) -> tuple[int, int, dict[str, Any]]:
    """(generation, slot, state) of the newest whole queue state; FileNotFoundError if none."""
    gen, slot, q, _ = _read_newest(store)
    return gen, slot, q


def new_queue(n: int, *, closed: bool = True, max_workers: int = 1, retries: int = 0) -> dict[str, Any]:
    """A fresh queue state for ``n`` tasks."""
    return {
        "n": n,
        "next": 0,
        "closed": closed,
        "cancelled": False,
        "retry": [],
        "attempts": {},
        "max_workers": max_workers,
        "retries": retries,
        "members": {},
        "cancelled_tasks": [],
        "submitted": False,
    }


class Outcomes:
    """task -> (worker id, record), read like a dict; a range record's tasks are one entry.

    A hundred thousand tiny tasks are a few dozen range records: keeping them as
    ranges (sorted, bisected) instead of one dict entry per task saves the client
    a dict insert per task and the memory of a dict of every task. Single
    records, and tasks of a range that a later attempt overtook, are in a dict,
    which wins over the ranges.
    """

    __slots__ = ("_n", "_ranges", "_single", "_starts")

    def __init__(self) -> None:
        self._single: dict[int, tuple[str, Record]] = {}
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, tuple[str, Record]]] = []  # (first, end, entry)
        self._n = 0

    def _range_index(self, t: int) -> int:
        i = bisect.bisect_right(self._starts, t) - 1
        return i if i >= 0 and t < self._ranges[i][1] else -1

    def get(self, t: int, default: Any = None) -> Any:
        e = self._single.get(t)
        if e is not None:
            return e
        if self._ranges:
            i = bisect.bisect_right(self._starts, t) - 1
            if i >= 0:
                r = self._ranges[i]
                if t < r[1]:
                    return r[2]
        return default

    def __getitem__(self, t: int) -> tuple[str, Record]:
        e = self.get(t)
        if e is None:
            raise KeyError(t)
        return e

    def __contains__(self, t: object) -> bool:
        return isinstance(t, int) and self.get(t) is not None

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        single = self._single
        yield from list(single)
        for first, end, _ in list(self._ranges):
            for t in range(first, end):
                if t not in single:
                    yield t

    def keys(self) -> Iterator[int]:
        return iter(self)

    def values(self) -> Iterator[tuple[str, Record]]:
        return (self[t] for t in self)

    def items(self) -> Iterator[tuple[int, tuple[str, Record]]]:
        return ((t, self[t]) for t in self)

    def __setitem__(self, t: int, entry: tuple[str, Record]) -> None:
        if t not in self:
            self._n += 1
        self._single[t] = entry

    def __delitem__(self, t: int) -> None:
        i = self._range_index(t)
        if i >= 0:  # rare (a retry forgets an outcome): that range becomes single entries
            first, end, entry = self._ranges.pop(i)
            del self._starts[i]
            for u in range(first, end):
                self._single.setdefault(u, entry)
        del self._single[t]
        self._n -= 1

    def add_range(self, first: int, count: int, entry: tuple[str, Record]) -> bool:
        """Add a range record's tasks as one entry; False (nothing added) if any has an outcome."""
        end = first + count
        i = bisect.bisect_right(self._starts, first) - 1
        if i >= 0 and self._ranges[i][1] > first:
            return False
        if i + 1 < len(self._ranges) and self._ranges[i + 1][0] < end:
            return False
        single = self._single
        if single and (any(first <= t < end for t in single) if len(single) < count
                       else not single.keys().isdisjoint(range(first, end))):
            return False
        self._starts.insert(i + 1, first)
        self._ranges.insert(i + 1, (first, end, entry))
        self._n += count
        return True

    def run_end(self, t: int) -> int:
        """If ``t`` is in a range whose entry no later outcome overtook from ``t`` on,
        the end of that range (tasks ``t .. end-1`` share the entry); else ``t``."""
        i = self._range_index(t)
        if i < 0:
            return t
        end = self._ranges[i][1]
        single = self._single
        if single and any(t <= u < end for u in single):
            return t
        return end


class JournalReader:
    """Reads every worker's journal incrementally: only what is new each time.

    ``final`` maps a task to (worker id, record) (an :class:`Outcomes`); a
    range record stands for each of its tasks (the task's value is item
    ``rec.item + task - rec.task``).
    """

    def _add_range(self, wid: str, r: Record) -> int:
        final = self.final
        tasks = range(r.task, r.task + r.count)
        entry = (wid, r)
        if final.add_range(r.task, r.count, entry):
            self.kind_counts[r.kind] += r.count
            return r.count
        new = 0
        for t in tasks:  # overlaps earlier outcomes (a retry): one by one, same rule as single records
            old = final.get(t)
            if old is None or r.attempt > old[1].attempt:
                if old is not None:
                    self.kind_counts[old[1].kind] -= 1
                final[t] = entry
                self.kind_counts[r.kind] += 1
                new += 1
        return new

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._offsets: dict[str, int] = {}
        self.final = Outcomes()  # the outcome that counts, per task
        self.kind_counts: dict[int, int] = dict.fromkeys((int(k) for k in Kind), 0)

    def refresh(self) -> int:
        """Read what is new; return how many new outcomes were found."""
        new = 0
        for wid in self.store.workers():
            off = self._offsets.get(wid, 0)
            try:
                fd = os.open(self.store.journal_path(wid), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                if size <= off:
                    continue
                data = os.pread(fd, size - off, off)
            finally:
                os.close(fd)
            recs, used = records.parse_frames(data)
            self._offsets[wid] = off + used
            final = self.final
            counts = self.kind_counts
            for r in recs:
                if r.count > 1:
                    new += self._add_range(wid, r)
                    continue
                old = final.get(r.task)
                if old is None:
                    final[r.task] = (wid, r)
                    counts[r.kind] += 1
                    new += 1
                elif r.attempt > old[1].attempt or (
                    r.attempt == old[1].attempt
                    and old[1].kind in (Kind.LOST, Kind.CANCELLED)
                    and r.kind in (Kind.OK, Kind.ERROR)
                ):
                    # A later attempt (a retry) wins; so does a real result that
                    # arrives after its task was written off. Duplicates are dropped.
                    final[r.task] = (wid, r)
                    counts[old[1].kind] -= 1
                    counts[r.kind] += 1
                    new += 1
        return new

    def forget(self, tasks: dict[int, int]) -> None:
        """Drop outcomes older than the attempt a retry asked for (``{task: attempt}``),
        so a task being run again counts as queued, not as its old failure."""
        final = self.final
        for t, attempt in tasks.items():
            old = final.get(t)
            if old is not None and old[1].attempt < attempt:
                del final[t]
                self.kind_counts[old[1].kind] -= 1


#: Record flag: the body holds this one task's value, not a list of a group's values.
FLAG_SINGLE = 1


class OutcomeWriter:
    """Appends outcomes that arrive already pickled (peer results) as worker ``wid``.

    The same files and formats as a worker's own: result bodies, journal
    frames, log bytes; the writer is the only writer of those three files.
    """

    def __init__(self, store: JobStore, wid: str) -> None:
        self.store = store
        self.wid = wid
        self.res_fd = os.open(store.results_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.jfd = os.open(store.journal_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.log_fd = os.open(store.log_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.res_end = os.fstat(self.res_fd).st_size
        self.log_end = os.fstat(self.log_fd).st_size

    def write(
        self, task: int, *, ok: bool, pickled: bytes | memoryview, buffers: list[Any] = (),  # type: ignore[assignment]
        log: bytes = b"", t_start: float = 0.0, t_end: float = 0.0, seed: int = 0, attempt: int = 0,
        peak_rss: int = 0, sync: bool = True,
    ) -> None:
        """Write one task's outcome; durable on return when ``sync``."""
        parts = records.pack_body(bytes(pickled) if isinstance(pickled, memoryview) else pickled,
                                  [memoryview(b) for b in buffers])
        size = records.body_size(parts)
        off = self.res_end
        writev_all(self.res_fd, parts)
        self.res_end += size
        log_off = self.log_end
        if log:
            writev_all(self.log_fd, [log])
            self.log_end += len(log)
        rec = Record(int(Kind.OK if ok else Kind.ERROR), FLAG_SINGLE, attempt, task, 0, 1, off, size,
                     log_off, len(log), t_start, t_end, peak_rss, seed)
        if sync:
            os.fsync(self.res_fd)
        os.write(self.jfd, records.pack_frame([rec]))
        if sync:
            os.fsync(self.jfd)

    def close(self) -> None:
        for fd in (self.res_fd, self.jfd, self.log_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def read_body(store: JobStore, wid: str, rec: Record, cache: dict[tuple[str, int], list[Any]],
              task: int | None = None) -> Any:
    """The value (or error description) of one task (``task``, for a range record), from its body.

    A group's body (a list of values) is kept in ``cache``; a single value's is not.
    """
    key = (wid, rec.res_off)
    values = cache.get(key)
    if values is None:
        fd = os.open(store.results_path(wid), os.O_RDONLY)
        try:
            buf = bytearray(rec.res_len)
            got = os.preadv(fd, [buf], rec.res_off)
        finally:
            os.close(fd)
        if got != rec.res_len:
            raise ValueError(f"the results of worker {wid} end before task {rec.task}'s ({got} of {rec.res_len} bytes)")
        pickled, bufs = records.unpack_body(buf)
        from . import serial

        value = serial.loads(pickled, bufs)
        if rec.flags & FLAG_SINGLE:
            return value
        values = cache[key] = value
    return values[rec.item + ((task - rec.task) if task is not None else 0)]


def read_log(store: JobStore, wid: str, off: int, length: int) -> str:
    """Bytes ``off .. off+length`` of a worker's log, as text."""
    try:
        with open(store.log_path(wid), "rb") as f:
            f.seek(off)
            data = f.read(length) if length >= 0 else f.read()
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", errors="replace")


def lock_is_free(path: str) -> bool:
    """True when nobody holds ``path``'s flock: the worker that held it is gone."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also drops the lock if we got it
    return True


def resulted_by(store: JobStore, wid: str) -> set[int]:
    """Every task that worker ``wid`` wrote an outcome for."""
    try:
        with open(store.journal_path(wid), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return set()
    recs, _ = records.parse_frames(data)
    return {t for r in recs for t in range(r.task, r.task + r.count)}


def reap(store: JobStore, q: dict[str, Any], dead: set[str] | None = None) -> list[str]:
    """Write off the workers of ``q`` that have vanished (caller holds the queue lock).

    A member counts as gone when it is in ``dead`` or, by default, when its
    lock is free. The task it was running is failed as "lost", or put back
    for a retry while its budget lasts; the rest of its claim goes back to
    the queue untouched. Returns the ids of the workers written off.
    """
    gone: list[str] = []
    lost: list[Record] = []
    for wid, m in q["members"].items():
        if m.get("state") not in ("active", "waiting"):
            continue
        if dead is not None:
            if wid not in dead:
                continue
        elif not lock_is_free(m.get("lock", "")):
            continue
        gone.append(wid)
        m["state"] = "dead"
        claim = m.get("claim") or []
        m["claim"] = []
        if not claim or q.get("cancelled"):
            continue
        done = resulted_by(store, wid)
        running, since, log_off = store.read_running(wid)
        back: list[int] = []
        for idx in records.iter_ranges(claim):
            if idx in done:
                continue
            if idx != running:
                back.append(idx)
                continue
            attempts = q["attempts"].get(str(idx), 0) + 1
            q["attempts"][str(idx)] = attempts
            if attempts <= q.get("retries", 0):
                back.append(idx)
            else:
                log_len = max(0, _log_size(store, wid) - log_off)
                lost.append(
                    records.make_record(
                        Kind.LOST, idx, attempts - 1, log_off=log_off, log_len=log_len,
                        t_start=since, t_end=time.time(),
                    )
                )
                q.setdefault("lost_by", {})[str(idx)] = wid
        q["retry"][:0] = back
    if lost:
        store.append_control(lost)
    return gone


def _log_size(store: JobStore, wid: str) -> int:
    try:
        return os.path.getsize(store.log_path(wid))
    except OSError:
        return 0

