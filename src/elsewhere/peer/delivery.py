"""The worker daemon's results: a batch that ended, its RESULT sent and kept until its ACK.

When a batch ends (its child's last group of results, its child's death, or
never started: handed back, cut short by ``maxnum``), its slot is free: the
fair-share clock stops, and the RESULT (values too large for one frame made
errors, see :func:`~.runs.cap_result`) is kept in ``unacked`` until its
controller acknowledges it, and sent again on every new connection of that
controller. The RESULT leaves together with what the freed slot brings (the
ACCEPT of a held ASK, often of the same controller): one send, one wake-up; to
a controller that said ``fold`` those ACCEPTs ride inside the RESULT. A
result acknowledged (or kept past ``keep_results_s``) frees the memory its
buffers and its children's result maps held.
"""

from __future__ import annotations

import time
from typing import Any

from .admission import Peer
from .childmsg import Outcome
from .children import ChildProcess
from .messages import Result
from .runs import Done, Run, build_result, cap_result, fill_unfinished, run_tasks
from .wire import Limits  # looked up where the connections look it up
from .workerstate import WorkerState

__all__ = ["Delivery"]


class Delivery(WorkerState):
    """How :class:`~.daemon.PeerWorker` delivers results (see the module doc)."""

    def _complete(self, run: Run) -> None:
        """A batch ended: deliver its RESULT (kept until acknowledged); free its slot."""
        now = time.monotonic()
        self.running.pop(run.seq, None)
        charged = self.fair.finished(run.seq, now)
        self.stats["batches"] += 1
        if run_tasks(run) < len(run.info.get("items", ())):  # a batch cut short by maxnum
            fill_unfinished(run, -1, None, "", b"", 0.0, 0, self.options.host)
        requeue = int(Outcome.REQUEUE)
        self.tasks_done += run_tasks(run) - sum(1 for row, _ in run.outcomes.values() if row[2] == requeue)
        self.stats["tasks"] = self.tasks_done
        self.last_busy = now
        self._announce_due = True
        if run.info.get("cancelled"):
            self._free_held(run.held)
            run.held = []
            self._after_batch()
            return
        peer = self.by_controller.get(run.controller)
        self.stats["results_too_large"] += cap_result(run, self._max_result(peer), self.options.host)
        caps = peer.conn.peer.caps if peer is not None and peer.conn.peer is not None else ()
        info, buffers = build_result(run, self.options.host, charged, runs="runs" in caps)
        self.unacked.setdefault(run.controller, {})[run.task_id] = Done(info, buffers, now, run.leases,
                                                                        run.held)  # fmt: skip
        run.held = []
        # The RESULT and what the freed slot brings (an ACCEPT of a held ASK, often of the
        # same controller) leave together: one send, one wake-up of the controller. To a
        # controller that said ``fold`` its ACCEPTs ride inside the RESULT: the slot is
        # given out first.
        fold = peer is not None and peer.conn.peer is not None and "fold" in peer.conn.peer.caps
        corked = self._corked = set()
        try:
            if fold:
                assert peer is not None
                accepted: list[str] = []
                self._folding = (peer, accepted)
                self._after_batch()
                self._send(peer, Result.made(run.task_id, info, tuple(accepted)), buffers)
            else:
                if peer is not None:
                    self._send(peer, Result.made(run.task_id, info), buffers)
                self._after_batch()
        finally:
            self._folding = None
            self._corked = None
            for p in corked:
                self._flush(p)

    @staticmethod
    def _max_result(peer: Peer | None) -> int:
        """The largest RESULT frame that can go to the controller on ``peer`` (None: not
        connected now; the default cap)."""
        return peer.conn.limits.max_body_bytes if peer is not None else Limits().max_body_bytes

    def _after_batch(self) -> None:
        maxnum = self.options.maxnum
        if maxnum is not None and self.tasks_done >= maxnum and self.draining is None:
            self._drain(f"ran {self.tasks_done} tasks (maxnum)")
        self._dispatch()
        self._admit()

    def _finish_unstarted(self, run: Run) -> None:
        """Hand a batch that never reached a child back to its controller."""
        self._free_buffers(run, None)
        fill_unfinished(run, -1, None, "", b"", 0.0, 0, self.options.host)
        self._complete(run)

    def _free_buffers(self, run: Run, released: list[int] | None) -> None:
        """The run's large input buffers: back to the pool, unless its child keeps a map
        (``released``: the positions the child unmapped; None: the child is gone)."""
        done: list[tuple[Any, bool]] = []
        for i, buf in enumerate(run.buffers):  # a result in it: freed once acknowledged
            (run.held if i in run.kept else done).append((buf, released is None or i in released))
        self._free_held(done)
        run.buffers = ()

    def _forget_done(self, done: Done) -> None:
        """A result was acknowledged (or expired): its children may reuse their memory."""
        done.buffers = []
        self._free_held(done.held)
        done.held = []
        by_child: dict[ChildProcess, list[int]] = {}
        for child, lid in done.leases:
            if lid >= 0 and not child.dead:
                by_child.setdefault(child, []).append(lid)
        for child, ids in by_child.items():
            child.send({"op": "release", "ids": ids}, [], [])
            self._flush_child(child)
        done.leases = []

    def _free_held(self, held: list[tuple[Any, bool]]) -> None:
        """Input buffers now unused, each with whether it may be reused: back to the pool,
        unless the child kept a map of it (a task holds a view of its input)."""
        for buf, reusable in held:
            if reusable:
                self.pool.free(buf)
            else:
                self.pool.discard(buf)
