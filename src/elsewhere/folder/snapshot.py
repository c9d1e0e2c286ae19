"""What is known about a job's tasks at one moment, as read from its folder.

A :class:`Snapshot` is made by the reader of a job folder and made fresher by the job's
backend (``Cluster.job_state``); every answer about task states (``job.check()``, ``Task.state``,
``elsewhere status``) is derived from one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..util.states import JobState, TaskState, derive_job_state
from .records import Kind

if TYPE_CHECKING:
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
    (worker id, since); ``damaged`` says what of the job folder was found damaged, one
    line each ("damaged: journal/w3.rec: 104 bytes at byte 4096 skipped (...)"), and
    ``note`` is the backend's note followed by those lines. ``reruns`` maps a task whose error
    was run again (``retries=ew.Retry(on=...)``) to how many of its runs so far raised. (A plain class: importing
    dataclasses costs a client a few milliseconds on its first submission.)
    """

    __slots__ = ("_counts", "_note", "cancelled", "cancelled_tasks", "damaged", "final", "kind_counts", "n",
                 "reasons", "reruns", "running", "submitted")

    def __init__(self, n: int, submitted: bool, cancelled: bool, final: Outcomes,
                 running: dict[int, tuple[str, float]], cancelled_tasks: set[int],
                 kind_counts: dict[int, int] | None = None, reasons: dict[int, str] | None = None,
                 note: str = "", damaged: tuple[str, ...] | list[str] = (),
                 reruns: dict[int, int] | None = None) -> None:  # fmt: skip
        self.n = n
        self.submitted = submitted
        self.cancelled = cancelled
        self.final = final
        self.running = running
        self.cancelled_tasks = cancelled_tasks
        self.kind_counts = kind_counts if kind_counts is not None else {}
        self.reasons = reasons if reasons is not None else {}
        self._note = note
        self.damaged = tuple(damaged)
        self.reruns = reruns if reruns is not None else {}
        self._counts: dict[TaskState, int] | None = None  # counts(), once: a snapshot does not change

    @property
    def note(self) -> str:
        """The backend's note, then what was found damaged (each said once: a backend that
        hands the note it was given back does not repeat the damage)."""
        extra = [d for d in self.damaged if d not in self._note]
        return "; ".join([self._note, *extra] if self._note else extra)

    def __repr__(self) -> str:
        return (f"Snapshot(n={self.n}, submitted={self.submitted}, cancelled={self.cancelled}, "
                f"final={len(self.final)}, running={len(self.running)}, note={self.note!r})")

    def but(self, **changes: Any) -> Snapshot:
        """A copy with ``changes`` (``running``, ``reasons``, ``note``...): a backend's fresher
        view, leaving the snapshot it was given as it was."""
        fields = {name.lstrip("_"): getattr(self, name) for name in self.__slots__ if name != "_counts"}
        fields.update(changes)
        return Snapshot(**fields)

    @property
    def done(self) -> bool:
        """Nothing runs or waits any more (a done job stays done)."""
        return self.job_state().done

    def job_state(self) -> JobState:
        """The job's state: from the task counts, where tasks cancelled one by one do not make
        the job cancelled (a job whose other tasks finished ends finished); only a job
        cancelled as a whole, or whose every task was cancelled, ends cancelled."""
        counts = self.counts()
        state = derive_job_state(counts)
        if state is JobState.CANCELLED and not self.cancelled and counts[TaskState.CANCELLED] < self.n:
            return JobState.FAILED if counts[TaskState.FAILED] else JobState.FINISHED
        return state

    def task_state(self, i: int) -> TaskState:
        """The state of task ``i``."""
        f = self.final.get(i)
        if f is not None:
            return _KIND_STATE[Kind(f[1].kind)]
        if self.cancelled or i in self.cancelled_tasks:
            return TaskState.CANCELLED
        if i in self.running:
            return TaskState.RUNNING
        return TaskState.QUEUED if self.submitted else TaskState.PENDING

    def counts(self) -> dict[TaskState, int]:
        """How many tasks are in each state (every state a key, 0 included)."""
        if self._counts is None:
            self._counts = self._count()
        return dict(self._counts)

    def _count(self) -> dict[TaskState, int]:
        c = dict.fromkeys(TaskState, 0)
        for k, v in self.kind_counts.items():
            c[_KIND_STATE[Kind(k)]] += v
        rest = self.n - len(self.final)
        if self.cancelled:
            c[TaskState.CANCELLED] += rest
            return c
        final = self.final
        cancelled = len(final.absent(self.cancelled_tasks))
        running = len(final.absent(self.running))
        c[TaskState.CANCELLED] += cancelled
        c[TaskState.RUNNING] += running
        c[TaskState.QUEUED if self.submitted else TaskState.PENDING] += max(0, rest - cancelled - running)
        return c
