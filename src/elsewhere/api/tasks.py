"""A job's tasks as the client sees them.

:class:`Status` is the answer of ``job.check()`` and :class:`Task` one task of a job
(what is known of the tasks at one moment is a :class:`~elsewhere.folder.snapshot.Snapshot`).
``_task_error`` turns a failed task's error record into its TaskError, and
:func:`combine` joins the tasks' values as ``job.get()`` does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..folder import records
from ..folder.store import CONTROL
from ..util.errors import TaskError
from ..util.states import JobState, TaskState

if TYPE_CHECKING:
    from .job import Job


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
