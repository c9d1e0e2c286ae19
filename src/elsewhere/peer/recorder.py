"""The recorder: makes a controller's results durable in the job folder, off its loop.

The controller thread hands each RESULT's groups to the recorder and carries on
(placing the next task, resolving an Executor's future from the values it
holds); the recorder thread writes them, syncs, and only then hands the
acknowledgements back, so a worker forgets a result only once it is on disk::

    controller thread ── record(writer, groups, ack) ──> recorder thread
                                                           write bodies + journal records
                                                           fsync (once for all it took)
                                                           notify the job's waiters
    controller thread <── done(acks, buffers) + wake ────────┘
                          send ACK; the buffers may be reused

Writes that arrive while a sync runs are taken together: one fsync per writer
for all of them (group commit), so many small results cost one sync.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..folder import records
from ..folder.journal import OutcomeWriter
from ..folder.store import JobStore, writev_all

__all__ = ["GroupWriter", "Recorder"]

log = logging.getLogger(__name__)

Row = tuple[int, bool, int, int, bytes, float, float, int, int, int, int]
"""(task, ok, item, attempt, log, t_start, t_end, peak_rss, seed, flags, count) of one task in
a group (``flags``: the journal record's, ``records.FLAG_RERUN`` for an error run again), or,
with ``count`` > 1, of a run of successes without output of consecutive tasks (``task``,
``task + 1``...) held by consecutive items (``item``...), with seeds ``seed``, ``seed + 1``...
that ran between ``t_start`` and ``t_end``: a worker reports those as one entry."""


RANGE_SPAN_S = 0.01
"""Successes of consecutive tasks that ran within this span, with no output, are one range
record (as the local workers write them): the reader takes one entry for them all."""


class GroupWriter(OutcomeWriter):
    """An :class:`OutcomeWriter` that also writes a *group*: one result body holding the
    pickled list of several tasks' values, and one journal record per task pointing at
    its item (the format of the local worker's bodies: read once, not once per task); a
    run of tiny successes of consecutive tasks is one range record (:data:`RANGE_SPAN_S`),
    which keeps their span's times and the largest peak memory, not each task's."""

    def write_group(self, pickled: Any, buffers: list[Any], rows: list[Row]) -> None:
        """Append a body and its records. Not fsynced: the caller syncs before acknowledging."""
        parts = records.pack_body(bytes(pickled), [memoryview(b).cast("B") for b in buffers])
        size = records.body_size(parts)
        off = self.res_end
        writev_all(self.res_fd, parts)
        self.res_end += size
        logs = [r[4] for r in rows if r[4]]
        log_off = self.log_end
        if logs:
            writev_all(self.log_fd, logs)  # type: ignore[arg-type]
            self.log_end += sum(len(x) for x in logs)
        ok_kind, err_kind = int(records.Kind.OK), int(records.Kind.ERROR)
        recs = []
        i, n = 0, len(rows)
        while i < n:
            task, ok, item, attempt, log_bytes, t0, t1, rss, seed, flags, count = rows[i]
            j = i + 1
            if ok and not flags and not log_bytes:
                while j < n:
                    r = rows[j]
                    if not (r[1] and not r[9] and not r[4] and r[0] == task + count and r[2] == item + count
                            and r[3] == attempt and r[8] == seed + count and r[6] - t0 <= RANGE_SPAN_S):  # fmt: skip
                        break
                    t1, rss = max(t1, r[6]), max(rss, r[7])
                    count += r[10]
                    j += 1
            recs.append(records.Record(
                kind=ok_kind if ok else err_kind, flags=flags, attempt=attempt, task=task, item=item,
                count=count, res_off=off, res_len=size, log_off=log_off, log_len=len(log_bytes),
                t_start=t0, t_end=t1, peak_rss=rss, seed=seed,
            ))  # fmt: skip
            log_off += len(log_bytes)
            i = j
        os.write(self.jfd, records.pack_frame(recs))

    _log_synced = -1  # the output file's end at the last sync (-1: none yet)

    def sync(self) -> None:
        """Make everything written so far durable. The tasks' output file only if it grew
        (most tasks print nothing): an fsync with nothing new to write still costs a third of
        one that has (24 against 75 us on the ext4 disk of the machine that measures bench/)."""
        fds = [self.res_fd, self.jfd]
        if self.log_end != self._log_synced:
            fds.append(self.log_fd)
            self._log_synced = self.log_end
        for fd in fds:
            with contextlib.suppress(OSError):
                os.fsync(fd)


class Recorder:
    """A thread that writes results to the job folder and syncs them (see the module doc).

    ``done(acks, buffers)`` is called from the recorder thread once what was handed
    in is durable (or failed to be written: logged, and acknowledged anyway only if
    written); it must be quick and thread-safe (the controller queues and wakes).
    """

    def __init__(self, store: JobStore, done: Callable[[list[Any], list[Any]], None]) -> None:
        self.store = store
        self._done = done
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._outstanding = 0
        self.backlog_bytes = 0  # of the buffers handed in, not yet written and synced
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="elsewhere-peer-recorder", daemon=True)
        self._thread.start()

    def record(self, writer: GroupWriter, groups: list[tuple[Any, list[Any], list[Row]]],
               ack: Any, buffers: tuple[Any, ...]) -> None:  # fmt: skip
        """Write ``groups`` (pickled values, out-of-band buffers, rows) with ``writer``; then
        report ``ack`` and ``buffers`` (which the caller must not reuse until then) as done."""
        self.record_many([(writer, groups, ack, buffers)])

    def record_many(self, items: list[tuple[GroupWriter, list[tuple[Any, list[Any], list[Row]]], Any,
                                            tuple[Any, ...]]]) -> None:  # fmt: skip
        """:meth:`record` for several results at once (one wake-up of the thread)."""
        size = sum(_nbytes(b) for item in items for b in item[3])
        with self._idle:
            self._outstanding += len(items)
            self.backlog_bytes += size
        self._queue.put((items, size))

    @property
    def outstanding(self) -> int:
        """How many handed-in results are not yet reported done."""
        return self._outstanding

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until everything handed in so far is durable and reported done."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish what was handed in, then end the thread."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            got = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    got.append(self._queue.get_nowait())
            if got[-1] is None:
                stopping = True
            items = [it for many in got if many is not None for it in many[0]]
            size = sum(many[1] for many in got if many is not None)
            if not items:
                continue
            acks: list[Any] = []
            buffers: list[Any] = []
            writers: dict[int, GroupWriter] = {}
            for writer, groups, ack, bufs in items:
                try:
                    for pickled, oob, rows in groups:
                        writer.write_group(pickled, oob, rows)
                except OSError as exc:  # the job folder is gone (purged) or full: not acknowledged
                    self.error = exc
                    log.warning("cannot store a result in the job folder: %s", exc)
                else:
                    writers[id(writer)] = writer
                    if ack is not None:
                        acks.append(ack)
                buffers.extend(bufs)
            for writer in writers.values():
                writer.sync()
            self.store.notify()
            try:
                self._done(acks, buffers)
            finally:
                with self._idle:
                    self._outstanding -= len(items)
                    self.backlog_bytes -= size
                    self._idle.notify_all()


def _nbytes(b: Any) -> int:
    try:
        return memoryview(b).nbytes
    except TypeError:
        return 0
