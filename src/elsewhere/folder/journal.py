"""The journal side of a job folder: task outcomes, written and read.

Each worker appends the outcomes of its tasks to its own files (see
``store.py`` for the whole layout)::

    <job>/journal/<w>.rec     append-only, checksummed frames of records (records.py)
    <job>/results/<w>.bin     the result bodies the records point into
    <job>/logs/<w>.log        the captured output the records point into

Here: :class:`Outcomes` and :class:`JournalReader` (the outcome that counts
for each task, read incrementally), :func:`read_body` and :func:`read_log`
(what a record points to), :class:`OutcomeWriter` (outcomes that arrive
already pickled, written as a worker would), and :func:`reap` (writing off
the workers that vanished, with :func:`lock_is_free` and :func:`resulted_by`).

This module is imported by the worker: keep its imports light.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import time

from . import records
from .records import Kind, Record
from .store import writev_all

TYPE_CHECKING = False  # typing is not imported at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from .queue import Queue
    from .store import JobStore


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

        try:
            value = serial.loads(pickled, bufs)
        except ImportError:  # a module of the user's, importable where the job was made
            from .lifecycle import import_from_job

            if not import_from_job(store.meta()):
                raise
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


def reap(store: JobStore, q: Queue, dead: set[str] | None = None) -> list[str]:
    """Write off the workers of ``q`` that have vanished (caller holds the queue lock).

    A member counts as gone when it is in ``dead`` or, by default, when its
    lock is free. The task it was running is failed as "lost", or put back
    for a retry while its budget lasts; the rest of its claim goes back to
    the queue untouched. Returns the ids of the workers written off.
    """
    gone: list[str] = []
    lost: list[Record] = []
    cancelled = q.cancelled_tasks
    for wid, m in q.members.items():
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
        if not claim or q.cancelled:
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
            if idx in cancelled:  # stopped because it was cancelled: that is its outcome
                lost.append(records.make_record(Kind.CANCELLED, idx, q.attempt(idx), t_start=since,
                                                t_end=time.time()))  # fmt: skip
                continue
            attempts = q.count_attempt(idx)
            if attempts <= q.retries:
                back.append(idx)
            else:
                log_len = max(0, _log_size(store, wid) - log_off)
                lost.append(
                    records.make_record(
                        Kind.LOST, idx, attempts - 1, log_off=log_off, log_len=log_len,
                        t_start=since, t_end=time.time(),
                    )
                )
                q.lose(idx, by=wid)
        q.requeue(back)
    if lost:
        store.append_control(lost)
    return gone


def _log_size(store: JobStore, wid: str) -> int:
    try:
        return os.path.getsize(store.log_path(wid))
    except OSError:
        return 0

