"""What the worker daemon takes in: ASKs answered or held, TASKs queued, CANCELs.

An ASK is refused at once, with its reason, when it can never fit here (the
access rules, draining, more cores, memory or time than offered, too many
waiting from one controller); else it is held until a slot and its memory are
free, and then admitted (ACCEPT), the fairest controller's first
(:meth:`~.admission.Admission.choose`). A TASK comes only for an admitted ASK;
its buffers are checked against its header, its function and job parts kept
for later TASKs of the connection, and it waits in ``queued`` for a child
(:mod:`.dispatch`); past ``maxnum`` the rest of a batch goes back at once. A
CANCEL withdraws an admission, a queued TASK, or stops a running one.
"""

from __future__ import annotations

import time
from typing import Any

from .admission import Peer
from .messages import MAX_ACKS, Accept, Ask, Error, Refuse, RefuseReason, Task
from .runs import Run, job_context, task_layout
from .workerstate import WorkerState

__all__ = ["Intake"]


class Intake(WorkerState):
    """How :class:`~.daemon.PeerWorker` takes work in (see the module doc)."""

    def _on_ask(self, peer: Peer, ask: Ask) -> None:
        self.stats["asks"] += 1
        opts = self.options
        lane = self._lane_refusal(peer, ask) if peer.lane else ""
        if peer.lane:
            peer.lane_asked = True
        if peer.refusal is not None:
            self._refuse(peer, ask, RefuseReason.NOT_ALLOWED, peer.refusal)
        elif self.draining is not None:
            self._refuse(peer, ask, RefuseReason.DRAINING, "the worker is stopping")
        elif lane:
            self._refuse(peer, ask, RefuseReason.BUSY, lane)
        elif ask.lane and not peer.lane:
            self._refuse(peer, ask, RefuseReason.BUSY, "a lane is asked for on a lane connection")
        elif ask.cores > opts.slots:
            self._refuse(peer, ask, RefuseReason.BUSY,
                         f"the task needs {ask.cores} cores; this worker has {opts.slots}")  # fmt: skip
        elif ask.mem_bytes > self._mem_total():
            self._refuse(peer, ask, RefuseReason.MEMORY,
                         f"the task needs {ask.mem_bytes} bytes; this worker offers {self._mem_total()}")  # fmt: skip
        elif ask.time_s > self._time_offer(time.monotonic()):
            self._refuse(peer, ask, RefuseReason.TIME,
                         f"the task needs {ask.time_s:.0f} s; this worker offers "
                         f"{self._time_offer(time.monotonic()):.0f} s")  # fmt: skip
        elif self.admission.waiting(peer) >= 2 * opts.slots + 2:
            self._refuse(peer, ask, RefuseReason.BUSY, "too many requests waiting here")
        else:
            self.admission.hold(peer, ask, time.monotonic())
            self._admit()

    def _refuse(self, peer: Peer, ask: Ask, reason: RefuseReason, detail: str) -> None:
        self.stats[f"refused_{reason.name.lower()}"] += 1
        self._send(peer, Refuse(ask.task_id, reason, detail[:1000]))

    def _admit(self) -> None:
        """Accept waiting ASKs while slots and memory are free: fairest controller first."""
        if self.draining is not None:
            return
        now = time.monotonic()
        while self.admission.held:
            free_slots, free_mem = self._free(now)
            chosen = self.admission.choose(free_slots, free_mem, now)
            if chosen is None:
                self._take_lanes_back()  # ASKs wait: a lane gives its slot back
                return
            self._seq += 1
            run = Run(self._seq, chosen.peer.controller, chosen.ask.task_id, chosen.ask, {},
                       accepted=now)  # fmt: skip
            self.admission.reserve(chosen.peer, chosen.ask.task_id, run)
            self.stats["accepted"] += 1
            self._announce_due = True
            if chosen.peer.lane:
                self._start_lane(chosen.peer, chosen.ask, run)
                continue
            folding = self._folding
            if folding is not None and folding[0] is chosen.peer and len(folding[1]) < MAX_ACKS - 1:
                folding[1].append(chosen.ask.task_id)  # it leaves inside the RESULT being made
            else:
                self._send(chosen.peer, Accept(chosen.ask.task_id))

    def _on_task(self, peer: Peer, msg: Task, buffers: tuple[Any, ...]) -> None:
        run = self.admission.take(peer, msg.task_id)
        if run is None:  # accepted earlier, then withdrawn by us (connection replaced)
            self._seq += 1
            run = Run(self._seq, peer.controller, msg.task_id, Ask(msg.task_id), {})
        info = msg.info
        try:
            ntask, nfn, njp, items = task_layout(info, len(buffers))
        except (KeyError, TypeError, ValueError) as exc:
            self._send(peer, Error("task", f"malformed TASK {msg.task_id!r}: {exc}"))
            self._close(peer, f"malformed TASK: {exc}")
            return
        digest = str(info.get("fn") or "")
        jdigest = str(info.get("jpart") or "")
        for buf in buffers[:ntask]:
            self.pool.claim(buf, run)
        # the function part and the job part: kept for later TASKs of this connection, as
        # plain bytes, not pooled memory
        for name, start, count, what in ((digest, ntask, nfn, "function"),
                                         (jdigest, ntask + nfn, njp, "job part")):  # fmt: skip
            if count:
                part = buffers[start : start + count]
                peer.fns[name] = tuple(bytes(b) if self.pool.fd_of(b) >= 0 else b for b in part)
                for buf in part:
                    self.pool.free(buf)
            elif name and name not in peer.fns:
                self._send(peer, Error("task", f"TASK {msg.task_id!r} names a {what} never sent"))
                self._close(peer, f"TASK without its {what}")
                return
        forget = info.get("forget")
        if isinstance(forget, list):  # the controller bounds what is kept for it
            for old in forget:
                if isinstance(old, str) and old not in (digest, jdigest):
                    peer.fns.pop(old, None)
        run.info = {"job": info.get("job") or {}, "diary": str(info.get("diary", "always")),
                    "items": items, "fn": digest, "jpart": jdigest,
                    "time_s": float(info.get("time_s") or 0.0)}  # fmt: skip
        run.context = job_context(peer.user, peer.host, run.info["job"])
        run.buffers = tuple(buffers[:ntask])
        run.fn_buffers = peer.fns.get(digest, ()) if digest else ()
        run.job_buffers = peer.fns.get(jdigest, ()) if jdigest else ()
        maxnum = self.options.maxnum
        if maxnum is not None:  # at most maxnum tasks run: the rest of a batch goes back
            ahead = sum(len(r.info["run"]) for r in (*self.running.values(), *self.queued))
            allowed = max(0, maxnum - self.tasks_done - ahead)
            run.info["run"] = items[:allowed]
            if self.tasks_done + ahead + len(run.info["run"]) >= maxnum:
                self._drain(f"{maxnum} tasks taken (maxnum)")
        else:
            run.info["run"] = items
        if self.hand_back or not run.info["run"]:
            self._finish_unstarted(run)
            return
        self.queued.append(run)
        self._dispatch()

    def _on_cancel(self, peer: Peer, task_id: str) -> None:
        if self.admission.withdraw(peer, task_id):
            self._announce_due = True
            self._admit()
            return
        for run in list(self.queued):
            if run.controller == peer.controller and run.task_id == task_id:
                self.queued.remove(run)
                self._free_buffers(run, None)
                self._admit()
                return
        for run in list(self.running.values()):
            if run.controller == peer.controller and run.task_id == task_id:
                self._kill_run(run, None, "cancelled by its controller")
                return
