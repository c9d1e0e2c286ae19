"""A worker's part in a job's queue (``queue.json``, changed under ``queue.lock``): join,
claim tasks, leave.

Claims are guided: the first is one task (its time is unknown), then about 20 ms of work, a
share of what is left that shrinks towards the end, never less than ~2 ms of work (a claim
costs a lock and a rewrite of the queue). Tasks to run again (retried, or given back by a lost
worker) are claimed first. A worker that finds nothing left reaps lost members (their tasks
come back) and looks again; in a job that may still grow (an open stream) it then waits.
"""

from __future__ import annotations

import sys
import time

from ..folder.journal import reap

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from typing import Any

    from ..folder.queue import Queue
    from ..folder.store import JobStore

__all__ = ["WAIT", "Claims", "claim_size"]

WAIT = object()
"""A claim that found nothing now in a job that may still get tasks: wait, then claim again."""

_TARGET_BATCH_S = 0.02  # a claim should hold about 20 ms of work
_MIN_BATCH_S = 0.002  # ... and no less than this, even at the end of a job
_MAX_BATCH = 32768
_EARLY_S = 60  # a worker started before its job was submitted waits this long at most
_PY_VERSION = sys.version.split()[0]


def claim_size(mean_s: float, n_done: int) -> tuple[int, int]:
    """(how many tasks to claim at most, at least): ~20 ms and ~2 ms of tasks that take
    ``mean_s`` each (one while nothing is known: ``n_done`` 0)."""
    if n_done == 0 or mean_s <= 0:
        return 1, 1
    want = max(1, min(_MAX_BATCH, int(_TARGET_BATCH_S / mean_s)))
    return want, max(1, min(want, int(_MIN_BATCH_S / mean_s)))


class Claims:
    """Worker ``wid``'s membership of job ``store``'s queue.

    A claim is a ``range`` of tasks, or a list (tasks to run again, or a range with some
    cancelled), None when the worker is done with the job, or :data:`WAIT`.
    """

    def __init__(self, store: JobStore, wid: str) -> None:
        self.store = store
        self.wid = wid
        self.attempts: dict[int, int] = {}  # the attempts due of the last claim's tasks run again
        self.left = False  # the last claim found nothing left and recorded that the worker left

    def join(self, *, pid: int, host: str, lock: str, fifo: str, mean_s: float, n_done: int) -> Any:
        """Become a member (who this worker is: ``pid``, ``host``, the path of its ``lock``,
        its wake-up ``fifo``) and make the first claim, in one queue update; None if the job
        needs no more workers."""
        with self.store.locked_queue() as q:
            q.forget_dispatched(self.wid)  # arrived, whatever happens next
            if q.cancelled or q.live_members() >= q.max_workers:
                return None
            m = q.join(self.wid, {"pid": pid, "host": host, "python": sys.executable, "version": _PY_VERSION,
                                  "lock": lock, "fifo": fifo, "joined": time.time()})
            return self._claim_in(q, m, mean_s, n_done)

    def claim(self, mean_s: float, n_done: int) -> Any:
        """The next claim, sized for tasks of ``mean_s`` seconds."""
        try:
            with self.store.locked_queue() as q:
                m = q.members.get(self.wid)
                if m is None or m.get("state") == "dead" or q.cancelled:
                    return None
                return self._claim_in(q, m, mean_s, n_done)
        except FileNotFoundError:
            return None  # the job was withdrawn (its submission failed) or purged

    def _claim_in(self, q: Queue, m: dict[str, Any], mean_s: float, n_done: int) -> Any:
        """Claim tasks in queue state ``q`` (locked) for member ``m`` (this worker's entry)."""
        wid = self.wid
        want, least = claim_size(mean_s, n_done)
        if not q.submitted:
            # Started early, while the client still writes the inputs.
            if time.time() - m.get("joined", 0) > _EARLY_S:
                q.set_member(wid, "left")
                return None
            q.set_member(wid, "waiting")
            return WAIT
        skip = q.cancelled_tasks
        self.attempts = {}
        for _ in range(2):
            take, were = q.take_reruns(want)
            if were:
                if not take:
                    continue
                self.attempts = {i: q.attempt(i) for i in take}
                q.set_member(wid, "active", [-1, *take])
                return take
            remaining = q.n - q.next
            if remaining > 0:
                # Guided: a share of what is left, halved while that is more than a few ms of
                # work per worker; at the end, what is left is split evenly at once.
                active = max(1, q.live_members())
                share = -(-remaining // active)
                if remaining * mean_s > _TARGET_BATCH_S * active / 2 or n_done == 0:
                    share = -(-share // 2)
                k = min(remaining, max(least, min(want, share)))
                a = q.take_next(k)
                if skip and any(i in skip for i in range(a, a + k)):
                    kept = [i for i in range(a, a + k) if i not in skip]
                    q.set_member(wid, "active", [-1, *kept])
                    return kept
                q.set_member(wid, "active", [a, a + k])
                return range(a, a + k)
            q.set_member(wid, m.get("state", "active"), [])
            if not reap(self.store, q):
                break
        if q.closed:
            q.set_member(wid, "left", [])
            self.left = True
            return None
        q.set_member(wid, "waiting")
        return WAIT

    def fixed_attempts(self, tasks: list[int]) -> list[int]:
        """For a worker given its tasks (no membership): those not cancelled, their attempts
        due in :attr:`attempts`."""
        q = self.store.queue()
        self.attempts = {i: q.attempt(i) for i in tasks}
        skip = q.cancelled_tasks
        return [i for i in tasks if i not in skip]

    def leave(self) -> None:
        """Leave the job (the claim that found nothing left may have said so already)."""
        if self.left:
            self.store.notify()
            return
        try:
            with self.store.locked_queue() as q:
                m = q.members.get(self.wid)
                if m is not None and m.get("state") != "dead":
                    q.set_member(self.wid, "left", [])
        except FileNotFoundError:
            return  # purged: nothing to leave
        self.store.notify()
