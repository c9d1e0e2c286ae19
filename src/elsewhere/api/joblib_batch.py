"""The joblib backend on clusters without the capability "stream" (batch schedulers, ssh
nodes, plugins): joblib's batches of calls sent as jobs of ``ew.submit``.

::

    joblib (its thread, or a callback) ──submit(batch)──> pending
    runner thread:  pending, quiet for GATHER_S ──> one job, a task per batch; on a batch
                    scheduler at most `slots` array elements, each running its tasks in turn
                    each open job ──state, results──> the batches' futures
                         └──> joblib's callbacks, which submit the next batches

Why jobs of several batches: a round trip on a batch scheduler (submission, the queue, a
fresh interpreter that imports the calls' modules) takes seconds, and joblib keeps
``2 * n_jobs`` batches in flight, submitting one as another ends. The batches pending
together go as one job; on a batch scheduler its tasks are packed into at most ``n_jobs``
array elements (``tasks_per_element``), dealt in turn, so that an element runs a few batches
after one start-up and a call with ``pre_dispatch="all"`` is one array job of ``n_jobs``
elements. Each task's result is in the job folder as soon as the task ends, whatever else
its element runs next, so a batch's results reach joblib at once.

Batch sizes (joblib's ``batch_size="auto"``) come from what the workers measure: the time of
a call, and how long an element takes to start its first task (:class:`Sizing`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import copy
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..folder import serial
from ..util.errors import JobGone, JobNotFound, TaskError
from .futures import raised
from .joblib_task import call_batch, large_arguments, share

__all__ = ["BatchRunner", "Sizing", "deal", "objects_to_send_by_value", "packed"]

log = logging.getLogger("elsewhere.api.joblib")

GATHER_S = 0.05
"""Batches that joblib's thread submits within this long of each other go in one job."""
_GATHER_SHARE = 0.1  # those its callbacks submit wait this share of an element's start-up...
_GATHER_MAX_S = 1.0  # ... and none waits longer than this for the others
_LOOK_S = 0.1  # the open jobs' tasks are looked at this often
_POLL_FIRST_S = 0.5  # the scheduler is asked about an open job after this, then less often
_POLL_MAX_S = 5.0


def deal(items: list[Any], hands: int) -> list[list[Any]]:
    """``items`` dealt in turn into at most ``hands`` non-empty lists (each in the items'
    order): the first batches, often the ones a caller waits for first, start first."""
    hands = max(1, min(hands, len(items)))
    return [items[k::hands] for k in range(hands)]


def packed(cluster: Any, per_element: int) -> Any:
    """``cluster``, or on a batch scheduler a copy of it that runs ``per_element`` tasks in each
    array element (one after another, each task's result written as it ends)."""
    from ..backends.batch import BatchCluster

    if not isinstance(cluster, BatchCluster) or per_element <= 1 or cluster.tasks_per_element == per_element:
        return cluster
    twin = copy.copy(cluster)  # the same transport, commands and settings otherwise
    twin.tasks_per_element = per_element
    return twin


def objects_to_send_by_value(batches: list[Any]) -> list[Any]:
    """The functions and classes of joblib's calls (``BatchedCalls.items``: the function,
    scikit-learn's wrapped function, the arguments' types) whose modules may have to travel
    by value (``serial.by_value_for``): the user's own module, where the workers cannot
    import it, goes with the job, as it does for ``ew.map``."""
    seen: dict[str, Any] = {}
    for batch in batches:
        for func, args, kwargs in getattr(batch, "items", ()):
            inner = (getattr(func, "func", None), getattr(func, "function", None))
            for obj in (func, *inner, *args, *kwargs.values()):
                if obj is None:
                    continue
                if not (isinstance(obj, type) or (callable(obj) and hasattr(obj, "__code__"))):
                    obj = type(obj)
                name = getattr(obj, "__module__", None)
                if isinstance(name, str) and name not in seen:
                    seen[name] = obj
    return list(seen.values())


