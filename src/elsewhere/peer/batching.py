"""The controller's placing of tasks: batches asked for, admitted, sent, taken back.

Pending tasks go to workers in batches (:meth:`~Batching._place`): the best
worker (:class:`~.placement.Candidates`) is asked for as many tasks as one
batch holds (:func:`~.placement.batch_size`, about 100 ms of work), and only
once it ACCEPTs does the TASK go, its pickles made by the
:class:`~.encoder.TaskEncoder` (a TASK too large for one frame is halved
first). A REFUSE sends the batch's tasks back to the queue, and marks the
worker unsuitable for a while when the reason is permanent (memory, time,
access).

An open Executor with nothing to place asks one worker ahead, a *standing*
batch with no task yet (:meth:`~Batching._stand`), so that its next task goes
without the round trip of an ASK; for tasks shorter than ``_SHORT_S`` that ASK
rides inside the TASK before it (``fold``), and its ACCEPT inside the RESULT.
A batch whose tasks are done elsewhere, cancelled or moved is withdrawn
(:meth:`~Batching._withdraw`).
"""

from __future__ import annotations

import heapq
import itertools
import operator
import time
from typing import Any

from ..util.errors import PeerError
from .controlstate import Blocked, ControllerState
from .messages import Ask, Cancel, Refuse, RefuseReason, Task
from .placement import Batch, Candidates, Standing, Worker, batch_size, choose_standing
from .wire import Limits

__all__ = ["Batching"]

_SHORT_S = 0.005
"""Tasks shorter than this: an open Executor asks ahead at the worker running its task."""
_PERMANENT = (RefuseReason.MEMORY, RefuseReason.TIME, RefuseReason.NOT_ALLOWED)
_RECHECK_S = 0.25
"""A placing turn that found no worker with room skips the next turns until something may
have given one room (``placing_epoch``), a worker's refusal wait ends, or this long passed."""


RECORD_BACKLOG_BYTES = 16 << 20
"""Results held for the recorder (received, not yet on disk) beyond which no task is placed:
where results come faster than the job folder's disk takes them, the controller's memory
stays bounded (it waits for the disk instead of growing by every result). An Executor
keeping 100 calls that return 1 MB each in flight peaked 100 MB higher with 64 MB here, and
ran no faster (``bench/peer.py --only memory``); a single result larger than either stops
the placing until it is written, as before."""


_found_order = operator.attrgetter("seq")  # workers in the order they were found (Worker.seq)


