"""A worker's part in a job's queue (``queue.json``, changed under ``queue.lock``): join,
claim tasks, leave.

Claims are guided: the first is one task (its time is unknown), then about 20 ms of work, a
share of what is left that shrinks towards the end, never less than ~2 ms of work (a claim
costs a lock and a rewrite of the queue). A warm worker whose last job had the same function
(and job data) sizes its first claim by that job's time a task instead, and takes no more than
an even share of the work outstanding (the tasks left and those the other members hold) between
the workers that joined or are on their way: should the tasks now take longer, it holds no more
than its part, and two warm workers handed a job at once take half each, one claim apiece.
Tasks to run again (retried, or given back by a lost worker) are claimed first. A worker that
finds nothing left reaps lost members (their tasks come back) and looks again; in a job that
may still grow (an open stream) it then waits.

A worker never leaves with tasks it did not finish (see ``jobrun.py``): interrupted, or out of
memory, it writes itself off as a reaper would (:meth:`Claims.lose`); failed because of the
job's files (a full disk, an I/O error, a damaged job folder), it fails them with its reason
and halts the job (:meth:`Claims.fail`). Killed outright, it is reaped by whoever looks next.
"""

from __future__ import annotations

import os
import sys
import time

from ..folder import records
from ..folder.journal import finished_by, reap
from ..folder.records import Kind

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from typing import Any

    from ..folder.queue import Queue
    from ..folder.store import JobStore

__all__ = ["WAIT", "Claims", "claim_size", "write_off"]

WAIT = object()
"""A claim that found nothing now in a job that may still get tasks: wait, then claim again."""

