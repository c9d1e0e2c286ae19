"""A worker's outcomes in its job folder: result bodies, then the journal frames that point
into them (formats in ``folder/records.py``; the files in docs/job-folder.md).

Outcomes of tasks that end within 10 ms of each other are one group: their values are one
pickled list, one result body, and their records one journal frame, written with two system
calls however many tasks the group holds. A flood of tiny tasks that succeeded is one *range*
record (:meth:`ResultWriter.write_range`). A value that cannot be pickled becomes its task's
error (:func:`dump_values`, shared with the peer task process).
"""

from __future__ import annotations

import _thread
import math
import os
import time

from ..folder import records
from ..folder.records import Kind, Record
from ..folder.store import SEVERAL, writev_all
from .kit import open_new
from .runner import TaskOutcome

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ..folder.errorrecord import ErrorRecord
    from ..folder.store import JobStore
    from .kit import FileKit

__all__ = ["LATE_S", "SYNC_S", "ResultWriter", "dump_values", "peak_rss"]

SYNC_S = 0.05
"""Results are fsynced once the oldest of them not yet on disk is this old (and before the
worker waits for work or leaves): see :meth:`ResultWriter.sync_due`."""

LATE_S = 0.0002
"""How long finished outcomes wait for the next task of their group before they are written
on their own (a thread in the worker writes them while that task runs)."""


class _LateWriter:
    """The thread that writes a :class:`ResultWriter`'s outcomes while its worker's task runs
    (see :meth:`ResultWriter.begin_task`): one for the life of the process, serving the writer
    whose task began last, so that a worker's jobs after its first start no thread. (threading
    itself is imported only once a thread is needed: a worker starts faster without it.)"""

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.wake: Any = None  # a threading.Condition of ``lock``, made with the thread
        self.writer: ResultWriter | None = None  # the writer served
        self.waits_until = 0.0  # when the thread wakes (monotonic; inf: when woken)

    def start(self) -> None:
        import threading

        self.wake = threading.Condition(self.lock)
        threading.Thread(target=self._run, name="elsewhere-late-writer", daemon=True).start()

    def _run(self) -> None:
        wake = self.wake
        with self.lock:
            while True:
                w = self.writer
                if w is None or not w.in_task or w.stuck or not (w.pending or w.unsynced):
                    self.waits_until = math.inf
                    wake.wait()  # until a task begins
                    continue
                delay = w.due - time.monotonic() if w.pending else SYNC_S
                if w.unsynced:
                    delay = min(delay, w.dirty_since + SYNC_S - time.time())
                if delay > 0:
                    self.waits_until = time.monotonic() + delay
                    wake.wait(delay)
                    continue
                try:  # the task runs on: the worker's thread does not write meanwhile
                    w.flush(sync=not w.pending or w.sync_due(time.time()))
                except OSError:
                    w.stuck = True  # the worker's own write after the task meets it again, and says so


def _after_fork() -> None:
    global _late
    _late = _LateWriter()  # a forked child has none of its parent's threads (nor its lock's state)


_late = _LateWriter()
os.register_at_fork(after_in_child=_after_fork)


