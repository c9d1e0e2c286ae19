"""The controller's results: from a worker's RESULT to the job folder, and the ACK back.

A RESULT carries the outcomes of the tasks of one batch that ended together
(see "Layout of TASK and RESULT" in docs/peer.md). Each outcome is, by its fate
(:class:`~.child.Outcome`): a value or an error, stored; an error of a type the
job's ``retries=ew.Retry(on=...)`` runs again, stored flagged (not the task's
outcome) and placed again once its wait is over (:meth:`~.retries.Retries._rerun_later`);
a task lost with its process, run again while the job's ``retries`` last, then
written off; a task handed back, placed again. Duplicates (a task that ran twice) are dropped: the
first result is the one stored.

The values go to an open Executor at once (``on_outcome``, called once the
turn's lock is released and its frames are sent), from the buffers just
received; the pickles go to the :class:`~.recorder.Recorder`, handed over every
``_ACK_S`` rather than one by one, which writes and syncs them off the loop.
Only once they are durable does the loop acknowledge them (:meth:`~Results._send_acks`,
one ACK for many where the worker reads ``ack-many``), and may the buffers they
arrived in take the next results.
"""

from __future__ import annotations

import itertools
import logging
import queue
import time
from typing import Any

from ..folder.records import FLAG_RERUN
from .childmsg import Outcome
from .controlstate import ControllerState
from .messages import MAX_ACKS, Ack, Result
from .placement import Worker
from .recorder import GroupWriter

__all__ = ["Results"]

log = logging.getLogger("elsewhere.peer.controller")  # the controller's log, whichever part writes

_ACK_S = 0.02
"""How soon the loop looks for results the recorder made durable, to acknowledge them."""

_OK, _ERROR, _LOST, _REQUEUE = int(Outcome.OK), int(Outcome.ERROR), int(Outcome.LOST), int(Outcome.REQUEUE)
_KNOWN = frozenset(int(o) for o in Outcome)