_TARGET_BATCH_S = 0.02  # a claim should hold about 20 ms of work
_MIN_BATCH_S = 0.002  # ... and no less than this, even at the end of a job
_MAX_BATCH = 32768
_EARLY_S = 60  # a worker started before its job was submitted waits this long at most
_CLIENT_LOOK_S = 1.0  # ... and after this long, no longer than its client lives
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

    def __init__(self, store: JobStore, wid: str, client: dict[str, Any] | None = None) -> None:
        self.store = store
        self.wid = wid
        self.client = client or {}  # who makes the job (job.json's "client": host, pid)
        self.attempts: dict[int, int] = {}  # the attempts due of the last claim's tasks run again
        self.again = False  # the last claim holds tasks run again (retried, or back from a lost worker)
        self.left = False  # the last claim found nothing left and recorded that the worker left
        self.drained = False  # the last claim took the queue's last tasks (none held for a rerun)
        self.wake_at: float | None = None  # a WAIT for a task held for a later rerun: when it is due
        # Called (under the queue lock) when a claim finds no task left to take, before it looks
        # for lost members and writes the queue: the worker tells its client of its last results
        self.on_empty: Any = None

    def join(self, *, pid: int, host: str, lock: str, fifo: str, mean_s: float, n_done: int,
             guess_s: float = 0.0) -> Any:  # fmt: skip
        """Become a member (who this worker is: ``pid``, ``host``, the path of its ``lock``,
        its wake-up ``fifo``) and make the first claim, in one queue update; None if the job
        needs no more workers. ``guess_s``: the seconds a task took in this worker's last job
        of the same function (0: unknown), which sizes a first claim (see the module)."""
        with self.store.locked_queue() as q:
            q.forget_dispatched(self.wid)  # arrived, whatever happens next
            if q.cancelled or q.live_members() >= q.max_workers:
                return None
            m = q.join(self.wid, {"pid": pid, "host": host, "python": sys.executable, "version": _PY_VERSION,
                                  "lock": lock, "fifo": fifo, "joined": time.time()})
            if guess_s > 0 and n_done == 0:
                return self._claim_in(q, m, guess_s, 1, sized=True)  # (as if one had run)
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

    def _claim_in(self, q: Queue, m: dict[str, Any], mean_s: float, n_done: int, sized: bool = False) -> Any:
        """Claim tasks in queue state ``q`` (locked) for member ``m`` (this worker's entry);
        ``sized``: ``mean_s`` is a guess from another job (``n_done`` 1: as if a task had run)."""
        wid = self.wid
        self.drained = False
        want, least = claim_size(mean_s, n_done)
        if not q.submitted:
            # Started early, while the client still writes the inputs (a client killed
            # meanwhile never submits: its folder is housekeeping's to remove).
            waited = time.time() - m.get("joined", 0)
            if waited > _EARLY_S or (waited > _CLIENT_LOOK_S and self._client_gone()):
                q.set_member(wid, "left")
                return None
            q.set_member(wid, "waiting")
            return WAIT
        skip = q.cancelled_tasks
        self.attempts = {}
        self.again = False
        for _ in range(2):
            take, were = q.take_reruns(want)
            if were:
                if not take:
                    continue
                self.attempts = {i: q.attempt(i) for i in take}
                self.again = True
                q.set_member(wid, "active", [-1, *take])
                return take
            remaining = q.n - q.next
            if remaining > 0:
                # Guided: a share of what is left, halved while that is more than a few ms of
                # work per worker; at the end, what is left is split evenly at once. A first
                # claim sized by a guess takes at most an even share of the work outstanding
                # (what is left, and what the others hold) between the workers that joined and
                # those on their way (the guess may be wrong).
                if sized:
                    held = sum(records.claim_count(o.get("claim") or []) for w, o in q.members.items()
                               if w != wid and o.get("state") == "active")  # fmt: skip
                    k = min(want, -(-(remaining + held) // (q.live_members() + len(q.dispatched()))))
                else:
                    active = max(1, q.live_members())
                    share = -(-remaining // active)
                    if remaining * mean_s > _TARGET_BATCH_S * active / 2 or n_done == 0:
                        share = -(-share // 2)
                    k = max(least, min(want, share))
                k = min(remaining, k)
                a = q.take_next(k)
                self.drained = k == remaining and not q.later
                if skip and any(i in skip for i in range(a, a + k)):
                    kept = [i for i in range(a, a + k) if i not in skip]
                    q.set_member(wid, "active", [-1, *kept])
                    return kept
                q.set_member(wid, "active", [a, a + k])
                return range(a, a + k)
            if self.on_empty is not None:
                self.on_empty()
            q.set_member(wid, m.get("state", "active"), [])
            if not reap(self.store, q):
                break
        later = q.later
        if later:
            # tasks held for a rerun after an error (retries=ew.Retry): as many workers stay
            # as there are such tasks, waiting until the first is due; the others leave
            waiting = sum(1 for w, o in q.members.items() if w != wid and o.get("state") == "waiting")
            if waiting < len(later):
                self.wake_at = min(later.values())
                q.set_member(wid, "waiting")
                return WAIT
        self.wake_at = None
        if q.closed:
            q.set_member(wid, "left", [])
            self.left = True
            return None
        q.set_member(wid, "waiting")
        return WAIT

    def rerun_later(self, task: int, attempt: int, delay_s: float) -> None:
        """Task ``task`` raised an error that the job runs again (``retries=ew.Retry``): the
        queue holds it, as attempt ``attempt``, for ``delay_s`` seconds; then any worker of
        the job claims it. It leaves this worker's claim."""
        with self.store.locked_queue() as q:
            if q.cancelled or task in q.cancelled_tasks:
                return
            q.rerun_later(task, attempt, time.time() + delay_s, by=self.wid)
        self.store.notify()

    def fixed_attempts(self, tasks: list[int]) -> list[int]:
        """For a worker given its tasks (no membership): those not cancelled (none, if the
        job is), their attempts due in :attr:`attempts`."""
        q = self.store.queue()
        if q.cancelled:
            return []  # (an element started as its job was cancelled)
        self.attempts = {i: q.attempt(i) for i in tasks}
        skip = q.cancelled_tasks
        return [i for i in tasks if i not in skip]

    def _client_gone(self) -> bool:
        pid, host = self.client.get("pid"), self.client.get("host")
        if not isinstance(pid, int) or host != os.uname().nodename:
            return False
        from ..util.system import process_alive

        return not process_alive(pid)

    def lose(self) -> None:
        """Leave the job interrupted (a signal): as if this worker had vanished
        (``journal.reap``): the task it ran is lost (or runs again while the job's retries
        last), the rest of its claim goes back to the queue."""
        with self.store.locked_queue() as q:
            reap(self.store, q, dead={self.wid})
        self.store.notify()

    def fail(self, why: str, given: list[int] | None = None) -> None:
        """Leave the job failed, for reason ``why`` (a full disk, an I/O error, a damaged job
        folder): the tasks of this worker's claim (or those ``given`` it) without an outcome
        fail as lost with ``why``. A member also halts the job (see :func:`write_off`), since
        every worker would meet the same. Writes nothing for a cancelled or purged job, or a
        worker reaped meanwhile."""
        store, wid = self.store, self.wid
        with store.locked_queue() as q:
            m = q.members.get(wid)
            if q.cancelled or (m is not None and m.get("state") == "dead"):
                return
            q.forget_dispatched(wid)
            if given is not None:
                mine = given
            elif m is not None:
                mine = list(records.iter_ranges(m.get("claim") or []))
                q.set_member(wid, "left", [])
            else:
                mine = []
            done = finished_by(store, wid, q) if mine else set()
            write_off(store, q, [t for t in mine if t not in done], why, halt=given is None, by=wid)
        store.notify()

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


def write_off(
    store: JobStore, q: Queue, tasks: list[int], why: str, *, halt: bool, by: str | None = None
) -> None:
    """Fail ``tasks`` as lost, for reason ``why`` (caller holds the queue lock); with ``halt``,
    also every task nobody claimed (``Queue.halt``): the job ends once its workers are done
    with what they hold, and ``job.retry()`` runs them all again. Cancelled tasks keep their
    own outcome. The records go to the journal of worker ``by`` (the worker that writes them
    off: on a full disk, the last page of its own journal most likely has room for them, where
    a first record in ``journal/_control.rec`` needs a new one), else to the reapers'."""
    skip = q.cancelled_tasks
    tasks = [t for t in tasks if t not in skip]
    q.lose_all(tasks, why)
    again, rest = q.halt(why) if halt else ([], range(0))
    now = time.time()
    recs = [records.make_record(Kind.LOST, t, q.attempt(t), t_end=now) for t in tasks + again]
    first = rest.start
    for t in [*sorted(t for t in skip if t in rest), rest.stop]:  # ranges around cancelled tasks
        if t > first:
            recs.append(records.make_record(Kind.LOST, first, 0, count=t - first, t_end=now))
        first = t + 1
    if recs and not (by is not None and _append(store.journal_path(by), recs)):
        store.append_control(recs)


def _append(path: str, recs: list[Any]) -> bool:
    """Append ``recs`` to the journal at ``path`` as one frame, durably; False (the journal as
    it was) if that cannot be done."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        try:
            frame = records.pack_frame(recs)
            if os.write(fd, frame) == len(frame):
                os.fsync(fd)
                return True
        except OSError:
            pass
        try:
            os.ftruncate(fd, size)  # no torn frame: it would hide what comes after it
        except OSError:
            pass
        return False
    finally:
        os.close(fd)
