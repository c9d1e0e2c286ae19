"""A job's tasks (:class:`Task`) and the answer of ``job.check()`` (:class:`Status`), as the
user sees them (``job.py`` holds the :class:`~.job.Job` they belong to, and imports this module)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..core import control
from ..util.states import JobState, TaskState
from . import notebook

if TYPE_CHECKING:
    from ..folder import records
    from ..util.errors import TaskError

T = TypeVar("T")  # what the job's function returns

__all__ = ["Status", "Task"]


class Status:
    """The answer of ``job.check()``: counts per state; true once nothing runs.

    ``status.counts`` maps each state name to a count; ``status.state`` is the
    job's state; ``status.reasons`` holds backend notes (e.g. why tasks pend).
    """

    def __init__(self, job: Any, counts: dict[TaskState, int], state: JobState, note: str = "",
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

    def _repr_html_(self) -> str:
        """The counts as HTML, for Jupyter."""
        counts = {TaskState(k): v for k, v in self.counts.items()}
        return notebook.job_html(self.job, "", "", self.state, counts, sum(counts.values()),
                                 note=self.note)  # fmt: skip


class Task(Generic[T]):
    """One task of a job: its state, where it ran, its result and log."""

    def __init__(self, job: Any, index: int) -> None:
        self.job = job  # its Job (typed Any here: this module is imported by job.py)
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
    def worker(self) -> str | None:
        """The id of the worker that ran (or runs) the task (it names the worker's journal,
        results and log in the job folder); None if not started."""
        return self.job._outcomes.worker_of(self.index, self.job._snapshot())

    @property
    def host(self) -> str:
        """The host the task ran (or runs) on; "" if not started."""
        wid = self.worker
        return self.job.store.worker_info(wid).get("host", "") if wid else ""

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
    def attempts(self) -> int:
        """How many times the task has run, a run going on included: 1, and one more for each
        rerun (an error run again by ``retries=ew.Retry(on=...)``, a lost worker's task run
        again, ``job.retry()``); 0 before it first starts."""
        snap = self.job._snapshot()
        f = snap.final.get(self.index)
        if f is not None:
            return int(f[1].attempt) + 1
        before = snap.reruns.get(self.index, 0)  # runs that raised and were run again
        if self.index in snap.running:
            return max(self.job.handle.attempt(self.index), before) + 1
        return before

    @property
    def result(self) -> T | TaskError:
        """The task's value, or its TaskError; raises JobError while unfinished."""
        value: T | TaskError = self.job._value(self.index)
        return value

    def log(self) -> str:
        """The task's captured stdout and stderr."""
        return self.job.log(self.index)

    def cancel(self) -> bool:
        """Cancel this task only: it is marked cancelled in the job folder (it will not start,
        nor run again), then its backend stops it if it runs. The job's other tasks go on,
        and a job whose other tasks finish ends finished. False if the task had ended."""
        done = control.cancel_task(self.job.cluster, self.job.handle, self.index)
        self.job._dirty()
        return done
