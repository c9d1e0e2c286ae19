"""The journal side of a job folder: task outcomes, written and read.

Each worker appends the outcomes of its tasks to its own files (see
``store.py`` for the whole layout)::

    <job>/journal/<w>.rec     append-only, checksummed frames of records (records.py)
    <job>/results/<w>.bin     the result bodies the records point into
    <job>/logs/<w>.log        the captured output the records point into

Here: :class:`JournalReader` (the outcome that counts for each task, read incrementally,
damaged frames skipped and reported; kept in an :class:`Outcomes`, ``taskmap.py``),
:func:`read_body` and :func:`read_log`
(what a record points to), :class:`OutcomeWriter` (outcomes that arrive
already pickled, written as a worker would), and :func:`reap` (writing off
the workers that vanished, with :func:`lock_is_free` and :func:`finished_by`).

This module is imported by the worker: keep its imports light.
"""

from __future__ import annotations

import fcntl
import os
import time

from . import records
from .records import FLAG_DAMAGED, FLAG_RERUN, FLAG_SINGLE, Kind, Record
from .store import is_control, writev_all
from .taskmap import Outcomes as Outcomes  # (its home before taskmap.py)

TYPE_CHECKING = False  # typing is not imported at run time: the worker imports this module
if TYPE_CHECKING:
    from typing import Any

    from .queue import Queue
    from .store import JobStore


def _rank(r: Record) -> int:
    """Which of two outcomes of the same attempt counts: a damaged mark over a result, a
    result over a lost or cancelled record (one written off before its result came)."""
    if r.flags & FLAG_DAMAGED:
        return 2
    return 1 if r.kind <= Kind.ERROR else 0


