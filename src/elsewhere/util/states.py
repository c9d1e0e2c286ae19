"""One vocabulary of task and job states for every backend.

A task moves forward only::

    pending -> queued -> running -> finished | failed | cancelled

(``pending``: created, not yet handed to anything; ``queued``: handed to a
scheduler, a worker pool or a peer; ``running``: a worker has started it.)
The one move backwards is an explicit retry, which puts a ``failed`` or
``cancelled`` task back to ``queued``.

A job's state is derived from the states of its tasks (:func:`derive_job_state`).
Backends translate native scheduler states with a table into these states; an
unknown native state maps to ``None`` ("unknown"), which callers log and
ignore, never crash on.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping


class TaskState(str, enum.Enum):
    """The state of one task."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        """True for the terminal states: finished, failed, cancelled."""
        return self in TERMINAL

    def __str__(self) -> str:
        return self.value


class JobState(str, enum.Enum):
    """The state of a job, derived from its tasks."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        """True once nothing of the job runs or waits to run any more."""
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)

    @property
    def rank(self) -> int:
        """Order used by ``Job.wait(state=...)``: every terminal state ranks last."""
        return _RANK[self]

    def __str__(self) -> str:
        return self.value


TERMINAL = frozenset({TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED})

_RANK = {
    JobState.PENDING: 0,
    JobState.QUEUED: 1,
    JobState.RUNNING: 2,
    JobState.FINISHED: 3,
    JobState.FAILED: 3,
    JobState.CANCELLED: 3,
}

_ORDER = {
    TaskState.PENDING: 0,
    TaskState.QUEUED: 1,
    TaskState.RUNNING: 2,
    TaskState.FINISHED: 3,
    TaskState.FAILED: 3,
    TaskState.CANCELLED: 3,
}


def can_move(old: TaskState, new: TaskState, *, retry: bool = False) -> bool:
    """Whether a task may move from ``old`` to ``new``.

    States only move forward; a terminal state is final unless ``retry`` is
    set, which allows ``failed``/``cancelled`` -> ``queued``.
    """
    if old == new:
        return True
    if retry and old in (TaskState.FAILED, TaskState.CANCELLED) and new is TaskState.QUEUED:
        return True
    if old in TERMINAL:
        return False
    return _ORDER[new] > _ORDER[old]


def check_move(old: TaskState, new: TaskState, *, task: int, job: str = "", retry: bool = False) -> None:
    """Raise :class:`~elsewhere.util.errors.StateError` unless ``task`` may move from ``old``
    to ``new`` (see :func:`can_move`); the message names the job, the task and both states."""
    if not can_move(old, new, retry=retry):
        from .errors import StateError

        of = f" of job {job!r}" if job else ""
        raise StateError(f"task {task}{of} cannot move from {old.value} to {new.value}"
                         + (" (only failed or cancelled tasks are retried)" if retry else ""))


def count_states(states: Iterable[TaskState]) -> dict[TaskState, int]:
    """Count tasks per state; every state is present, zero when unused."""
    counts = dict.fromkeys(TaskState, 0)
    for s in states:
        counts[s] += 1
    return counts


def derive_job_state(counts: Mapping[TaskState, int]) -> JobState:
    """The job state that a set of task-state counts implies.

    Anything running makes the job running; else anything queued makes it
    queued; else anything pending makes it pending. A job whose tasks are all
    terminal is ``cancelled`` if any task was cancelled, ``failed`` if any
    failed, else ``finished``. A job without tasks is ``pending``.
    """
    total = sum(counts.values())
    if total == 0:
        return JobState.PENDING
    if counts.get(TaskState.RUNNING, 0):
        return JobState.RUNNING
    if counts.get(TaskState.QUEUED, 0):
        # Some tasks done and some still waiting: the job as a whole is under way.
        if any(counts.get(s, 0) for s in TERMINAL):
            return JobState.RUNNING
        return JobState.QUEUED
    if counts.get(TaskState.PENDING, 0):
        return JobState.PENDING
    if counts.get(TaskState.CANCELLED, 0):
        return JobState.CANCELLED
    if counts.get(TaskState.FAILED, 0):
        return JobState.FAILED
    return JobState.FINISHED
