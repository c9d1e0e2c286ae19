"""A job's tasks as the client sees them.

:class:`Snapshot` is what is known about a job's tasks at one moment (read
from the job folder by the Job, made fresher by its cluster), :class:`Status`
is the answer of ``job.check()`` and :class:`Task` one task of a job.
``_task_error`` turns a failed task's error record into its TaskError, and
:func:`combine` joins the tasks' values as ``job.get()`` does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from . import records
from .errors import TaskError
from .records import Kind
from .states import JobState, TaskState, derive_job_state
from .store import CONTROL

if TYPE_CHECKING:
    from .job import Job
    from .journal import Outcomes


_KIND_STATE = {
    Kind.OK: TaskState.FINISHED,
    Kind.ERROR: TaskState.FAILED,
    Kind.LOST: TaskState.FAILED,
    Kind.CANCELLED: TaskState.CANCELLED,
}


class Snapshot:
    """What is known about a job's tasks at one moment.

    ``reasons`` maps a task index to a short text from the backend (e.g. a
    scheduler's "pending: Resources"); ``running`` maps a running task to
    (worker id, since). (A plain class: importing dataclasses costs a client
    a few milliseconds on its first submission.)
    """

    __slots__ = ("cancelled", "cancelled_tasks", "final", "kind_counts", "n", "note", "reasons", "running",
                 "submitted")

    def __init__(self, n: int, submitted: bool, cancelled: bool, final: Outcomes,
                 running: dict[int, tuple[str, float]], cancelled_tasks: set[int],
                 kind_counts: dict[int, int] | None = None, reasons: dict[int, str] | None = None,
                 note: str = "") -> None:
        self.n = n
        self.submitted = submitted
        self.cancelled = cancelled
        self.final = final
        self.running = running
        self.cancelled_tasks = cancelled_tasks
        self.kind_counts = kind_counts if kind_counts is not None else {}
        self.reasons = reasons if reasons is not None else {}
        self.note = note

    def __repr__(self) -> str:
        return (f"Snapshot(n={self.n}, submitted={self.submitted}, cancelled={self.cancelled}, "
                f"final={len(self.final)}, running={len(self.running)}, note={self.note!r})")

    @property
    def done(self) -> bool:
        """Nothing runs or waits any more (a done job stays done)."""
        return derive_job_state(self.counts()).done

    def task_state(self, i: int) -> TaskState:
        f = self.final.get(i)
        if f is not None:
            return _KIND_STATE[Kind(f[1].kind)]
        if self.cancelled or i in self.cancelled_tasks:
            return TaskState.CANCELLED
        if i in self.running:
            return TaskState.RUNNING
        return TaskState.QUEUED if self.submitted else TaskState.PENDING

    def counts(self) -> dict[TaskState, int]:
        c = dict.fromkeys(TaskState, 0)
        for k, v in self.kind_counts.items():
            c[_KIND_STATE[Kind(k)]] += v
        rest = self.n - len(self.final)
        if self.cancelled:
            c[TaskState.CANCELLED] += rest
            return c
        final = self.final
        cancelled = sum(1 for i in self.cancelled_tasks if i not in final)
        running = sum(1 for i in self.running if i not in final)
        c[TaskState.CANCELLED] += cancelled
        c[TaskState.RUNNING] += running
        c[TaskState.QUEUED if self.submitted else TaskState.PENDING] += max(0, rest - cancelled - running)
        return c


class Status:
    """The answer of ``job.check()``: counts per state; true once nothing runs.

    ``status.counts`` maps each state name to a count; ``status.state`` is the
    job's state; ``status.reasons`` holds backend notes (e.g. why tasks pend).
    """

    def __init__(self, job: Job, counts: dict[TaskState, int], state: JobState, note: str = "",
                 reasons: dict[int, str] | None = None) -> None:
        self.job = job.name
        self.counts = {s.value: n for s, n in counts.items()}
        self.state = state
        self.note = note
        self.reasons = reasons or {}

    def __bool__(self) -> bool:
        return self.state.done

    def __getitem__(self, key: str) -> int:
        return self.counts[key]

    def __getattr__(self, name: str) -> int:
        counts = self.__dict__.get("counts", {})
        if name in counts:
            return counts[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        text = f"<job {self.job!r}: {self.state.value}; {parts or 'no tasks'}>"
        if self.note:
            text += f"  ({self.note})"
        return text

    __str__ = __repr__


class Task:
    """One task of a job: its state, where it ran, its result and log."""

    def __init__(self, job: Job, index: int) -> None:
        self.job = job
        self.index = index

    def __repr__(self) -> str:
        return f"<Task {self.index} of {self.job.name!r}: {self.state.value}>"

    def _final(self) -> tuple[str, records.Record] | None:
        return self.job._snapshot().final.get(self.index)

    @property
    def state(self) -> TaskState:
        """The task's state now."""
        return self.job._snapshot().task_state(self.index)

    @property
    def host(self) -> str:
        """The host the task ran (or runs) on; "" if not started."""
        wid = self._wid()
        return self.job.store.worker_info(wid).get("host", "") if wid else ""

    def _wid(self) -> str | None:
        snap = self.job._snapshot()
        f = snap.final.get(self.index)
        if f is not None:
            if f[0] == CONTROL:
                return self.job.store.queue().get("lost_by", {}).get(str(self.index))
            return f[0]
        r = snap.running.get(self.index)
        return r[0] if r else None

    @property
    def started(self) -> float | None:
        """Unix time the task started; None if it has not."""
        f = self._final()
        if f is not None:
            return f[1].t_start or None
        r = self.job._snapshot().running.get(self.index)
        return r[1] if r else None

    @property
    def finished(self) -> float | None:
        """Unix time the task ended; None if it has not."""
        f = self._final()
        return f[1].t_end if f is not None else None

    @property
    def seconds(self) -> float | None:
        """How long the task ran."""
        f = self._final()
        return (f[1].t_end - f[1].t_start) if f is not None and f[1].t_start else None

    @property
    def result(self) -> Any:
        """The task's value, or its TaskError; raises JobError while unfinished."""
        return self.job._value(self.index)

    def log(self) -> str:
        """The task's captured stdout and stderr."""
        return self.job.log(self.index)

    def cancel(self) -> None:
        """Cancel this task only."""
        self.job.cluster.cancel_task(self.job, self.index)
        self.job._dirty()


def _task_error(value: dict[str, Any], job: str, rec: records.Record) -> TaskError:
    exc = None
    if value.get("exception"):
        try:
            import pickle

            exc = pickle.loads(value["exception"])
        except Exception:
            exc = None
    return TaskError(
        value.get("message", ""),
        type_name=value.get("type", "Exception"),
        traceback=value.get("traceback", ""),
        host=value.get("host", ""),
        index=rec.task,
        seed=rec.seed,
        job=job,
        reason="error",
        exception=exc,
    )


def combine(values: list[Any]) -> Any:
    """Concatenate lists, row-bind DataFrames, else return the list."""
    if values and all(isinstance(v, list) for v in values):
        return [x for v in values for x in v]
    pd = sys.modules.get("pandas")
    if values and pd is not None and all(isinstance(v, pd.DataFrame) for v in values):
        return pd.concat(values, ignore_index=True)
    return list(values)
