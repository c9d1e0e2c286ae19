"""Lanes, the worker daemon's side: a controller's connection handed to a task process.

A controller that wants its tasks without the daemon's hop (an Executor's stream of short
tasks) opens a connection of its own, named as a lane (its peer id ends in
:data:`LANE_SUFFIX`), and ASKs on it with ``lane`` set. The ASK waits for a slot like any
other (fair share decides); once admitted, the daemon hands the connection to an idle task
process that has loaded no user module (the socket, with the connection's session: see
:mod:`.lane`) and counts the slot as that process's run. From then on the controller and
the task process speak directly; the daemon still watches the task process (its memory, the
time a worker offers, its death), and takes the slot back when another controller's ASK
waits for one (a "lane-end" message: the task process ends the lane after the batch it
runs). A lane is refused (BUSY, the controller then asks on its own connection) where the
daemon cannot hand it over: no clean task process idle, the ASK declares memory or time
(their limits are a batch's, watched per TASK), ``--maxnum``, or the worker is stopping.

A lane connection carries nothing else: no other ASK, no TASK before its hand-over. The
task process's end of the lane is in :mod:`.lane`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..util.errors import PeerError
from .admission import Peer
from .children import ChildProcess
from .dispatch import take_user_files
from .messages import LANE_SUFFIX, Ask, Error, Greeting, RefuseReason
from .runs import Run, job_context
from .workerstate import WorkerState

__all__ = ["Lanes"]


class Lanes(WorkerState):
    """How :class:`~.daemon.PeerWorker` hands lanes over and takes them back (see the module doc)."""

    def _lane_handshake(self, peer: Peer, g: Greeting) -> bool:
        """A lane connection's handshake: the controller it belongs to, not registered as that
        controller's connection (it replaces none). False if it was closed (too many)."""
        controller = g.peer_id[: -len(LANE_SUFFIX)]
        open_ = sum(1 for p in self.peers if p.lane and p.controller == controller and not p.closed)
        if not controller or open_ >= self.options.slots:
            self.stats["lanes_over_cap"] += 1
            self._send(peer, Error("busy", f"at most {self.options.slots} lanes of one controller"))
            self._close(peer, "too many lanes")
            return False
        peer.lane = True
        peer.controller, peer.user, peer.host = controller, g.user, g.host
        return True

    def _lane_refusal(self, peer: Peer, ask: Ask) -> str:
        """Why the ASK on a lane connection cannot become a lane ("" if it can wait for one)."""
        if not ask.lane or peer.lane_asked:
            return "a lane connection carries one ASK, for a lane"
        if ask.mem_bytes or ask.time_s or ask.cores != 1:
            return "a lane runs tasks that declare no memory or time, one core each"
        if self.options.maxnum is not None:
            return "this worker runs a fixed number of tasks (--maxnum): no lanes"
        return ""

    def _start_lane(self, peer: Peer, ask: Ask, run: Run) -> None:
        """Hand ``peer``'s connection, whose lane ASK was admitted (``run`` holds the slot),
        to an idle clean task process, or once one is ready (one is always kept warm and
        clean, or starting); refuse it (BUSY) if it cannot be handed over."""
        if self.draining is not None:
            self.admission.take(peer, ask.task_id)
            self._refuse(peer, ask, RefuseReason.DRAINING, "the worker is stopping")
            return
        child = next((c for c in self.children if c.ready and c.run is None and not c.dead and not c.retiring
                      and not c.dirty and not c.out), None)  # fmt: skip
        if child is None and len(self.lanes_waiting) < self.options.slots:
            self.lanes_waiting.append((peer, ask, run))  # its reservation holds the slot meanwhile
            if not any(not c.ready and not c.dead and not c.retiring for c in self.children):
                self._spawn_child()
            return
        self.admission.take(peer, ask.task_id)  # the slot is the lane's run now
        session: dict[str, Any] | None = None
        if child is not None and not peer.pump.want_write:
            try:
                session = peer.conn.session()
            except PeerError:
                session = None
        if child is None or session is None:
            self.stats["lanes_refused"] += 1
            self._refuse(peer, ask, RefuseReason.BUSY, "no task process is free for a lane now")
            return
        limits = peer.conn.limits
        header = {"op": "lane", "session": session, "ask": ask.task_id, "host": self.options.host,
                  "limits": dataclasses.asdict(limits), "max_result": limits.max_body_bytes,
                  "poll": self.options.poll_s}  # fmt: skip
        child.send(header, [], [peer.sock.fileno()])
        try:
            child.flush()
        except OSError:
            pass
        if child.out and child.out[0][1]:  # the socket did not go (its fd is ours to close below)
            child.out.clear()
            child.kill()  # it may hold half a message: replaced
            self.stats["lanes_refused"] += 1
            self._close(peer, "the task process could not take the lane")
            return
        now = time.monotonic()
        run.info = {"lane": True, "job": {}, "items": [], "run": [], "user": peer.user, "host": peer.host}
        run.child = child
        run.started = now
        child.run = run
        child.job_id = None
        self.running[run.seq] = run
        self.fair.started(run.controller, run.seq, now)
        self.last_busy = now
        self.stats["lanes"] += 1
        self._announce_due = True
        self._close(peer, "")  # its socket here only: the task process has it now

    def _start_waiting_lanes(self) -> None:
        """A task process is ready: hand it the lanes admitted meanwhile (one it can take;
        a lane whose reservation lapsed, or was withdrawn, is refused or forgotten)."""
        waiting, self.lanes_waiting = self.lanes_waiting, []
        for peer, ask, run in waiting:
            if peer.closed:
                continue
            if self.admission.reserved.get((id(peer), ask.task_id)) is not run:
                self._refuse(peer, ask, RefuseReason.BUSY, "no task process was free for a lane in time")
                continue
            self._start_lane(peer, ask, run)

    def _lane_tasks(self, child: ChildProcess, header: dict[str, Any]) -> None:
        """A lane's task process ran tasks (told every half second or so, and at its end)."""
        run = child.run
        try:
            n = max(0, int(header.get("tasks") or 0))
            parts = max(0, int(header.get("parts") or 0))
        except (TypeError, ValueError):
            return
        self.tasks_done += n
        self.stats["tasks"] = self.tasks_done
        self.stats["lane_tasks"] += n
        self.last_busy = time.monotonic()
        if run is not None and run.info.get("lane"):
            run.info["parts"] = parts

    def _lane_ended(self, child: ChildProcess, header: dict[str, Any]) -> None:
        """The task process says its lane ended: the slot is free, the process idle again."""
        self._lane_tasks(child, header)
        run = child.run
        if run is None or not run.info.get("lane"):
            return
        self._lane_over(run)
        child.run = None
        self.stats["lane_batches"] += int(header.get("batches") or 0)
        child.dirty = bool(header.get("dirty"))
        job = header.get("job")
        if child.dirty and isinstance(job, dict):
            child.job_id = str(job.get("id", "")) or None
            child.context = job_context(run.info["user"], run.info["host"], job)
        take_user_files(child, header)
        self._dispatch()
        self._admit()  # the slot, to the ASKs that waited for it

    def _cancel_on_lanes(self, peer: Peer, tasks: tuple[int, ...]) -> None:
        """``peer``'s controller cancels a batch it sent on one of its lanes (``tasks``, the
        job's task numbers: the batch itself went past this daemon): the lane whose task
        process runs one of them now is stopped, the process killed and replaced, as a
        cancelled batch of the daemon's own is. Its controller sees the lane end. A task
        that ended meanwhile is not stopped: its lane runs on."""
        wanted = set(tasks)
        for run in list(self.running.values()):
            child = run.child
            if run.info.get("lane") and run.controller == peer.controller and child is not None \
                    and child.current()[0] in wanted:  # fmt: skip
                self.stats["lanes_killed"] += 1
                self._kill_run(run, None, "its task was cancelled by its controller")

    def _lane_died(self, run: Run) -> None:
        """A lane's task process died (or was killed): its slot is free. The controller sees
        the connection end, and places the batch it had there again."""
        self._lane_over(run)
        self.stats["lanes_lost"] += 1
        self._admit()

    def _lane_over(self, run: Run) -> None:
        """A lane ended or died: its slot is free."""
        now = time.monotonic()
        self.running.pop(run.seq, None)
        self.fair.finished(run.seq, now)
        self.last_busy = now
        self._announce_due = True

    def _take_lanes_back(self) -> None:
        """ASKs wait for a slot and lanes hold some: a lane of a controller other than a
        waiting one's ends after the batch it runs (the oldest; one lane at a time is asked),
        and fair share gives the slot. A controller's own ASK does not end its lane."""
        lanes = self._lanes_to_end()
        if not lanes or not self.admission.held:
            return
        waiting = {h.peer.controller for h in self.admission.held}
        others = [r for r in lanes if waiting - {r.controller}]
        if not others:
            return  # (a controller's own ASK waits behind its lane: it has the slot)
        self._end_lane(min(others, key=lambda r: r.started), "another controller waits for this worker's slot")
        self.stats["lanes_taken_back"] += 1

    def _lane_for(self, run: Run) -> None:
        """A TASK that was admitted waits for a slot, and lanes hold slots (an admission
        given before a lane took the slot: the controller sent its TASK there, not on the
        lane): a lane ends after its batch, ``run``'s controller's own first, else the
        oldest; one at a time. Without it the TASK waited for as long as the lane lived."""
        lanes = self._lanes_to_end()
        if not lanes:
            return
        own = [r for r in lanes if r.controller == run.controller]
        self._end_lane(min(own or lanes, key=lambda r: r.started), "a task admitted earlier waits for this slot")
        self.stats["lanes_given_way"] += 1

    def _lanes_to_end(self) -> list[Run]:
        """The running lanes, of which one may be asked to end: none while one is ending."""
        lanes = [r for r in self.running.values() if r.info.get("lane")]
        return [] if any(r.info.get("ending") for r in lanes) else lanes

    def _end_lanes(self, why: str) -> None:
        """Every lane ends after the batch it runs (the worker drains)."""
        for run in list(self.running.values()):
            if run.info.get("lane") and not run.info.get("ending"):
                self._end_lane(run, why)

    def _end_lane(self, run: Run, why: str) -> None:
        run.info["ending"] = True
        if run.child is not None:
            run.child.send({"op": "lane-end", "why": why}, [], [])
            self._flush_child(run.child)