class Batching(ControllerState):
    """How :class:`~.controller.Controller` places its tasks (see the module doc)."""

    def _place(self, now: float) -> None:
        if self.recorder is not None and self.recorder.backlog_bytes > RECORD_BACKLOG_BYTES:
            return  # results come faster than the disk takes them: no new tasks until it has
        if self.stream:  # (only an open stream job asks ahead)
            for b in [b for b in self.batches.values() if b.standing and not b.withdrawn]:
                if self.pending:
                    # admitted: the tasks go now; not yet answered: they ride on that ASK
                    self._fill_standing(b, send=bool(b.accepted))
        resting = self.resting
        while resting and resting[0][0] <= now:  # their rest is over: they may have room
            until, _, w = heapq.heappop(resting)
            if w.busy_until == until:  # (not resting again since)
                self.freed.add(w)
                self.placing_epoch += 1
        if not self.pending:
            self._stand(now)
            return
        blocked = self.blocked
        if blocked is not None and blocked.epoch == self.placing_epoch and blocked.pending == len(self.pending) \
                and now < self.blocked_until:  # fmt: skip
            self.stats["placing_skipped"] += 1  # no worker has gained room since the last turn
            return
        s = self.settings
        epoch, slots = self.roster_slots
        freed, self.freed = self.freed, set()
        total = slots if epoch == self.roster_epoch else -1
        if blocked is not None and blocked.roster == self.roster_epoch and now < self.blocked_until and total >= 0:
            # The last turn found no worker with room, and since then only batches came back
            # (or were taken back): their workers alone may have room now, and the best of them
            # is the best of all. A turn under contention looks at one worker, not every one.
            connecting, known = blocked.connecting, blocked.known
            depth = 1 if connecting and len(self.pending) <= known else 2
            self.stats["placing_narrow"] += 1
            if not freed:  # tasks came back from workers that rest now: none has room yet
                self.blocked = Blocked(self.placing_epoch, len(self.pending), self.roster_epoch, connecting, known)
                return
            if len(freed) == 1:  # the usual case under contention: one batch came back
                self._refill(next(iter(freed)), depth, total, now)
                return
            pick = Candidates(sorted(freed, key=_found_order), s, self.local_addresses, now, len(self.pending),
                              total_slots=total, depth=depth)  # fmt: skip
            recheck = self.blocked_until  # (the pass over every worker stays due by then)
        else:
            pick = Candidates(self.workers.values(), s, self.local_addresses, now, len(self.pending),
                              total_slots=total)  # fmt: skip
            recheck = now + _RECHECK_S
            connecting, known = pick.connecting, pick.known
        try:
            while self.pending:
                best = pick.take()
                if best is None:
                    self.blocked = Blocked(self.placing_epoch, len(self.pending), self.roster_epoch, connecting, known)
                    self.blocked_until = recheck  # (a worker that rests comes back by itself)
                    return
                k = batch_size(s, best, pick.total_slots, len(self.pending), self.mean_s, self.n_measured,
                               self.result_bytes_per_task, least=not self.stream)  # fmt: skip
                self._ask(best, self._alone_cut(k) if self.alone else k, now)
            self.blocked = None
        finally:
            if pick.slots_known:
                self.roster_slots = (self.roster_epoch, pick.total_slots)

    def _refill(self, w: Worker, depth: int, total: int, now: float) -> None:
        """A narrow turn (see :meth:`_place`) with one worker to look at, ``w``, the one a
        batch came back from: the choice :class:`Candidates` makes among one worker, made
        without building it (its lists and heap were most of such a turn's cost)."""
        s = self.settings
        a = w.info.announcement
        slots = a.slots // s.cores or 1
        n = len(w.batches)
        # (one that rests comes back when its rest is over: see _place)
        if w.state == "ready" and n < 2 * slots and w.busy_until <= now and w.usable(s):
            pending = self.pending
            while pending and n < depth * slots:
                k = batch_size(s, w, total, len(pending), self.mean_s, self.n_measured,
                               self.result_bytes_per_task, least=not self.stream)  # fmt: skip
                self._ask(w, self._alone_cut(k) if self.alone else k, now)
                n += 1
            if not pending:
                self.blocked = None
                return
        b = self.blocked
        assert b is not None
        self.blocked = Blocked(self.placing_epoch, len(self.pending), self.roster_epoch, b.connecting, b.known)

    def _ask(self, w: Worker, k: int, now: float) -> None:
        pending, final, cancelled = self.pending, self.final, self.cancelled
        w = self._through(w)
        take = pending.popleft
        if k == 1:  # a batch of one task (longer than a batch: the usual case at scale)
            i = take()
            while i in final or i in cancelled:  # (rare: a task that ended while it waited again)
                if not pending:
                    return
                i = take()
            indices = [i]
        else:
            indices = []
            while pending and len(indices) < k:
                got = [take() for _ in range(min(k - len(indices), len(pending)))]
                if self._ended_among(got):
                    got = [i for i in got if i not in final and i not in cancelled]
                indices += got
            if not indices:
                return
        self._seq += 1
        bid = f"{self.short}-{self._seq}"
        attempts = self.attempts
        b = Batch(bid, w, indices, [attempts.get(i, 0) for i in indices] if attempts else [0] * len(indices), now)
        s = self.settings
        ask = Ask.made(bid, s.mem_bytes, s.time_s * len(indices), s.cores)
        self.batches[bid] = b
        w.batches[bid] = b
        inflight = self.inflight
        for i in indices:
            bids = inflight.get(i)
            if bids is None:
                inflight[i] = {bid}
            else:
                bids.add(bid)
        if not self._send(w, ask):
            self._unplace(b, requeue_front=True)
        self.stats["asks"] += 1

    def _alone_cut(self, k: int) -> int:
        """How many of the next ``k`` pending tasks one batch takes when some must go alone
        (:attr:`alone`: a task process died working for them together, loading their inputs
        or pickling their values, and could not tell which did it): one if the first must,
        else those before the first that must. Alone, a task that kills its process again
        is charged for it (lost, or run again while its retries last), and no other."""
        alone = self.alone
        for pos, i in enumerate(itertools.islice(self.pending, k)):
            if i in alone:
                return pos or 1
        return k

    def _encode(self, w: Worker, b: Batch) -> tuple[dict[str, Any], list[Any]]:
        """The TASK of a batch (see :meth:`TaskEncoder.encode`)."""
        prepared = self.prepared.get(b.indices[0]) if len(b.indices) == 1 else None
        peer = w.conn.peer if w.conn is not None else None
        job_part = peer is not None and "job-part" in peer.caps
        return self.encoder.encode(b.indices, b.attempts, prepared, self.entries, w.sent_fns, job_part)

    def _on_accept(self, w: Worker, bid: str) -> None:
        b = self.batches.get(bid)
        if b is None or b.worker is not w or b.withdrawn:
            self._send(w, Cancel(bid))
            if b is not None:
                self._forget(b)
            return
        b.accepted = time.monotonic()
        if b.standing:  # admitted ahead: the next task goes at once, with no ASK in its way
            if self.pending:
                self._fill_standing(b)
            return
        if self._ended_among(b.indices):  # some ended meanwhile (ran elsewhere too): not sent
            keep = [(i, a) for i, a in zip(b.indices, b.attempts) if i not in self.final and i not in self.cancelled]
            if not keep:
                self._withdraw(b)
                return
            b.indices, b.attempts = [i for i, _ in keep], [a for _, a in keep]
        self._send_task(w, b)

    def _send_task(self, w: Worker, b: Batch) -> None:
        """Send the TASK of an admitted batch."""
        bid = b.bid
        try:
            while True:
                info, buffers = self._encode(w, b)
                if self._fits(w, b, info, buffers):
                    break
        except Exception as exc:
            self._withdraw(b)
            self._fail_tasks(b.indices, exc)
            return
        nxt = self._fold_standing(w)
        ask = ()
        if nxt is not None:
            ask = Task.folding(nxt.ask)
            self.stats["asks_folded"] += 1
        if not self._send(w, Task.made(bid, info, ask), buffers):
            self._unsent_parts(w, info)
            if nxt is not None:
                self._forget(nxt.batch)
            self._send(w, Cancel(bid))  # the slot it admitted goes back (if the connection lives)
            self._unplace(b, requeue_front=True)
            return
        b.sent, b.sent_wall = time.monotonic(), time.time()
        self.last_sent = b.sent
        self.stats["batches_sent"] += 1
        with self.lock:
            for i in b.indices:
                self.running_view[i] = (w.wid, b.sent_wall)

    def _fits(self, w: Worker, b: Batch, info: dict[str, Any], buffers: list[Any]) -> bool:
        """Whether the TASK of ``b`` fits in one frame (at most 4 GiB in at most 1024
        buffers). If not, a batch of several tasks keeps the first half (the others go back
        to the front of the queue) and is encoded again; a task alone raises why: it can
        never be sent, and would otherwise be placed again and again."""
        limits = w.conn.limits if w.conn is not None else Limits()
        size = sum(memoryview(x).nbytes for x in buffers)
        if size <= limits.max_body_bytes and len(buffers) <= limits.max_buffers:
            self.stats["payload_bytes"] += size
            return True
        self._unsent_parts(w, info)
        if len(b.indices) == 1:
            from ..util.units import format_size

            raise PeerError(
                f"its data with its function ({format_size(size)} in {len(buffers)} buffers) is over "
                f"what one message to a worker may carry ({format_size(limits.max_body_bytes)} in "
                f"{limits.max_buffers} buffers): pass a smaller argument, or a file path the task reads")
        keep = len(b.indices) // 2
        back, b.indices, b.attempts = b.indices[keep:], b.indices[:keep], b.attempts[:keep]
        with self.lock:
            for i in back:
                bids = self.inflight.get(i)
                if bids is not None:
                    bids.discard(b.bid)
                    if not bids:
                        del self.inflight[i]
        for i in reversed(back):
            if i not in self.pending:
                self.pending.appendleft(i)
        self.stats["batches_split"] += 1
        return False

    @staticmethod
    def _unsent_parts(w: Worker, info: dict[str, Any]) -> None:
        """The function and job parts a TASK would have carried did not reach ``w``."""
        for name, count in ((info["fn"], info["nfn"]), (info.get("jpart", ""), info.get("njpart"))):
            if count:
                w.sent_fns.pop(name, None)

    def _on_refuse(self, w: Worker, msg: Refuse) -> None:
        b = self.batches.get(msg.task_id)
        if w.lane_of is not None:  # no lane for now: the tasks go through the worker itself
            if b is not None:
                self._unplace(b, requeue_front=True)
            self._lane_closed(w, f"refused: {msg.detail}", ended=False)
            return
        if b is None:
            return
        self.stats[f"refused_{msg.reason.name.lower()}"] += 1
        self._unplace(b, requeue_front=True)
        if b.withdrawn:
            return
        if msg.reason in _PERMANENT:
            why = msg.reason.name.lower().replace("_", " ")  # "not allowed", "memory", ...
            w.unsuitable, w.unsuitable_for = f"{why}: {msg.detail}", w.offer
            w.unsuitable_since = time.monotonic()
            for i in b.indices:
                self.reasons[i] = f"refused by {w.host}: {why} ({msg.detail})"
            self._roster_changed()
        else:
            self._rest(w, time.monotonic() + (0.05 if msg.reason is RefuseReason.FAIR_SHARE else 0.2))

    def _through(self, w: Worker) -> Worker:
        """The worker the next pending task goes to when ``w`` is chosen: the lane's worker
        itself if ``w`` is a lane and the task's lane broke under it (a worker daemon tells a
        death as lost), else ``w``."""
        main = w.lane_of
        return main if main is not None and self.pending and self.pending[0] in self.off_lanes else w

    def _stand(self, now: float) -> None:
        """An open stream job (an Executor) with nothing to place: ask one worker ahead, so
        the next task skips a round trip. The worker lets another controller have the slot
        if this admission is not used within moments (``admission._STALE_RESERVATION_S``)."""
        # Tasks shorter than a round trip: ask where the last one runs. The worker holds the
        # ASK and admits it as the task ends, its ACCEPT leaving with the RESULT, and no
        # other worker is woken for it (with ``fold`` that ASK rode inside the TASK, see
        # _fold_standing). Longer tasks: ask an idle worker.
        best = self._standing_worker(now)
        if best is None:
            return
        nxt = self._new_standing(best, now)
        if not self._send(best, nxt.ask):
            self._forget(nxt.batch)

    def _standing_worker(self, now: float) -> Worker | None:
        """The worker an open stream job (an Executor) asks ahead, or None if it should not."""
        if not self.stream or self.closed or now < self.standing_after:
            return None
        if any(b.standing for b in self.batches.values()):
            return None
        return choose_standing(self.workers.values(), self.settings, self.local_addresses, self._short(), now)

    def _short(self) -> bool:
        """Whether the tasks are shorter than a round trip (as measured so far)."""
        return self.n_measured > 0 and self.mean_s < _SHORT_S

    def _new_standing(self, w: Worker, now: float) -> Standing:
        s = self.settings
        self._seq += 1
        b = Batch(f"{self.short}-{self._seq}", w, [], [], now, standing=True)
        self.batches[b.bid] = b
        w.batches[b.bid] = b
        return Standing(b, Ask.made(b.bid, s.mem_bytes, s.time_s, s.cores))

    def _fold_standing(self, w: Worker) -> Standing | None:
        """For a TASK about to go to ``w``: the standing ASK :meth:`_stand` would send next,
        made now to ride inside the TASK, if ``w`` takes folded frames and is the worker
        :meth:`_stand` would ask (short tasks, nothing pending). Its ACCEPT then comes back
        inside the RESULT: two frames a task instead of four."""
        peer = w.conn.peer if w.conn is not None else None
        if peer is None or "fold" not in peer.caps or self.pending or not self._short():
            return None
        now = time.monotonic()
        if self._standing_worker(now) is not w:
            return None
        return self._new_standing(w, now)

    def _fill_standing(self, b: Batch, *, send: bool = True) -> None:
        """Give a standing batch the pending tasks (as many as one batch takes); send them
        if it was admitted already. (Not a lane's, to a task whose lane broke under it.)"""
        if self._through(b.worker) is not b.worker:
            return
        if len(self.pending) == 1:  # an Executor's task, one at a time: no batch to size
            k = 1
        else:
            total = sum(max(1, x.info.announcement.slots // self.settings.cores)
                        for x in self.workers.values() if x.state == "ready")  # fmt: skip
            k = batch_size(self.settings, b.worker, max(1, total), len(self.pending), self.mean_s,
                           self.n_measured, self.result_bytes_per_task, least=not self.stream)  # fmt: skip
        if self.alone and self.pending:
            k = self._alone_cut(k)
        while self.pending and len(b.indices) < k:
            i = self.pending.popleft()
            if i in self.final or i in self.cancelled:
                continue
            b.indices.append(i)
            b.attempts.append(self.attempts.get(i, 0))
            self.inflight.setdefault(i, set()).add(b.bid)
        b.standing = False
        if not b.indices:
            b.standing = True
        elif send:
            self._send_task(b.worker, b)

    def _withdraw(self, b: Batch) -> None:
        """Take a batch's tasks back (they are done elsewhere, cancelled, or go elsewhere).

        A batch already sent (or admitted) is cancelled at its worker. An ASK still
        unanswered is not (an ACCEPT may be on its way: the protocol then refuses a
        CANCEL that crossed it); the batch stays, empty, until the answer comes.
        """
        if b.sent or b.accepted:
            self._cancel_sent(b)
            self._forget(b)
            return
        tasks = b.indices
        self._forget(b)
        b.withdrawn, b.indices, b.attempts = True, [], []
        self.batches[b.bid] = b
        b.worker.batches[b.bid] = b
        del tasks

    def _cancel_sent(self, b: Batch) -> None:
        """CANCEL a batch sent (or admitted): to its worker; for a lane's batch that was sent,
        also to the lane's worker daemon, naming its tasks (it never saw the batch): the task
        process reads the lane's CANCEL only after the task, the daemon stops it now."""
        self._send(b.worker, Cancel(b.bid))
        main = b.worker.lane_of
        peer = main.conn.peer if main is not None and main.conn is not None else None
        if b.sent and b.indices and peer is not None and "lane-kill" in peer.caps:
            assert main is not None
            if self._send(main, Cancel(b.bid, tasks=tuple(b.indices))):
                b.worker.lane_killed = time.monotonic()

    def _forget(self, b: Batch) -> None:
        self.batches.pop(b.bid, None)
        b.worker.batches.pop(b.bid, None)
        self.placing_epoch += 1
        self.freed.add(b.worker)
        inflight, view, bid = self.inflight, self.running_view, b.bid
        with self.lock:
            for i in b.indices:
                bids = inflight.get(i)
                if bids is not None:
                    bids.discard(bid)
                    if not bids:
                        del inflight[i]
                        view.pop(i, None)