class Results(ControllerState):
    """What :class:`~.controller.Controller` does with RESULTs (see the module doc)."""

    def _on_result(self, w: Worker, msg: Result, buffers: tuple[Any, ...]) -> None:
        info = msg.info
        b = self.batches.get(msg.task_id)
        if b is not None:
            self._forget(b)
        try:
            self._store_items(w, msg.task_id, info, buffers)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            log.warning("malformed RESULT from %s: %s", w.host, exc)
            self._disconnected(w, f"malformed RESULT: {exc}")
            return
        if b is not None and b.indices and self.final.gaps(min(b.indices), max(b.indices) + 1):
            # (only when some did not end: one look at the final runs between its first and last)
            for i, a in zip(b.indices, b.attempts):  # tasks a worker did not report: place again
                if i not in self.final and i not in self.cancelled and not self.inflight.get(i) and i not in self.later:
                    if i not in self.pending:
                        self.pending.appendleft(i)
                    self.attempts.setdefault(i, a)

    def _store_items(self, w: Worker, bid: str, info: dict[str, Any], buffers: tuple[Any, ...]) -> None:
        """Hand a RESULT's outcomes to the Executor (if any) and to the recorder, which
        writes them to the job folder; the worker is acknowledged once they are durable."""
        pickles = memoryview(buffers[0]).cast("B")
        logs = memoryview(buffers[1]).cast("B")
        nbytes = sum(memoryview(b).nbytes for b in buffers)
        self.stats["result_bytes"] += nbytes
        groups: list[tuple[memoryview, list[Any]]] = []
        ppos, opos = 0, 2
        for plen, noob in info.get("groups", []):
            groups.append((pickles[ppos : ppos + plen], list(buffers[opos : opos + noob])))
            ppos, opos = ppos + plen, opos + noob
        items = info["items"]
        runs = info.get("runs") or ()
        ntasks = len(items) + sum(int(r[1]) for r in runs)
        if ntasks and info.get("seconds"):
            per_task = float(info["seconds"]) / ntasks
            self.mean_s = per_task if not self.n_measured else 0.7 * self.mean_s + 0.3 * per_task
            self.n_measured += ntasks
        if ntasks:  # batches are sized to bring back at most placement.BATCH_BYTES
            per_task = nbytes / ntasks
            mean = self.result_bytes_per_task
            self.result_bytes_per_task = per_task if not mean else 0.7 * mean + 0.3 * per_task
        lpos = 0
        rows: dict[int, list[tuple[Any, ...]]] = {}  # group -> rows to write
        final, cancelled, n = self.final, self.cancelled, self.n
        seed0 = int(self.seed) if self.seed is not None else None
        done: dict[int, None] = {}  # the tasks whose outcome this is, in order (finalised together, below)
        # none of them ended before (the usual case): no lookup per task below (duplicates
        # within the RESULT are still caught by ``done``)
        clean = not self._ended_among([it[0] for it in items])
        ran: list[int] = []  # the tasks of its runs (finalised with ``done``'s)
        if runs:
            items, clean = self._store_runs(runs, items, groups, rows, ran, clean and seed0 is not None)
        rerun = self.rerun_spec is not None
        last_group, dest = None, None  # (the rows of the group of the item before: the same, mostly)
        for index, attempt, status, group, item, t0, t1, rss, log_len in items:
            index, attempt, status = int(index), int(attempt), int(status)
            if status not in _KNOWN:
                raise ValueError(f"task {index}: no outcome is numbered {status}")
            if log_len:
                log_bytes = bytes(logs[lpos : lpos + log_len])
                lpos += log_len
            else:
                log_bytes = b""
            if (not clean and (index in final or index in cancelled)) or not 0 <= index < n or index in done:
                self.stats["duplicates"] += 1
                continue
            if status == _REQUEUE:
                self._requeue(index)
                continue
            if status == _LOST:
                self.lost_count[index] = self.lost_count.get(index, 0) + 1
                if self.lost_count[index] <= self.retries:
                    self.attempts[index] = attempt + 1
                    self._requeue(index)
                    continue
                self._write_lost(w, index, attempt, groups[group][0], log_bytes, t0, t1)
                continue
            flags = 0
            if status == _ERROR and rerun and self._rerun_later(index, attempt, groups[int(group)], int(item)):
                flags = FLAG_RERUN  # written, not the task's outcome: it runs again
            if group != last_group or dest is None:
                last_group, dest = group, rows.setdefault(int(group), [])
            dest.append((index, status == _OK, int(item), attempt, log_bytes, t0, t1, int(rss),
                         seed0 + index if seed0 is not None else 0, flags, 1))  # fmt: skip
            if not flags:
                done[index] = None
        finished = [*ran, *done] if ran else list(done)
        if finished:
            self._finalise_all(finished)
        if self.on_outcome is not None:
            self._hand_out(groups, rows)
        if self.alone:
            self.alone = {i for i in self.alone if i not in self.final}
        if "alone" in info:  # their task process died working for them together: each alone now
            self.alone.update(i for i in map(int, info["alone"]) if 0 <= i < n)
        if w.writer is None:
            if not w.wid:
                w.wid = f"peer-x-{w.peer_id[:8]}-{self.short}"
                self._write_worker_info(w)
            w.writer = GroupWriter(self.store, w.wid)
        parts = [(groups[g][0], groups[g][1], group_rows) for g, group_rows in rows.items()]
        if not self.to_record:
            self.first_to_record = time.monotonic()
        self.to_record.append((w.writer, parts, (w, bid, finished), buffers))

    def _store_runs(self, runs: Any, items: list[Any], groups: list[tuple[memoryview, list[Any]]],
                    rows: dict[int, list[tuple[Any, ...]]], ran: list[int], clean: bool) -> tuple[list[Any], bool]:  # fmt: skip
        """A RESULT's runs (``[first, count, attempt, group, item, t0, t1, rss]``: tasks
        ``first``... ``first + count - 1``, successes without output, their values the
        group's items ``item``...) go to ``rows`` as one row each, their tasks to ``ran``
        (``clean``: none of the RESULT's other tasks ended before). Returns the items left
        to store one by one, and whether they are clean still: all of them, the runs' tasks
        too, and not clean, when a run is not the usual case (one of its tasks ended before
        or is in the RESULT twice; a job without seed)."""
        n, ngroups = self.n, len(groups)
        spans: list[tuple[int, int]] = []
        for first, count, attempt, group, item, _t0, _t1, _rss in runs:
            first, count, group, item = int(first), int(count), int(group), int(item)
            if count < 1 or first < 0 or first + count > n or not 0 <= group < ngroups or item < 0 or int(attempt) < 0:
                raise ValueError(f"a run of {count} tasks from task {first} (group {group}, item {item}) "
                                 f"is not one of this job's {n} tasks")  # fmt: skip
            spans.append((first, first + count))
        if clean:
            final, cancelled = self.final, self.cancelled
            clean = not any((final and final.overlaps(a, b)) or (cancelled and not cancelled.isdisjoint(range(a, b)))
                            for a, b in spans)  # fmt: skip
            spans += [(int(it[0]), int(it[0]) + 1) for it in items]
            spans.sort()
            clean = clean and all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        if not clean:  # one by one, as rows (the usual path's checks catch what is amiss)
            ok = int(Outcome.OK)
            return [*items, *([int(first) + k, attempt, ok, group, int(item) + k, t0, t1, rss, 0]
                              for first, count, attempt, group, item, t0, t1, rss in runs
                              for k in range(int(count)))], False  # fmt: skip
        seed0 = int(self.seed or 0)  # (not None: see ``clean``)
        for first, count, attempt, group, item, t0, t1, rss in runs:
            first, count = int(first), int(count)
            rows.setdefault(int(group), []).append(
                (first, True, int(item), int(attempt), b"", t0, t1, int(rss), seed0 + first, 0, count))
            ran += range(first, first + count)
        return items, True

    def _hand_out(self, groups: list[tuple[memoryview, list[Any]]],
                  rows: dict[int, list[tuple[Any, ...]]]) -> None:  # fmt: skip
        """Give the Executor each finished task's value from the buffers just received
        (no copy; the buffers are not reused while the values hold them). A value that
        cannot be unpickled here is left to the Executor's reading of the job folder."""
        from ..folder import serial

        for group, group_rows in rows.items():
            pickled, oob = groups[group]
            try:
                values = serial.loads(pickled, oob)
            except BaseException as exc:  # even a SystemExit from a value's loading: not the loop's
                log.debug("a result is read back from the job folder: %s", exc)
                continue
            for index, ok, item, *_rest, seed, flags, count in group_rows:
                if count > 1:  # a run: successes of consecutive tasks
                    self.outcomes += [(index + k, ok, values[item + k], seed + k) for k in range(count)]
                elif not flags:  # (an error run again is no outcome)
                    self.outcomes.append((index, ok, values[item], seed))

    def _deliver_outcomes(self) -> None:
        """Hand the values of this turn to the Executor, once the turn's lock is released and
        its frames are sent: the thread a value wakes may then place its next task at once."""
        with self._state:  # (the loop's thread and a caller's in Controller.wait_for hand out)
            outcomes, self.outcomes = self.outcomes, []
        for index, ok, value, seed in outcomes:
            try:
                self.on_outcome(index, ok, value, seed)
            except BaseException:
                log.exception("the Executor's result callback failed")

    def _on_durable(self, acks: list[Any], buffers: list[Any]) -> None:
        # The recorder thread: what it wrote is durable. The loop sends the ACKs at its next
        # turn (at most _ACK_S later): waking it for each would cost more than the wait.
        self.durable.put((acks, buffers))

    def _send_acks(self, *, wait: bool = False) -> None:
        """Acknowledge the results the recorder made durable (all of them, with ``wait``);
        their buffers may then take the next results (once nothing else holds them)."""
        if self.recorder is not None and self.to_record and (
                wait or time.monotonic() - self.first_to_record >= _ACK_S):  # fmt: skip
            # handed over every few milliseconds, not per result: each hand-over wakes a thread
            self.recorder.record_many(self.to_record)
            self.to_record = []
        if wait and self.recorder is not None:
            self.recorder.wait_idle()
        while True:
            try:
                acks, buffers = self.durable.get_nowait()
            except queue.Empty:
                return
            by_worker: dict[Worker, list[str]] = {}
            with self.lock:
                written = self.written
                for w, bid, done in acks:
                    by_worker.setdefault(w, []).append(bid)
                    written.update(done)  # (a run at a time)
            for w, bids in by_worker.items():
                peer = w.conn.peer if w.conn is not None else None
                if peer is not None and "ack-many" in peer.caps:  # one frame for them all
                    for i in range(0, len(bids), MAX_ACKS):
                        self._send(w, Ack.made(bids[i], tuple(bids[i + 1 : i + MAX_ACKS])), flush=False)
                else:
                    for bid in bids:
                        self._send(w, Ack(bid), flush=False)  # they leave with the next frame
            for buf in buffers:
                self.buffers.free(buf)
