"""The queue of a job (``queue.json``): which tasks exist, which are claimed and by whom, what
is cancelled, lost or to be run again. This module is its one owner.

:class:`Queue` is the typed state with its named transitions (submit, grow, close, join, claim,
leave, lose, cancel the job, cancel a task, retry, assign, take the unclaimed); every other
module calls them instead of editing the JSON. A transition that the state does not allow raises
:class:`~elsewhere.util.errors.StateError`. Changes are made under ``queue.lock``::

    with store.locked_queue() as q:     # flock, read the newest slot, yield a Queue
        q.cancel_task(3)                # written back (to the other slot) on exit, if changed

and read without the lock from ``store.queue()`` (a snapshot: never change it).

On disk the state is JSON in two slots (``queue.json``, ``queue.b.json``), each written in place
with a generation and a checksum: a write torn by a crash leaves the previous state whole in the
other slot (``queuefile.py``, whose names this module re-exports).

This module is imported by the worker: keep its imports light.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import time

from .queuefile import (
    QUEUE,
    QUEUE_B,
    QUEUE_LOCK,
    json_bytes,
    read_newest,
    read_queue,
    write_queue,
    write_slot,
)
from .queuemembers import Members, refuse

TYPE_CHECKING = False  # no typing at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Protocol

    class JobStore(Protocol):  # what the queue uses of a store (store.py imports this module)
        dir: str
        seen_submitted: bool
        _held: tuple[int, int, int] | None

        def _p(self, *parts: str) -> str: ...

__all__ = [
    "QUEUE",
    "QUEUE_B",
    "QUEUE_LOCK",
    "LockedQueue",
    "Queue",
    "new_queue",
    "read_queue",
    "write_queue",
]



class LockedQueue:
    """``with store.locked_queue() as q``: flock, read, yield, write back if changed."""

    __slots__ = ("body", "fd", "gen", "q", "slot", "store")

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def __enter__(self) -> Queue:
        held = self.store._held
        self.fd = held[0] if held else os.open(self.store._p(QUEUE_LOCK), os.O_RDWR)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            if held and os.fstat(held[1]).st_nlink == 0:  # the folder was purged: as if opened by path
                raise FileNotFoundError(self.store._p(QUEUE))
            try:
                self.gen, self.slot, q, self.body = read_newest(self.store)
            except FileNotFoundError:
                self.gen, self.slot, q, self.body = 0, 1, new_queue(0), b""
        except BaseException:
            self._release()
            raise
        self.q = q
        return Queue(q)

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if exc_type is None:
                body = json_bytes(self.q)  # the state read encodes to the bytes read: unchanged
                if body != self.body:
                    # over the older slot: the one just read stays whole if this write is torn
                    write_slot(self.store, body, self.gen + 1, 1 - self.slot)
                if self.q.get("submitted"):
                    self.store.seen_submitted = True
        finally:
            self._release()

    def _release(self) -> None:
        if self.store._held:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        else:
            os.close(self.fd)  # releases the lock


def new_queue(n: int, *, closed: bool = True, max_workers: int = 1, retries: int = 0) -> dict[str, Any]:
    """A fresh queue state for ``n`` tasks (the raw JSON state; ``Queue(new_queue(n))`` to use it)."""
    return {
        "n": n,
        "next": 0,
        "closed": closed,
        "cancelled": False,
        "retry": [],
        "attempts": {},
        "max_workers": max_workers,
        "retries": retries,
        "members": {},
        "cancelled_tasks": [],
        "submitted": False,
    }


class Queue(Members):
    """The state of a job's queue, changed only by its named transitions (those of a worker's
    membership and claims are :class:`~.queuemembers.Members`').

    Read-only properties tell the state; the transitions check it and raise
    :class:`~elsewhere.util.errors.StateError` on a move it does not allow (a task index
    outside the job, growing a closed job, ...). Which task *outcomes* exist is not the
    queue's to know (the journals hold them): callers that must know a task's state first
    (cancelling a finished task, retrying a running one) check it with
    :func:`elsewhere.util.states.check_move` before they call a transition.

    Task indices are ints; on disk, in JSON, maps are keyed by their decimal text.
    """

    __slots__ = ("d",)

    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    def __repr__(self) -> str:
        return (f"Queue(n={self.n}, next={self.next}, submitted={self.submitted}, "
                f"cancelled={self.cancelled}, closed={self.closed}, members={len(self.members)})")

    # -- the state, read-only --------------------------------------------------------
    @property
    def n(self) -> int:
        """How many tasks the job has (a stream job's count grows)."""
        return int(self.d.get("n", 0))

    @property
    def next(self) -> int:
        """The first task never claimed nor assigned; tasks below it have had a worker."""
        return int(self.d.get("next", 0))

    @property
    def closed(self) -> bool:
        """No task will be added (every job but an open stream)."""
        return bool(self.d.get("closed", True))

    @property
    def submitted(self) -> bool:
        """The job is in its backend's hands."""
        return bool(self.d.get("submitted"))

    @property
    def cancelled(self) -> bool:
        """The whole job is cancelled: nothing new starts."""
        return bool(self.d.get("cancelled"))

    @property
    def cancel_reason(self) -> str | None:
        """Why the whole job was cancelled, where the library cancelled it (a job it waits
        for failed, or was cancelled: ``after=``); None for a plain cancel."""
        why = self.d.get("cancel_reason")
        return str(why) if why and self.cancelled else None

    @property
    def held(self) -> list[str]:
        """The ids of the jobs this one waits for before its tasks are handed to its cluster
        (``after=``, held by the library); empty once released (or never held)."""
        return [str(j) for j in self.d.get("after", ())]

    @property
    def retries(self) -> int:
        """How many times a task whose worker was lost runs again."""
        return int(self.d.get("retries", 0))

    @property
    def max_workers(self) -> int:
        """How many workers may take part at once."""
        return int(self.d.get("max_workers", 1))

    @property
    def members(self) -> dict[str, dict[str, Any]]:
        """The workers that joined: ``{worker id: {"state", "claim", "pid", "host", ...}}``."""
        return self.d.setdefault("members", {})

    @property
    def cancelled_tasks(self) -> frozenset[int]:
        """Tasks cancelled one by one."""
        return frozenset(int(t) for t in self.d.get("cancelled_tasks", ()))

    @property
    def to_rerun(self) -> list[int]:
        """Tasks waiting to be claimed again (retried or given back by a lost worker), in order,
        then those held until their rerun is due (:meth:`rerun_later`)."""
        return list(self.d.get("retry", ())) + sorted(self.later, key=self.later.__getitem__)

    @property
    def later(self) -> dict[int, float]:
        """Tasks whose error is run again after a wait (``retries=ew.Retry(...)``): ``{task:
        the unix time it may be claimed again}``."""
        return {int(t): float(due) for t, due in self.d.get("later", {}).items()}

    @property
    def reruns(self) -> dict[int, int]:
        """Tasks run again by a retry: ``{task: attempt}``; outcomes of earlier attempts are void."""
        return {int(t): int(a) for t, a in self.d.get("rerun", {}).items()}

    def attempt(self, task: int, default: int = 0) -> int:
        """The attempt now due of ``task`` (``default``, 0, before any rerun)."""
        return int(self.d.get("attempts", {}).get(str(task), default))

    def attempts(self) -> dict[int, int]:
        """Every task run again so far, with the attempt now due."""
        return {int(t): int(a) for t, a in self.d.get("attempts", {}).items()}

    def retried_at(self, task: int) -> float:
        """When ``task`` was last put to run again (0.0: never): a worker started before
        then ran an earlier attempt."""
        return float(self.d.get("retried_at", {}).get(str(task), 0.0))

    def lost_reason(self, task: int) -> str | None:
        """Why ``task`` ended without a result, if its backend reported it lost (``report_lost``),
        a failed worker wrote it off, or the job was halted (:meth:`halt`)."""
        why = self.d.get("lost_reason", {}).get(str(task))
        if why is None:
            for first, end, reason in self.d.get("lost_ranges", ()):
                if first <= task < end:
                    return str(reason)
        return why

    def lost_by(self, task: int) -> str | None:
        """The worker that vanished while it ran ``task``, if one did."""
        return self.d.get("lost_by", {}).get(str(task))

    def live_members(self) -> int:
        """Workers that joined and have not left nor died."""
        return sum(1 for m in self.members.values() if m.get("state") in ("active", "waiting"))

    def waiting_fifos(self) -> list[str]:
        """The wake-up FIFOs of the workers waiting for more tasks (an open stream job)."""
        return [m.get("fifo") or "" for m in self.members.values() if m.get("state") == "waiting"]

    def unclaimed(self) -> int:
        """Tasks that still want a worker: never claimed, or to run again."""
        return max(0, self.n - self.next) + len(self.d.get("retry", ())) + len(self.d.get("later", ()))

    # -- transitions ---------------------------------------------------------------------
    def _check_task(self, task: int, what: str) -> None:
        if not isinstance(task, int) or isinstance(task, bool) or not 0 <= task < self.n:
            raise refuse(f"cannot {what} task {task!r}: the job has tasks 0..{self.n - 1}")

    def submit(self, *, assigned: int | None = None, max_workers: int | None = None) -> None:
        """The job is now in its backend's hands. ``assigned``: the backend gave its tasks
        ``0..assigned-1`` to workers itself (array elements, ranks) and nothing claims them
        from the queue; ``max_workers``: how many workers may join."""
        self.d["submitted"] = True
        if assigned is not None:
            if not 0 <= assigned <= self.n:
                raise refuse(f"cannot assign {assigned} tasks of a job of {self.n}")
            self.d["next"] = max(self.next, assigned)
        if max_workers is not None:
            self.set_max_workers(max_workers)

    def reset(self, fresh: dict[str, Any]) -> None:
        """Replace the whole state by ``fresh`` (a node's copy of a job made to hold its share)."""
        self.d.clear()
        self.d.update(fresh)

    def set_max_workers(self, n: int) -> None:
        """How many workers may take part at once (at least 1)."""
        self.d["max_workers"] = max(1, int(n))

    def grow(self, n: int) -> None:
        """An open stream job now has ``n`` tasks (never fewer than before)."""
        if self.closed and n > self.n:
            raise refuse(f"cannot add tasks to a closed job (it has {self.n})")
        self.d["n"] = max(self.n, int(n))

    def set_size(self, n: int) -> None:
        """The task count of a job being made, before it is submitted."""
        if self.submitted:
            raise refuse("the task count of a submitted job is fixed")
        self.d["n"] = int(n)

    def close(self) -> None:
        """No more tasks will be added to this (stream) job."""
        self.d["closed"] = True

    def hold(self, job_ids: Iterable[str]) -> None:
        """The job waits for the jobs ``job_ids`` (``after=``) before it is handed to its
        cluster: only before it is submitted."""
        if self.submitted:
            raise refuse("a submitted job is in its cluster's hands: it cannot be held any more")
        self.d["after"] = [str(j) for j in job_ids]

    def release(self) -> None:
        """The jobs it waited for finished: it may be handed to its cluster."""
        self.d.pop("after", None)

    def cancel_job(self, reason: str | None = None) -> list[dict[str, Any]]:
        """Cancel the whole job: nothing new starts, nothing is run again (``reason``: why,
        where the library cancels it). Returns the members that were working (their
        processes are the backend's to stop)."""
        if reason and not self.cancelled:
            self.d["cancel_reason"] = reason
        self.d.pop("after", None)
        self.d["cancelled"] = True
        self.d["retry"] = []
        self.d.pop("later", None)
        return [m for m in self.members.values() if m.get("state") in ("active", "waiting")]

    def cancel_task(self, task: int) -> None:
        """Cancel one task: it does not start (or run again); a result that comes is kept."""
        self._check_task(task, "cancel")
        ct = set(self.d.get("cancelled_tasks", ()))
        ct.add(task)
        self.d["cancelled_tasks"] = sorted(ct)
        retry = self.d.get("retry") or []
        if task in retry:
            retry.remove(task)
        self.d.get("later", {}).pop(str(task), None)

    def retry(self, attempts: dict[int, int]) -> None:
        """Run tasks again: ``{task: its new attempt number}``. The job is no longer cancelled;
        the earlier outcomes of those tasks are void (``reruns``); their lost reasons go."""
        for t in attempts:
            self._check_task(t, "retry")
        self.d["cancelled"] = False
        self.d.pop("cancel_reason", None)
        cancelled = set(self.d.get("cancelled_tasks", ())) - set(attempts)
        self.d["cancelled_tasks"] = sorted(cancelled)
        rerun = self.d.setdefault("rerun", {})
        att = self.d.setdefault("attempts", {})
        lost = self.d.get("lost_reason", {})
        when = self.d.setdefault("retried_at", {})
        now = time.time()
        for t, a in attempts.items():
            att[str(t)] = int(a)
            rerun[str(t)] = int(a)
            when[str(t)] = now
            lost.pop(str(t), None)
        if self.d.get("lost_ranges"):
            self.d["lost_ranges"] = _cut(self.d["lost_ranges"], sorted(attempts))
        have = self.d.setdefault("retry", [])
        seen = set(have)
        have += [t for t in sorted(attempts) if t not in seen]
        later = self.d.get("later")
        if later:
            for t in attempts:
                later.pop(str(t), None)

    def rerun_later(self, task: int, attempt: int, due: float, *, by: str | None = None) -> None:
        """Run ``task`` again as attempt ``attempt``, claimed no sooner than ``due`` (a unix
        time): its run before raised an error that ``retries=ew.Retry(...)`` runs again. ``by``:
        the worker whose claim held it (it no longer does: a reaper must not give it back)."""
        self._check_task(task, "rerun")
        self.d.setdefault("attempts", {})[str(task)] = int(attempt)
        self.d.setdefault("later", {})[str(task)] = float(due)
        retry = self.d.get("retry")
        if retry and task in retry:
            retry.remove(task)
        m = self.members.get(by) if by is not None else None
        if m is not None and m.get("claim"):
            from .records import iter_ranges

            m["claim"] = [-1, *(t for t in iter_ranges(m["claim"]) if t != task)]

    def _due(self, now: float) -> None:
        """Tasks held for a rerun whose time has come go to the tasks to claim first."""
        later = self.d.get("later")
        if not later:
            return
        due = sorted((float(d), int(t)) for t, d in later.items() if float(d) <= now)
        if due:
            retry = self.d.setdefault("retry", [])
            for _, t in due:
                del later[str(t)]
                if t not in retry:
                    retry.append(t)
            if not later:
                del self.d["later"]

    def requeue(self, tasks: Iterable[int], *, lost_attempt: bool = False) -> None:
        """Put ``tasks`` back to be claimed first (a lost worker's unfinished claim). With
        ``lost_attempt``, each counts one more attempt (the task was running when it was lost).
        A task that waits to be claimed again already is not put back twice."""
        waiting = set(self.d.get("retry", ())) | {int(t) for t in self.d.get("later", ())}
        tasks = [t for t in tasks if t not in waiting]
        if lost_attempt:
            att = self.d.setdefault("attempts", {})
            for t in tasks:
                att[str(t)] = att.get(str(t), 0) + 1
        self.d.setdefault("retry", [])[:0] = tasks

    def assign(self, tasks: Iterable[int]) -> None:
        """The backend gave ``tasks`` to workers itself (array elements given their tasks):
        none of them is to be claimed any more (from the tasks to run again, or held)."""
        given = set(tasks)
        retry = self.d.get("retry")
        if retry:
            self.d["retry"] = [t for t in retry if t not in given]
        later = self.d.get("later")
        if later:
            for t in given:
                later.pop(str(t), None)
            if not later:
                del self.d["later"]

    def take_unclaimed(self) -> list[int]:
        """Take every task that still wants a worker (to run again, held for a later rerun,
        never claimed) out of the queue, and return them: the workers that would claim them
        are all gone, so their backend reports them lost or starts them afresh."""
        self._due(float("inf"))
        again, _ = self.take_reruns(len(self.d.get("retry", ())))
        first, end = self.next, self.n
        self.d["next"] = max(first, end)
        return [*again, *range(first, end)]

    def count_attempt(self, task: int) -> int:
        """One more attempt of ``task`` was used up (its worker was lost while it ran); the
        number of attempts used."""
        att = self.d.setdefault("attempts", {})
        att[str(task)] = att.get(str(task), 0) + 1
        return int(att[str(task)])

    def lose(self, task: int, *, reason: str | None = None, by: str | None = None) -> None:
        """Record why ``task`` ended without a result: the backend's ``reason`` (its
        TaskError's message), or the worker ``by`` that vanished while it ran it."""
        if reason is not None:
            self.d.setdefault("lost_reason", {})[str(task)] = reason
        if by is not None:
            self.d.setdefault("lost_by", {})[str(task)] = by

    def lose_all(self, tasks: Iterable[int], reason: str) -> None:
        """Record ``reason`` for many ``tasks`` that ended without a result, kept as runs of
        consecutive tasks (a failed worker's claim, a halted job's rest: one entry each)."""
        runs = self.d.setdefault("lost_ranges", [])
        for t in sorted(tasks):
            if runs and runs[-1][1] == t and runs[-1][2] == reason:
                runs[-1][1] = t + 1
            else:
                runs.append([t, t + 1, reason])

    def halt(self, reason: str) -> tuple[list[int], range]:
        """Hand out nothing more: the tasks to run again and those never claimed end without a
        result, for ``reason`` (a full disk, a damaged job folder); what members claimed is
        theirs. Returns (the tasks to run again, the range never claimed): their "lost" records
        are the caller's to write (cancelled tasks keep their own outcome)."""
        self._due(float("inf"))  # held for a later rerun: they end too
        again, _ = self.take_reruns(len(self.to_rerun))
        first, end = self.next, self.n
        self.d["next"] = max(first, end)
        self.lose_all([*again, *range(first, end)], reason)
        return again, range(first, end)

    def take_reruns(self, want: int) -> tuple[list[int], bool]:
        """Up to ``want`` tasks of those to run again, first come first (cancelled ones are
        dropped; those held for a later rerun only once it is due); (the tasks, whether any
        were waiting)."""
        if "later" in self.d:
            self._due(time.time())
        retry = self.d.get("retry")
        if not retry:
            return [], False
        skip = self.d.get("cancelled_tasks")
        take = [i for i in retry[:want] if not skip or i not in skip]
        del retry[:want]
        return take, True


def _cut(ranges: list[list[Any]], tasks: list[int]) -> list[list[Any]]:
    """``ranges`` (``[first, end, reason]``) without the (sorted) ``tasks``."""
    out = []
    for first, end, why in ranges:
        for t in tasks[bisect.bisect_left(tasks, first) : bisect.bisect_left(tasks, end)]:
            if t > first:
                out.append([first, t, why])
            first = t + 1
        if end > first:
            out.append([first, end, why])
    return out