class JournalReader:
    """Reads every worker's journal incrementally: only what is new each time.

    ``final`` maps a task to (worker id, record) (an :class:`Outcomes`); a
    range record stands for each of its tasks (the task's value is item
    ``rec.item + task - rec.task``). Of two outcomes of one task, the later attempt
    counts; of one attempt, a damaged mark, then a result, then a lost or cancelled record.

    Damage is skipped, not the end of reading (``records.scan_frames``): ``damage`` maps a
    worker to the spans of its journal skipped, ``(start, end, what)``; ``missing`` holds the
    workers whose journal was read once and is gone; ``tails`` how many bytes of each journal
    after its last whole frame are not read yet (a frame being written, or cut);
    ``body_end`` where each worker's last result body ends (its results file is at least
    that long, unless damaged); ``damaged_tasks`` the tasks whose outcome is a damaged mark.

    An error record flagged ``FLAG_RERUN`` (the task runs again, ``retries=ew.Retry(...)``) is
    never an outcome: ``reruns`` keeps the latest such record of each task (worker id,
    record), whose attempt + 1 is the task's attempt now due or run.
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
            new += self._add(t, entry, final.get(t))
        return new

    def _add(self, t: int, entry: tuple[str, Record], old: tuple[str, Record] | None) -> int:
        """Make ``entry`` task ``t``'s outcome if it counts over ``old``; 1 if it did."""
        r = entry[1]
        if r.flags & FLAG_RERUN:  # an error run again: kept apart, never the outcome
            seen = self.reruns.get(t)
            if seen is None or seen[1].attempt < r.attempt:
                self.reruns[t] = entry
            return 0
        if old is not None:
            o = old[1]
            if r.attempt < o.attempt or (r.attempt == o.attempt and _rank(r) <= _rank(o)):
                return 0  # an earlier attempt, or a duplicate
            self.kind_counts[o.kind] -= 1
            if o.flags & FLAG_DAMAGED:
                self.damaged_tasks.discard(t)
        self.final[t] = entry
        self.kind_counts[r.kind] += 1
        if r.flags & FLAG_DAMAGED:
            self.damaged_tasks.add(t)
        if self.track is not None:
            self.track.append(t)
        return 1

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._offsets: dict[str, int] = {}
        self.final = Outcomes()  # the outcome that counts, per task
        self.kind_counts: dict[int, int] = dict.fromkeys((int(k) for k in Kind), 0)
        self.damage: dict[str, list[tuple[int, int, str]]] = {}
        self.missing: set[str] = set()
        self.tails: dict[str, int] = {}
        self.body_end: dict[str, int] = {}
        self.damaged_tasks: set[int] = set()
        self.reruns: dict[int, tuple[str, Record]] = {}  # the latest error run again, per task
        self.listed: set[str] = set()  # the workers whose journal was there at the last look
        self.changes = 0  # outcomes taken in so far (a new one, or one that overtook another)
        # None, or a list the single-record tasks whose outcome is new are appended to (an
        # Executor retires them from ``final`` once their futures are done)
        self.track: list[int] | None = None

    def refresh(self) -> int:
        """Read what is new; return how many new outcomes were found."""
        new = 0
        listed = self.store.workers()
        self.listed = set(listed)
        self.missing = {w for w in self._offsets if w not in self.listed}
        for wid in listed:
            off = self._offsets.get(wid, 0)
            try:
                fd = os.open(self.store.journal_path(wid), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                if size < off:  # cut or replaced after it was read: read it again
                    self._note(wid, (size, off, f"the file shrank from {off} to {size} bytes"))
                    off = 0
                if size <= off:
                    self.tails[wid] = 0
                    self._offsets[wid] = off
                    continue
                data = os.pread(fd, size - off, off)
            finally:
                os.close(fd)
            recs, used, damaged = records.scan_frames(data)
            for a, b, what in damaged:
                self._note(wid, (off + a, off + b, what))
            self._offsets[wid] = off + used
            self.tails[wid] = len(data) - used
            if not is_control(wid) and recs:
                end = max(r.res_off + r.res_len for r in recs)
                if end > self.body_end.get(wid, 0):
                    self.body_end[wid] = end
            final = self.final
            counts = self.kind_counts
            track = self.track
            for r in recs:
                if r.count > 1:
                    new += self._add_range(wid, r)
                    continue
                old = final.get(r.task)
                if old is None and not r.flags & (FLAG_DAMAGED | FLAG_RERUN):
                    final[r.task] = (wid, r)
                    counts[r.kind] += 1
                    new += 1
                    if track is not None:
                        track.append(r.task)
                else:
                    new += self._add(r.task, (wid, r), old)
        self.changes += new
        return new

    def retire_tracked(self, keep: Any) -> None:
        """Retire (:meth:`Outcomes.retire`) the tracked tasks not in ``keep`` (those whose
        value is still to be taken); the others stay tracked for a later call."""
        fresh = self.track
        if fresh:
            done = [t for t in fresh if t not in keep]
            self.track = [t for t in fresh if t in keep] if len(done) < len(fresh) else []
            self.final.retire(done)

    def offset(self, wid: str) -> int:
        """Where reading worker ``wid``'s journal goes on: the end of its last whole frame."""
        return self._offsets.get(wid, 0)

    def _note(self, wid: str, span: tuple[int, int, str]) -> None:
        spans = self.damage.setdefault(wid, [])
        if spans and spans[-1][1] == span[0] and span[0] < span[1]:
            spans[-1] = (spans[-1][0], span[1], spans[-1][2])  # one damaged stretch, read in two looks
        else:
            spans.append(span)

    def damage_notes(self) -> list[str]:
        """What is damaged in the journals, one line per journal (empty if nothing)."""
        out = []
        for wid, spans in sorted(self.damage.items()):
            a, b, what = spans[0]
            if len(spans) == 1:
                out.append(f"damaged: journal/{wid}.rec: {b - a} bytes at byte {a} skipped ({what})")
            else:
                total = sum(y - x for x, y, _ in spans)
                out.append(f"damaged: journal/{wid}.rec: {len(spans)} stretches, {total} bytes skipped, "
                           f"the first at byte {a} ({what})")  # fmt: skip
        out += [f"damaged: journal/{wid}.rec is missing" for wid in sorted(self.missing)]
        return out

    def forget(self, tasks: dict[int, int]) -> None:
        """Drop outcomes older than the attempt a retry asked for (``{task: attempt}``),
        so a task being run again counts as queued, not as its old failure."""
        final = self.final
        for t, attempt in tasks.items():
            old = final.get(t)
            if old is not None and old[1].attempt < attempt:
                del final[t]
                self.kind_counts[old[1].kind] -= 1
                self.damaged_tasks.discard(t)


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

    A group's body (a list of values) is kept in ``cache``; a single value's is not. A body
    that is missing, cut or whose checksum does not hold raises
    :class:`~elsewhere.util.errors.DamagedJob` naming the file and the task.
    """
    key = (wid, rec.res_off)
    values = cache.get(key)
    if values is None:
        pickled, bufs = _read_checked(store, wid, rec, task if task is not None else rec.task)
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


def body_damage(store: JobStore, wid: str, rec: Record) -> str | None:
    """What is wrong with the body that ``rec`` points to, or None if it is whole (read and
    checked, not unpickled)."""
    from ..util.errors import DamagedJob

    try:
        _read_checked(store, wid, rec, rec.task)
    except DamagedJob as exc:
        return exc.what
    return None


def _read_checked(store: JobStore, wid: str, rec: Record, task: int) -> tuple[memoryview, list[memoryview]]:
    """The pickle and buffers of the body ``rec`` points to, checked; DamagedJob if not whole."""
    name = f"results/{wid}.bin"
    try:
        fd = os.open(store.results_path(wid), os.O_RDONLY)
    except FileNotFoundError:
        if not os.path.exists(os.path.join(store.dir, "job.json")):
            raise  # the job folder is gone (purged): not damage
        raise _damaged(name, "the file is missing", task) from None
    try:
        buf = bytearray(rec.res_len)
        got = os.preadv(fd, [buf], rec.res_off) if rec.res_len else 0
    finally:
        os.close(fd)
    if got != rec.res_len:
        raise _damaged(name, f"cut short (the file ends at byte {rec.res_off + got}; the result lies at "
                             f"bytes {rec.res_off}..{rec.res_off + rec.res_len})", task)  # fmt: skip
    try:
        return records.unpack_body(buf)
    except ValueError as exc:
        raise _damaged(name, str(exc), task) from None


def _damaged(path: str, what: str, task: int | None) -> Exception:
    from ..util.errors import DamagedJob

    return DamagedJob(path, what, task=task)


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


def finished_by(store: JobStore, wid: str, q: Queue) -> set[int]:
    """The tasks worker ``wid`` wrote an outcome for, of the attempt now due in ``q``: an
    outcome of an earlier attempt (before a retry) is void, so that task is not finished."""
    try:
        with open(store.journal_path(wid), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return set()
    recs, _ = records.parse_frames(data)  # damaged frames skipped: their tasks run again
    return {t for r in recs for t in range(r.task, r.task + r.count)
            if r.attempt >= q.attempt(t) and not r.flags & FLAG_RERUN}  # fmt: skip


def reap(store: JobStore, q: Queue, dead: set[str] | None = None) -> list[str]:
    """Write off the workers of ``q`` that have vanished (caller holds the queue lock).

    A member counts as gone when it is in ``dead`` or, by default, when its
    lock is free. The task it was running is failed as "lost", or put back
    for a retry while its budget lasts; the rest of its claim goes back to
    the queue untouched. A task counts as done only by an outcome of the attempt
    now due (:func:`finished_by`): a task retried and claimed again by the same
    worker is not done by its earlier outcome. Returns the ids of the workers written off.
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
        done = finished_by(store, wid, q)
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

