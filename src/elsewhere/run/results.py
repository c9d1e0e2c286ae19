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
import os
import time

from ..folder import records
from ..folder.records import Kind, Record
from ..folder.store import writev_all
from .runner import TaskOutcome

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ..folder.errorrecord import ErrorRecord
    from ..folder.store import JobStore

__all__ = ["LATE_S", "ResultWriter", "dump_values", "peak_rss"]

LATE_S = 0.0002
"""How long finished outcomes wait for the next task of their group before they are written
on their own (a thread in the worker writes them while that task runs)."""


class ResultWriter:
    """Worker ``wid``'s results and journal in job ``store`` (their only writer).

    ``pending`` holds the outcomes not written yet (in task order); :meth:`flush` writes them
    as one group. ``error`` makes the error record of a task whose value cannot be pickled.
    """

    def __init__(self, store: JobStore, wid: str, error: Callable[[BaseException, int], ErrorRecord]) -> None:
        self.store = store
        self.error = error
        self.res_fd = os.open(store.results_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.res_end = os.fstat(self.res_fd).st_size
        self.jfd = os.open(store.journal_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.pending: list[TaskOutcome] = []
        self.rerun: set[tuple[int, int]] = set()  # (task, attempt) of pending errors run again
        self.last_flush = self.last_sync = time.time()
        self.unsynced = False  # written since the last fsync
        # The late writer (see begin_task): pending outcomes are written by its thread while
        # the worker's task runs, by the worker's thread otherwise; ``in_task`` says which.
        self.lock = _thread.allocate_lock()  # (threading itself only once a thread is needed:
        self.in_task = False  # a worker starts faster without it)
        self.due = 0.0
        self.armed: Any = None  # a threading.Event, made with the thread when first needed
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self.armed is not None:
                self.armed.set()  # the late writer ends
        for fd in (self.res_fd, self.jfd):
            os.close(fd)

    def begin_task(self) -> None:
        """A task starts while outcomes wait to be written (grouped with those to come): should
        it run longer than ``LATE_S``, they are written meanwhile, by the late writer's thread,
        so that a finished result never waits for the task after it."""
        with self.lock:
            self.in_task = True
            self.due = time.monotonic() + LATE_S
            armed = self.armed
            if armed is None:
                import threading

                armed = self.armed = threading.Event()
                threading.Thread(target=self._late_writer, name="elsewhere-late-writer", daemon=True).start()
            armed.set()

    def end_task(self) -> None:
        """The task begun ends: the worker's thread writes again (after the late writer's
        write, if one is under way)."""
        with self.lock:
            self.in_task = False

    def _late_writer(self) -> None:
        armed = self.armed
        assert armed is not None
        while True:
            armed.wait()
            while True:
                with self.lock:
                    if self.closed:
                        return
                    if not self.in_task or not self.pending:
                        armed.clear()
                        break
                    delay = self.due - time.monotonic()
                    if delay <= 0:
                        try:
                            self.flush(sync=False)  # the task runs on: the worker's thread does not write
                        except OSError:
                            pass  # the worker's own write after the task meets it again, and says so
                        armed.clear()
                        break
                time.sleep(delay)

    def _append_body(self, data: bytes, bufs: list[memoryview]) -> tuple[int, int]:
        """Write one result body; its (offset, size)."""
        parts = records.pack_body(data, bufs)
        size = records.body_size(parts)
        off = self.res_end
        writev_all(self.res_fd, parts)
        self.res_end += size
        return off, size

    def flush(self, sync: bool = True) -> None:
        """Write the pending outcomes: their body, then their journal frame; fsync if ``sync``."""
        pending = self.pending
        if not pending:
            if sync and self.unsynced:
                os.fsync(self.res_fd)
                os.fsync(self.jfd)
                self.unsynced = False
                self.last_sync = time.time()
            return
        values = [o.value for o in pending]
        data, bufs, bad = dump_values(values, lambda k, exc: self.error(exc, pending[k].index))
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
            os.fsync(self.res_fd)
        os.write(self.jfd, records.pack_frame(recs))
        if sync:
            os.fsync(self.jfd)
        self.unsynced = not sync
        pending.clear()
        self.last_flush = time.time()
        if sync:
            self.last_sync = self.last_flush
        self.store.notify()

    def write_range(self, start: int, values: list[Any], t0: float, t1: float, log_off: int, log_len: int,
                    seed: int) -> None:  # fmt: skip
        """Tasks ``start .. start+len(values)-1`` all succeeded, from ``t0`` to ``t1``, seeded
        from ``seed`` on, their output the byte range given: one body, one range record."""
        self.flush(sync=False)  # the journal stays in task order
        from ..folder import serial

        try:
            data, bufs = serial.dumps_plain(values)
        except BaseException:
            # some value cannot be pickled: record them one by one instead
            self.pending.extend(
                TaskOutcome(start + k, 0, True, v, t0, t1, log_off, 0, seed + k, 0.0) for k, v in enumerate(values)
            )
            return
        off, size = self._append_body(data, bufs)
        rec = Record(int(Kind.OK), 0, 0, start, 0, len(values), off, size, log_off, log_len, t0, t1, peak_rss(),
                     seed)  # fmt: skip
        os.write(self.jfd, records.pack_frame([rec]))
        self.unsynced = True
        self.last_flush = t1
        self.store.notify()


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