class Sizing:
    """joblib's batch size where a round trip takes seconds: a batch should run about as long
    as an element takes to start its first task (the queue, the interpreter, the imports),
    so that at least half of an element's time is work; between MIN_S and MAX_S of calls; one
    call a batch until the first results."""

    MIN_S = 1.0
    MAX_S = 600.0
    MAX_CALLS = 10_000

    def __init__(self) -> None:
        self.per_call_s: float | None = None
        self.start_s: float | None = None

    def calls_ran(self, calls: int, seconds: float) -> None:
        """A batch of ``calls`` calls ran ``seconds`` on its worker."""
        if calls > 0:
            self.per_call_s = _mean(self.per_call_s, seconds / calls)

    def started(self, seconds: float) -> None:
        """An element started its first task ``seconds`` after its job was submitted."""
        self.start_s = _mean(self.start_s, max(0.0, seconds))

    def batch_size(self) -> int:
        if self.per_call_s is None:
            return 1
        target_s = min(max(self.start_s or 0.0, self.MIN_S), self.MAX_S)
        return max(1, min(self.MAX_CALLS, int(target_s / max(self.per_call_s, 1e-6))))


def _mean(old: float | None, new: float) -> float:
    return new if old is None else 0.7 * old + 0.3 * new


@dataclass(eq=False)
class _Sent:
    """A job sent: per task, the future of its batch and its number of calls; the tasks that
    start an array element; which tasks are still open."""

    job: Any
    tasks: list[tuple[cf.Future, int]]
    firsts: set[int]
    sent_at: float  # time.time(), as the tasks' start times
    left: set[int] = field(default_factory=set)
    polled_at: float = 0.0
    poll_s: float = _POLL_FIRST_S