class ResultWriter:
    """Worker ``wid``'s results and journal in job ``store`` (their only writer).

    ``pending`` holds the outcomes not written yet (in task order); :meth:`flush` writes them
    as one group. ``error`` makes the error record of a task whose value cannot be pickled;
    ``charge(i)`` names task ``i`` in the worker's map while its value is pickled, and returns
    what puts the map back (``TaskRunner.charge``).
    """

    def __init__(self, store: JobStore, wid: str, error: Callable[[BaseException, int], ErrorRecord], *,
                 tell_at_end: bool = False, charge: Callable[[int], Callable[[], None]] | None = None,
                 kit: FileKit | None = None) -> None:  # fmt: skip
        self.store = store
        self.error = error
        self.charge = charge
        # Its client waits for the job's end alone (ew.map): woken once this worker's part is
        # written (tell_client), not at every group of results (it looks every 0.1 s anyway)
        self.tell_at_end = tell_at_end
        self.untold = False  # results written that its client was not woken for
        self.res_fd = open_new(kit, "results", store.results_path(wid))  # (the kit's: see run/kit.py)
        self.jfd = open_new(kit, "journal", store.journal_path(wid))
        self.res_end = os.fstat(self.res_fd).st_size
        self.j_end = os.fstat(self.jfd).st_size
        self.pending: list[TaskOutcome] = []
        self.rerun: set[tuple[int, int]] = set()  # (task, attempt) of pending errors run again
        self.last_flush = time.time()
        self.unsynced = False  # written since the last fsync
        self.dirty_since = 0.0  # when the oldest of those was written (unix time)
        # The late writer (see begin_task): while the worker's task runs, its thread writes the
        # outcomes pending and fsyncs what is written; the worker's thread does otherwise.
        # ``in_task`` says which (under the late writer's lock).
        self.in_task = False
        self.due = 0.0
        self.stuck = False  # the late writer's last write failed: it waits for the next task

    def close(self) -> None:
        late = _late
        with late.lock:
            if late.writer is self:
                late.writer = None  # the late writer waits for the next task, of another job
        for fd in (self.res_fd, self.jfd):
            os.close(fd)

    def sync_due(self, now: float) -> bool:
        """Whether the next flush should fsync: results written and not synced are
        :data:`SYNC_S` old. (A result written after a pause is not synced at once: its client
        hears of it first, and the fsync follows within ``SYNC_S``, or when the worker waits.)"""
        return self.unsynced and now - self.dirty_since > SYNC_S

    def _dirty(self) -> None:
        if not self.unsynced:
            self.unsynced = True
            self.dirty_since = time.time()

    def begin_task(self) -> None:
        """A task starts while outcomes wait to be written (grouped with those to come) or
        results written are not on disk yet. Should it run longer than ``LATE_S``, the outcomes
        are written meanwhile, by the late writer's thread, so that a finished result never
        waits for the task after it; should it run until those results are ``SYNC_S`` old, they
        are fsynced meanwhile, so that a long task never keeps them off the disk."""
        late = _late
        with late.lock:
            self.in_task = True
            self.stuck = False
            self.due = time.monotonic() + LATE_S
            if late.wake is None:
                late.start()
            if late.writer is not self:
                late.writer = self
                late.wake.notify()
            elif late.waits_until > (self.due if self.pending else time.monotonic() + SYNC_S):
                late.wake.notify()  # (a thread woken for every task costs a context switch each)

    def end_task(self) -> None:
        """The task begun ends: the worker's thread writes again (after the late writer's
        write, if one is under way)."""
        with _late.lock:
            self.in_task = False

    def _charge(self, index: int) -> Callable[[], None] | None:
        """While values are pickled on the worker's thread, a death costs task ``index``, the
        one pickled alone, or none (:data:`SEVERAL`, which a watcher of a worker given its
        tasks reads as a task's doing, see ``run/supervise.py``): the tasks of a group go
        back to the queue, and come back one by one (a claim of tasks run again:
        ``JobRun._run_each``), each pickled alone, so that the one whose value kills its
        worker is found, and no other is charged. (The late writer's writes, while a task
        runs, leave the map to that task.)"""
        return self.charge(index) if self.charge is not None and not self.in_task else None

    def _append_body(self, data: bytes, bufs: list[memoryview]) -> tuple[int, int]:
        """Write one result body; its (offset, size)."""
        parts = records.pack_body(data, bufs)
        size = records.body_size(parts)
        off = self.res_end
        try:
            writev_all(self.res_fd, parts)
        except BaseException:
            _cut(self.res_fd, off)
            raise
        self.res_end += size
        return off, size

    def append_frame(self, recs: list[Record]) -> None:
        """Write one journal frame of ``recs``, whole or not at all.

        A write that fails (a full disk: the write of a body or a frame torn in its middle)
        leaves nothing of itself in the file: it is cut back to where it began. Else the
        next body would go after the torn bytes (the files are appended to) while its records
        point where the torn one began (``res_end``): a result the journal says is there, read
        as damaged, when the disk has room again before this worker writes next (another
        worker cut its own torn write meanwhile, or this worker's late writer failed where
        its own thread then succeeds)."""
        frame = records.pack_frame(recs)
        try:
            writev_all(self.jfd, [frame])  # (a short write: the next says why)
        except BaseException:
            _cut(self.jfd, self.j_end)
            raise
        self.j_end += len(frame)

    def flush(self, sync: bool = True) -> None:
        """Write the pending outcomes: their body, then their journal frame; fsync if ``sync``."""
        pending = self.pending
        if not pending:
            if sync and self.unsynced:
                os.fsync(self.res_fd)
                os.fsync(self.jfd)
                self.unsynced = False
            return
        values = [o.value for o in pending]
        back = self._charge(pending[0].index if len(pending) == 1 else SEVERAL)
        try:
            data, bufs, bad = dump_values(values, lambda k, exc: self.error(exc, pending[k].index))
        finally:
            if back is not None:
                back()
        for k in bad:
            pending[k] = pending[k]._replace(ok=False, value=values[k])
        off, size = self._append_body(data, bufs)
        rss = peak_rss()
        ok_kind, err_kind = int(Kind.OK), int(Kind.ERROR)
        recs = [
            Record(ok_kind if o.ok else err_kind, 0, o.attempt, o.index, item, 1, off, size, o.log_off, o.log_len,
                   o.t_start, o.t_end, rss, o.seed)
            for item, o in enumerate(pending)
        ]  # fmt: skip
        rerun = self.rerun
        if rerun:  # errors run again (retries=ew.Retry): flagged, never the task's outcome
            flag = records.FLAG_RERUN
            recs = [r._replace(flags=r.flags | flag) if (r.task, r.attempt) in rerun else r for r in recs]
            rerun.difference_update((o.index, o.attempt) for o in pending)
        if sync:
            os.fsync(self.res_fd)  # a frame that reaches the disk finds its body there
        self.append_frame(recs)
        pending.clear()
        self.last_flush = time.time()
        # The client reads the frame from the page cache: it hears of it before the journal's
        # fsync, which is the worker's own business (a crash before it: the tasks run again)
        self._written()
        if sync:
            os.fsync(self.jfd)
            self.unsynced = False
        else:
            self._dirty()

    def write_range(self, start: int, values: list[Any], t0: float, t1: float, log_off: int, log_len: int,
                    seed: int) -> None:  # fmt: skip
        """Tasks ``start .. start+len(values)-1`` all succeeded, from ``t0`` to ``t1``, seeded
        from ``seed`` on, their output the byte range given: one body, one range record."""
        self.flush(sync=False)  # the journal stays in task order
        from ..folder import serial

        back = self._charge(start if len(values) == 1 else SEVERAL)
        try:
            data, bufs = serial.dumps_plain(values)
        except BaseException:
            # some value cannot be pickled: record them one by one instead
            self.pending.extend(
                TaskOutcome(start + k, 0, True, v, t0, t1, log_off, 0, seed + k, 0.0) for k, v in enumerate(values)
            )
            return
        finally:
            if back is not None:
                back()
        off, size = self._append_body(data, bufs)
        rec = Record(int(Kind.OK), 0, 0, start, 0, len(values), off, size, log_off, log_len, t0, t1, peak_rss(),
                     seed)  # fmt: skip
        self.append_frame([rec])
        self._dirty()
        self.last_flush = t1
        self._written()

    def _written(self) -> None:
        if self.tell_at_end:
            self.untold = True
        else:
            self.store.notify()

    def tell_client(self) -> None:
        """This worker's part is written (or it waits): wake a client told nothing of it yet."""
        if self.untold:
            self.untold = False
            self.store.notify()


def _cut(fd: int, size: int) -> None:
    """Cut the file ``fd`` back to ``size`` bytes, if it can be (the error that brought us here
    is the one to raise)."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass


def dump_values(values: list[Any], error_of: Callable[[int, BaseException], ErrorRecord]
                ) -> tuple[bytes, list[memoryview], list[int]]:  # fmt: skip
    """``values`` pickled together as one list (large buffers out of band), and the positions
    of those that could not be: each is replaced, in ``values`` too, by the stored form of
    ``error_of(position, exception)``, explained."""
    from ..folder import serial

    try:
        data, bufs = serial.dumps_plain(values)
        return data, bufs, []
    except BaseException:  # a value's __reduce__ may even call sys.exit: its task's error
        pass
    bad = []
    for k, value in enumerate(values):
        try:
            serial.dumps_plain(value)
        except BaseException as exc:
            err = error_of(k, exc)
            values[k] = err.explained(f"the result of task {err.index} cannot be serialised").to_value()
            bad.append(k)
    data, bufs = serial.dumps_plain(values)
    return data, bufs, bad


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
