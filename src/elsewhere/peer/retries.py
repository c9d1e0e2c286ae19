"""The controller's second chances: tasks placed again, run twice, or given up.

What the timers of the loop notice every 50 ms (:meth:`~Retries._timers`): an
ASK not admitted in time moves to a worker that sits idle (or after
``start_timeout_s``); a batch that runs far past its expected time (twice
``time=`` + 5 s, or 20 times the measured mean and at least 30 s) runs on
another worker too, the first result winning; a standing admission left unused
gives its slot back. A batch taken back from its worker (refused, its
connection broken, its worker lost: :meth:`~Retries._unplace`) puts its
unfinished tasks back at the front of the queue, and a task whose worker
vanished more than ``MAX_RESUBMITS`` times is written off as lost, as is one
whose process crashed more often than the job's ``retries`` allow, and one
that cannot even be sent.
"""

from __future__ import annotations

import logging
import pickle
import socket
import time
from typing import Any

from .controlstate import ControllerState
from .placement import Batch, Worker

__all__ = ["MAX_RESUBMITS", "Retries"]

log = logging.getLogger("elsewhere.peer.controller")  # the controller's log, whichever part writes

MAX_RESUBMITS = 5
"""How often one task is placed again because its worker vanished (not its own fault)."""


class Retries(ControllerState):
    """How :class:`~.controller.Controller` places tasks again or gives them up (see the
    module doc)."""

    def _timers(self, now: float) -> None:
        if self.later:
            for i in [i for i, due in self.later.items() if due <= now]:
                del self.later[i]
                if i not in self.final and i not in self.cancelled and i not in self.pending:
                    self.pending.appendleft(i)
        s = self.settings
        spare = sum(1 for w in self.workers.values() if w.spare(s))  # idle, by their announcements
        for b in list(self.batches.values()):
            w = b.worker
            if b.standing:
                if b.accepted and now - b.accepted > 1.0:  # unused: give the slot back a while
                    self._withdraw(b)
                    self.standing_after = now + 1.0
                continue
            if not b.sent:
                # Not admitted yet: it waits behind busy slots there. Move it when a worker
                # sits idle (soon: one batch for each, the oldest), or when it waited too long.
                waited = now - b.asked
                late = waited > s.start_timeout_s or (spare and waited > 0.25)
                if late and not b.withdrawn and len(self.workers) > 1:
                    tasks = list(b.indices)
                    self._withdraw(b)  # not admitted in time: try elsewhere
                    for i in reversed(tasks):
                        if i not in self.final and i not in self.cancelled:
                            self._requeue(i)
                    if waited > s.start_timeout_s:
                        self._rest(w, now + 1.0)  # stuck there: ask it again in a while
                    else:
                        spare -= 1  # (the next batch may wait there at once: among several
                        # controllers, a worker chooses whom to admit by use, not by arrival)
                continue
            if b.copied:
                continue
            expected = s.time_s * len(b.indices) if s.time_s else 0.0
            if expected:
                overdue = now - b.sent > 2 * expected + 5.0
            else:
                overdue = self.n_measured > 0 and now - b.sent > max(30.0, 20 * self.mean_s * len(b.indices))
            if overdue and spare:
                b.copied = True
                self.stats["copies"] += 1
                log.info("batch %s on %s is overdue: running it elsewhere too", b.bid, w.host)
                for i in reversed(b.indices):
                    if i not in self.final and i not in self.cancelled and i not in self.pending:
                        self.pending.appendleft(i)

    def _unplace(self, b: Batch, *, requeue_front: bool, resubmit: bool = False) -> None:
        """Take a batch back from its worker; its unfinished tasks wait to be placed again."""
        self._forget(b)
        back = []
        for i in b.indices:
            if i in self.final or i in self.cancelled or self.inflight.get(i):
                continue
            if resubmit:
                self.resubmits[i] = self.resubmits.get(i, 0) + 1
                if self.resubmits[i] > MAX_RESUBMITS:
                    self._write_gone(i, b.worker)
                    continue
            back.append(i)
        for i in reversed(back):
            if i not in self.pending:
                if requeue_front:
                    self.pending.appendleft(i)
                else:
                    self.pending.append(i)

    def _rerun_later(self, index: int, attempt: int, group: tuple[Any, list[Any]], item: int) -> bool:
        """Task ``index`` raised (its run ``attempt``; its error is item ``item`` of ``group``,
        the pickled values and buffers of a RESULT): if the job's ``retries=ew.Retry(on=...)``
        runs it again, it is placed again once its wait is over (the timers see to it), as
        attempt ``attempt + 1``; whether it is."""
        from ..folder import serial
        from ..util.retry import rerun_delay

        spec = self.rerun_spec
        if not spec or attempt >= int(spec.get("times", 0)):
            return False
        try:
            error = serial.loads(group[0], group[1])[item]  # authenticated: a worker of the group
        except Exception as exc:
            log.debug("the error of task %d cannot be read here (%s): it stands", index, exc)
            return False
        delay = rerun_delay(spec, error, attempt)
        if delay is None:
            return False
        self.attempts[index] = attempt + 1
        self.later[index] = time.monotonic() + delay
        return True

    def _requeue(self, index: int) -> None:
        if index not in self.pending:
            self.pending.appendleft(index)

    def _write_lost(self, w: Worker, index: int, attempt: int, pickled: Any, log_bytes: bytes,
                    t0: float, t1: float) -> None:  # fmt: skip
        from ..folder.records import Kind, make_record

        try:
            err = pickle.loads(pickled)  # [a small dict] the worker daemon made (authenticated)
            message = str(err[0].get("message", "")) if isinstance(err, list) and err else ""
        except Exception:
            message = ""
        tail = "\n".join(log_bytes.decode("utf-8", "replace").strip().splitlines()[-8:])
        why = (f"{message or 'its process died'} on {w.host}"
               f"{'' if self.retries == 0 else f' ({self.retries + 1} times)'}")  # fmt: skip
        if tail:
            why += f"; its last output:\n{tail}"
        with self.store.locked_queue() as q:
            q.lose(index, reason=why)
            self.store.append_control([make_record(Kind.LOST, index, attempt, t_start=t0, t_end=t1)])
        self._finalise(index)

    def _write_gone(self, index: int, w: Worker) -> None:
        from ..folder.records import Kind, make_record

        with self.store.locked_queue() as q:
            q.lose(index, reason=f"its worker vanished {MAX_RESUBMITS + 1} times (last: {w.host}); given up")
            self.store.append_control([make_record(Kind.LOST, index, self.attempts.get(index, 0),
                                                   t_end=time.time())])  # fmt: skip
        self._finalise(index)
        self.store.notify()

    def _fail_tasks(self, indices: list[int], exc: BaseException) -> None:
        """Tasks that cannot even be sent (their inputs cannot be pickled here)."""
        from ..folder.errorrecord import ErrorRecord
        from ..folder.journal import OutcomeWriter

        writer = OutcomeWriter(self.store, f"peer-controller-{self.short}")
        try:
            for i in indices:
                err = ErrorRecord.of_exception(exc, socket.gethostname(), i, (self.seed or 0) + i)
                value = err.explained("the task could not be sent to a peer").to_value()
                writer.write(i, ok=False, pickled=pickle.dumps(value, protocol=5), sync=True)
                self._finalise(i)
        finally:
            writer.close()
        self.store.notify()