class BatchRunner:
    """Runs joblib's batches on ``cluster`` as jobs of at most ``slots`` tasks (see the module);
    :meth:`submit` returns a standard Future per batch."""

    def __init__(self, cluster: Any, slots: int, *, name: str, keep: bool, options: dict[str, Any],
                 max_nbytes: int | None = 1 << 20) -> None:  # fmt: skip
        self.cluster = cluster
        self.slots = max(1, slots)
        self.name = name
        self.keep = keep
        self.options = options
        self.max_nbytes = max_nbytes
        self.sizing = Sizing()
        self._lock = threading.Lock()
        self._pending: list[tuple[cf.Future, Any]] = []
        # of them, submitted by joblib's thread: others may follow at once (the runner's own,
        # from joblib's callbacks as futures settle, all came before it looks again)
        self._from_outside = 0
        self._first_at = self._last_at = 0.0
        self._sent: list[_Sent] = []
        self._wake = threading.Event()
        self._closing = False
        self._aborted = False
        self._thread = threading.Thread(target=self._run, name="elsewhere-joblib", daemon=True)
        self._thread.start()

    # -- joblib's side ---------------------------------------------------------------------
    def submit(self, batch: Any) -> cf.Future:
        """Send ``batch`` (a picklable callable: joblib's ``BatchedCalls``) with the others
        submitted at about the same time; its future gets the batch's list of results."""
        fut: cf.Future = cf.Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("this joblib backend was terminated: no new calls")
            now = time.monotonic()
            if not self._pending:
                self._first_at = now
            self._last_at = now
            self._pending.append((fut, batch))
            if threading.current_thread() is not self._thread:
                self._from_outside += 1
        self._wake.set()
        return fut

    def abort(self) -> None:
        """Cancel what is pending and every job sent (joblib raises an error, or its generator
        was dropped): nothing more runs; the jobs are purged."""
        with self._lock:
            self._closing = self._aborted = True
            pending, self._pending = self._pending, []
            sent, self._sent = self._sent, []
        for fut, _ in pending:
            fut.cancel()
        for s in sent:
            with contextlib.suppress(Exception):
                s.job.cancel()
            for fut, _ in s.tasks:
                fut.cancel()
            self._forget(s)
        self._wake.set()

    def close(self, timeout: float = 60.0) -> None:
        """No new calls; wait (at most ``timeout`` s) for the runner to send what is pending
        and settle the futures of what it sent; what is left then is cancelled."""
        with self._lock:
            self._closing = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._thread.is_alive() or self._sent:
            self.abort()

    # -- the runner thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                idle = not self._pending and not self._sent
                done = self._closing and idle
            if done:
                return
            self._wake.wait(None if idle else min(self._gather_left(), _LOOK_S))
            self._wake.clear()
            try:
                due = self._due()
                if due:
                    self._send(due)
                for s in list(self._sent):
                    self._look(s)
                due = self._due()  # what joblib's callbacks just submitted, if it is time
                if due:
                    self._send(due)
            except Exception:  # never dies: joblib would wait for ever on the futures
                if not self._aborted:  # (after abort(), the jobs it looks at may be gone)
                    log.exception("the joblib backend's runner met an error; it goes on")
                time.sleep(_LOOK_S)

    def _gather_left(self) -> float:
        """How long the pending batches wait for others still (0: send them now).

        Those joblib's own thread submits come in a burst: GATHER_S of quiet ends it. Those
        its callbacks submit come as other batches end: where an element takes seconds to
        start (a batch scheduler), waiting a tenth of that (at most 1 s) for more to end puts
        them in one job, with fewer start-ups; on quick clusters it is next to nothing."""
        with self._lock:
            if not self._pending:
                return _LOOK_S
            if self._closing:
                return 0.0
            window = GATHER_S if self._from_outside else _GATHER_SHARE * (self.sizing.start_s or 0.0)
            now = time.monotonic()
            return max(0.0, min(self._last_at + window, self._first_at + _GATHER_MAX_S) - now)

    def _due(self) -> list[tuple[cf.Future, Any]]:
        """The pending batches, once they waited long enough for others (:meth:`_gather_left`)."""
        if self._gather_left() > 0.0:
            return []
        with self._lock:
            due, self._pending, self._from_outside = self._pending, [], 0
        return [(f, b) for f, b in due if not f.cancelled()]

    def _send(self, due: list[tuple[cf.Future, Any]]) -> None:
        from .functions import submit

        # one task per batch, dealt in turn into at most `slots` elements of `per` tasks
        hands = deal(due, self.slots)
        per = math.ceil(len(due) / len(hands))
        order = [item for hand in hands for item in hand]
        batches = [b for _, b in order]
        # a large argument of several batches (GridSearchCV's X and y) goes once, as job data
        shared = large_arguments(batches, self.max_nbytes, seen_twice=True)
        data = {key: obj for key, obj in shared.values()} or None
        try:
            with serial.by_value_for(objects_to_send_by_value(batches) + [type(o) for _, o in shared.values()],
                                     shared_fs=self.cluster.shares_filesystem()):  # fmt: skip
                job = submit(call_batch, [share(b, shared) for b in batches], on=packed(self.cluster, per),
                             name=f"{self.name}-{os.urandom(3).hex()}", job_data=data, **self.options)  # fmt: skip
        except BaseException as exc:  # nothing was sent: each batch fails with why
            for fut, _ in due:
                with contextlib.suppress(cf.InvalidStateError):
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            return
        sent = _Sent(job, [(f, len(b)) for f, b in order], set(range(0, len(order), per)), time.time())
        sent.left = set(range(len(order)))
        sent.polled_at = time.monotonic()
        with self._lock:
            aborted = self._aborted
            if not aborted:
                self._sent.append(sent)
        if aborted:  # abort() came while the job was being submitted
            with contextlib.suppress(Exception):
                job.cancel()
            self._forget(sent)

    def _look(self, s: _Sent) -> None:
        """Settle the futures of ``s``'s tasks that ended; forget ``s`` once all have."""
        from .job import Task

        now = time.monotonic()
        try:
            if now - s.polled_at >= s.poll_s:  # the scheduler's word: lost elements, never-starting ones
                s.polled_at, s.poll_s = now, min(s.poll_s * 1.5, _POLL_MAX_S)
                s.job.check()
            for i in sorted(s.left):
                task: Task[Any] = Task(s.job, i)
                if not task.state.done:
                    continue
                value = task.result
                s.left.discard(i)
                self._settle(s, i, task, value)
        except (JobGone, JobNotFound) as exc:  # purged by someone else: its calls cannot end
            for i in s.left:
                with contextlib.suppress(cf.InvalidStateError):
                    s.tasks[i][0].set_exception(exc)
            s.left.clear()
        if not s.left:
            with self._lock:
                if s in self._sent:
                    self._sent.remove(s)
            self._forget(s)

    def _settle(self, s: _Sent, index: int, task: Any, value: Any) -> None:
        fut, calls = s.tasks[index]
        if isinstance(value, TaskError):  # the batch raised (its call's exception), or was lost
            with contextlib.suppress(cf.InvalidStateError):
                fut.set_exception(raised(value))
            return
        seconds, started = task.seconds, task.started
        if seconds is not None:
            self.sizing.calls_ran(calls, seconds)
        if index in s.firsts and started is not None:
            self.sizing.started(started - s.sent_at)
        with contextlib.suppress(cf.InvalidStateError):
            fut.set_result(value)

    def _forget(self, s: _Sent) -> None:
        if self.keep:
            return
        try:
            s.job.purge()
        except (JobGone, JobNotFound):
            pass  # purged already (abort() and the runner, or someone else)
        except Exception:
            log.warning("the joblib job %r could not be purged", s.job.name, exc_info=True)
