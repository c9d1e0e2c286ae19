"""A job as the user sees it.

A :class:`Job` is a view of a job folder plus the cluster that runs it.
Nothing important lives only in this object: a job recovered by name in a
new process (``ew.recover``) is the same job. Its tasks, the snapshots it
reads and the answer of ``check()`` are in ``tasks.py``; iterating over results as they
finish in ``completion.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from ..backends.base import Cluster
from ..core import control, waiting
from ..core.submit import as_entries, submit_job
from ..folder.handle import JobHandle
from ..folder.lifecycle import busy
from ..folder.outcomes import OutcomeReader
from ..folder.snapshot import Snapshot
from ..folder.store import JobStore
from ..util.errors import ConfigError, JobError, TaskError
from ..util.states import JobState
from ..util.units import parse_duration
from . import notebook
from .completion import Completed, in_thread
from .tasks import Status as Status
from .tasks import Task as Task

if TYPE_CHECKING:
    import threading

_REMOTE_LOOK_S = 1.0  # a state read of a job whose workers write elsewhere polls at most this often

T = TypeVar("T")  # what the job's function returns (Any for create_job and recover)


class Job(Generic[T]):
    """A job: tasks that run on a cluster, kept in a job folder.

    Made by :func:`elsewhere.submit`, :func:`elsewhere.create_job` or
    :func:`elsewhere.recover`; not constructed directly. For type checkers a job is
    ``Job[T]``, ``T`` being what its function returns (``ew.submit(f, ...)`` with
    ``f`` returning ``int`` is a ``Job[int]``).
    """

    def __init__(self, store: JobStore, cluster: Cluster, meta: dict[str, Any] | None = None, *,
                 job_data: Any = None, queue_n: int | None = None) -> None:  # fmt: skip
        self.store = store
        self.cluster = cluster
        self._meta = meta if meta is not None else store.meta()
        self._handle = JobHandle(store, self._meta, restart=control.restarter(cluster))
        self._reader = self._handle.reader
        self._outcomes = OutcomeReader(self._handle)
        self._snap: Snapshot | None = None
        self._snap_at = 0.0
        self._polled_at = 0.0
        self._staged: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self._common_fn: Any = None
        self._job_data: Any = job_data
        self._queue_n: int | None = queue_n  # the task count the queue was written with, if known
        self._failed: list[int] = []  # tasks whose entry in the last results() is a TaskError

    # -- properties -----------------------------------------------------------
    @property
    def name(self) -> str:
        """The job's name (unique among running jobs)."""
        return self._meta["name"]

    @property
    def id(self) -> str:
        """The job's id (unique forever)."""
        return self._meta["id"]

    @property
    def user(self) -> str:
        """The user who made the job."""
        return self._meta.get("user", "")

    @property
    def tag(self) -> str:
        """The free text given as ``tag=``."""
        return self._meta.get("tag", "")

    @property
    def seed(self) -> int:
        """The job's seed; task i runs with seed + i."""
        return int(self._meta.get("seed") or 0)

    @property
    def created(self) -> float:
        """Unix time the job was made."""
        return self._meta.get("created", 0.0)

    @property
    def submitted(self) -> float | None:
        """Unix time the job was submitted; None before ``submit()``."""
        return self._meta.get("submitted")

    @property
    def started(self) -> float | None:
        """When the first task started."""
        snap = self._snapshot()
        times = [r.t_start for _, r in snap.final.values() if r.t_start]
        times += [t for _, t in snap.running.values()]
        return min(times) if times else None

    @property
    def finished(self) -> float | None:
        """When the last task ended, once the job is done."""
        snap = self._snapshot()
        if not self.state.done:
            return None
        times = [r.t_end for _, r in snap.final.values()]
        return max(times) if times else None

    @property
    def handle(self) -> JobHandle:
        """What the job's backend sees of it (:class:`~elsewhere.folder.handle.JobHandle`):
        for plugins' tests and tools; users do not need it."""
        return self._handle

    @property
    def path(self) -> Path:
        """The job folder."""
        return self.store.path

    @property
    def n_tasks(self) -> int:
        """How many tasks the job has (those added before ``submit()`` included)."""
        if self._meta.get("stream"):
            return self.store.queue().n
        return int(self._meta.get("n_tasks", 0)) + len(self._staged)

    @property
    def tasks(self) -> list[Task[T]]:
        """The job's tasks, in order."""
        return [Task(self, i) for i in range(self.n_tasks)]

    @property
    def state(self) -> JobState:
        """The job's state now."""
        return self._snapshot(fresh=True).job_state()

    def __repr__(self) -> str:
        return f"<Job {self.name!r} ({self.id}) on {self.cluster.kind}: {self.state.value}, {self.n_tasks} tasks>"

    def __len__(self) -> int:
        return self.n_tasks

    def _repr_html_(self) -> str:
        """The job as HTML, for Jupyter: its state, a bar and its task counts."""
        snap = self._snapshot(fresh=True)
        return notebook.job_html(self.name, self.id, self.cluster.kind, snap.job_state(), snap.counts(),
                                 snap.n, note=snap.note, created=self.created)  # fmt: skip

    # -- building ---------------------------------------------------------------
    def add_task(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Task[T]:
        """Add a task ``fn(*args, **kwargs)``; only before ``submit()``."""
        if self._meta.get("submitted"):
            raise JobError(f"job {self.name!r} is already submitted; tasks can only be added before")
        if not callable(fn):
            raise ConfigError(f"add_task needs a callable first, not {fn!r}")
        self._staged.append((fn, args, kwargs))
        return Task(self, self.n_tasks - 1)

    def submit(self) -> Job[T]:
        """Write the staged tasks and hand the job to its cluster; returns at once."""
        if self._meta.get("submitted"):
            raise JobError(f"job {self.name!r} was already submitted")
        if not self._staged:  # it would wait for ever (as MATLAB, a job needs a task)
            raise ConfigError(f"job {self.name!r} has no tasks: add them with job.add_task(fn, ...) first")
        write_and_submit(self)
        return self

    # -- following ---------------------------------------------------------------
    def _dirty(self) -> None:
        self._snap = None

    def _snapshot(self, fresh: bool = False) -> Snapshot:
        now = time.monotonic()
        if self._snap is not None and not fresh and now - self._snap_at < 0.05:
            return self._snap
        if (not self.cluster.shares_filesystem() and now - self._polled_at >= _REMOTE_LOOK_S
                and self._meta.get("submitted")):  # fmt: skip
            # Where workers write elsewhere, what they did arrives by polling: a state read
            # here (job.state, Task.state) looks there too, at most every _REMOTE_LOOK_S.
            self._polled_at = now
            control.poll(self.cluster, self._handle)
        snap = control.snapshot(self.cluster, self._handle)
        self._snap, self._snap_at = snap, now
        return snap

    def check(self) -> Status:
        """Counts of tasks per state; true once nothing runs or waits.

        Also finds workers that vanished (their running task becomes
        failed/"lost", or is retried) and starts replacements.
        """
        if self._meta.get("submitted"):
            control.poll(self.cluster, self._handle)
        snap = self._snapshot(fresh=True)
        return Status(self, snap.counts(), snap.job_state(), snap.note, snap.reasons)

    def _done(self, snap: Snapshot) -> bool:
        return snap.job_state().done

    def wait(
        self,
        timeout: float | str | None = None,
        *,
        state: str | JobState = "finished",
        progress: bool | None = None,
        poll_interval_s: float = 0.5,
    ) -> Job[T]:
        """Block until the job reaches ``state`` (default: done), or ``timeout`` seconds.

        ``state`` follows MATLAB's ``waitForState``: "queued", "running" or
        "finished" (any end: finished, failed, cancelled). A progress bar
        shows on a terminal after a couple of seconds (``progress=False``
        turns it off; ``progress=True`` shows it in a Jupyter notebook too).
        Raises :class:`elsewhere.TimeoutError` when the time runs out; the job
        goes on running. ``timeout`` is seconds or a duration
        as ``"10min"`` (docs/units.md).
        """
        timeout_s = parse_duration(timeout, what="timeout")
        try:
            target = JobState(state)  # a JobState is its own value
        except (ValueError, TypeError):
            raise ConfigError(f"state must be one of {', '.join(s.value for s in JobState)} (a job's states), "
                              f"not {state!r}") from None  # fmt: skip
        if not self._meta.get("submitted") and target.rank > JobState.PENDING.rank:
            raise JobError(f"job {self.name!r} is not submitted; call job.submit() first")
        n_known = 0 if self._meta.get("stream") or target is not JobState.FINISHED else self.n_tasks
        snap = None
        try:
            snap = waiting.wait_for(self.cluster, self._handle, target, timeout=timeout_s, progress=progress,
                                    poll_interval_s=poll_interval_s, n_known=n_known)  # fmt: skip
        finally:
            self._dirty()
        if snap is not None and snap.done and self.cluster.shares_filesystem():
            # the look that saw the end: results() reads by it (where workers write elsewhere,
            # results() fetches what they wrote first: see _snapshot)
            self._snap, self._snap_at = snap, time.monotonic()
        return self

    def as_completed(self, timeout: float | str | None = None, *, errors: str = "return",
                     poll_interval_s: float = 0.5) -> Completed[T]:  # fmt: skip
        """Each task's ``(index, result)`` as it finishes, in the order they finish.

        ``for i, result in job.as_completed():`` gives every task once, as soon as its outcome
        is in the job folder (the wait sleeps on the job's notifications, as :meth:`wait`
        does), and ends when the job has ended. A result is what :meth:`results` gives for
        that task: a failed task's is its :class:`~elsewhere.TaskError` (a lost task's says
        why); once the job has ended, its cancelled tasks come last, each with a TaskError of
        reason "cancelled". ``errors="raise"`` raises a failed task's error instead, as its
        original type where possible (as :meth:`get` and ``ew.map`` do); the iteration may go
        on after it. ``timeout`` (seconds or a duration, counted from this call, as
        ``concurrent.futures.as_completed``) raises :class:`elsewhere.TimeoutError` saying
        how many tasks are left; the job goes on running.

        ``async for i, result in job.as_completed():`` (or ``async for ... in job``) is the
        same for asyncio code: it waits in a thread, so the event loop runs on, and
        cancelling the awaiting task ends that thread's wait.
        """
        if not self._meta.get("submitted"):
            raise JobError(f"job {self.name!r} is not submitted; call job.submit() first")
        timeout_s = parse_duration(timeout, what="timeout")
        return Completed(self._handle, self.cluster, self._outcomes, timeout=timeout_s, errors=errors,
                         poll_interval_s=poll_interval_s)  # fmt: skip

    def __aiter__(self) -> Completed[T]:
        """``async for i, result in job``: :meth:`as_completed`, for asyncio code."""
        return self.as_completed()

    def __await__(self) -> Generator[Any, None, list[T | TaskError]]:
        """``await job``: the job's :meth:`results` once it has ended, for asyncio code.

        The wait runs in a thread, so the event loop runs on; cancel the awaiting task (or
        use ``asyncio.timeout``) to stop waiting: the thread stops too, and the job goes on.
        """
        return in_thread(self._wait_stoppable).__await__()

    def _wait_stoppable(self, stop: threading.Event) -> list[T | TaskError]:
        """:meth:`wait` then :meth:`results`, the wait ending early once ``stop`` is set."""
        if not self._meta.get("submitted"):
            raise JobError(f"job {self.name!r} is not submitted; call job.submit() first")
        n_known = 0 if self._meta.get("stream") else self.n_tasks
        try:
            waiting.wait_for(self.cluster, self._handle, JobState.FINISHED, timeout=None, progress=False,
                             poll_interval_s=0.5, n_known=n_known, until=stop.is_set)  # fmt: skip
        finally:
            self._dirty()
        if stop.is_set():
            return []  # its awaiter was cancelled: no one reads this
        return self.results()

    # -- results ------------------------------------------------------------------
    def _value(self, index: int) -> Any:
        """Task ``index``'s value or TaskError (for ``Task.result`` and the Executor)."""
        value = self._outcomes.value(index, None if index in self._reader.final else self._snapshot())
        if isinstance(value, TaskError) and self._meta.get("communicating"):
            value.rank = index
        return value

    @overload
    def results(self, *, partial: Literal[False] = False) -> list[T | TaskError]: ...
    @overload
    def results(self, *, partial: bool) -> list[T | TaskError | None]: ...
    def results(self, *, partial: bool = False) -> list[Any]:
        """One entry per task, in task order; a failed task's entry is a TaskError.

        Raises JobError while tasks are unfinished, unless ``partial=True``
        (then unfinished tasks give None).
        """
        with busy():
            snap = self._snapshot()
            if len(snap.final) < snap.n or not snap.done:  # a done job's outcomes are all in
                snap = self._snapshot(fresh=True)
            out, self._failed, missing = self._outcomes.values(snap)
        if missing and not partial:
            raise JobError(
                f"job {self.name!r} has {missing} of {snap.n} tasks without a result yet; "
                "call job.wait() first, or results(partial=True)"
            )
        return out

    def get(self, *, errors: str = "raise", partial: bool = False, files: bool = False) -> Any:
        """The results combined (dMod2's ``get``).

        Lists are concatenated, pandas DataFrames row-bound, anything else
        returned as a list. ``errors="raise"`` (default) raises the first
        task error; ``errors="return"`` keeps TaskError values in place.
        ``files=True`` also brings back the files tasks wrote in their working
        folder on remote nodes, into ``job.path / "files"`` (dMod2's ``get(all = TRUE)``).
        """
        if errors not in ("raise", "return"):
            raise ConfigError(f'errors must be "raise" or "return", not {errors!r}')
        if files:
            fetch = getattr(self.cluster, "fetch_files", None)
            if fetch is not None:
                fetch(self._handle)
        values = self.results(partial=partial)
        if errors == "raise":
            self._raise_first_failure(values)
        return combine(values)

    def _raise_first_failure(self, values: list[Any]) -> None:
        """Raise the first failed task's TaskError among ``values`` (just read by ``results``),
        as its original type where possible; a TaskError a task returned as its value is
        a value."""
        if self._failed:
            err = values[self._failed[0]]
            raise err.as_original_type() from err.__cause__

    def log(self, index: int) -> str:
        """The captured stdout and stderr of task ``index`` (so far, while it runs)."""
        index = control.task_index(self._handle, index, self.n_tasks)
        return self._outcomes.log(index, self._snapshot(fresh=True))

    # -- control -----------------------------------------------------------------
    def cancel(self) -> None:
        """Stop what runs; nothing new starts (dMod2's terminate)."""
        control.cancel(self.cluster, self._handle)
        self._dirty()

    def retry(self, tasks: Iterable[int] | None = None, **resources: Any) -> Job[T]:
        """Run the failed and cancelled tasks again (the others keep their results).

        ``tasks``: only these (each must have failed or been cancelled: anything else raises
        :class:`~elsewhere.StateError`). Backends that take resources (batch schedulers)
        accept them here, e.g. ``job.retry(mem="8G", walltime="02:00:00")``.
        """
        control.retry(self.cluster, self._handle, tasks, **resources)
        self._dirty()
        return self

    def purge(self, *, local: bool = True) -> None:
        """Delete the job: stop it, remove what its cluster keeps of it (copies on ssh nodes or
        in a cluster's remote storage), then its job folder and registry entry: nothing of
        it is left. ``local=False`` keeps the job folder here, so that the results of a job
        that ran elsewhere can still be read (``ew.recover`` finds it).
        """
        control.purge(self.cluster, self._handle, local=local)  # a second purge: JobGone
        self._dirty()


def combine(values: list[Any]) -> Any:
    """Concatenate lists, row-bind DataFrames, else return the list."""
    if values and all(isinstance(v, list) for v in values):
        return [x for v in values for x in v]
    pd = sys.modules.get("pandas")
    if values and pd is not None and all(isinstance(v, pd.DataFrame) for v in values):
        return pd.concat(values, ignore_index=True)
    return list(values)


def raise_first_failure(job: Job[Any], values: list[Any]) -> None:
    """Raise the first failed task's error among ``values`` (just read by ``job.results()``),
    as its original type where possible (``ew.map``'s ``errors="raise"``)."""
    job._raise_first_failure(values)


def make_communicating(job: Job[Any], ranks: int) -> None:
    """Make the unsubmitted ``job`` one of ``ranks`` MPI ranks started together."""
    job._meta = job.store.update_meta(communicating=True, ranks=ranks)
    job._handle.with_meta(job._meta)


def job_data(job: Job[Any]) -> Any:
    """What the job sends once per worker (``job_data=``)."""
    return job._job_data


def value_of(job: Job[Any], index: int) -> Any:
    """Task ``index``'s value or TaskError, read afresh (the Executor's reading of a result)."""
    job._dirty()
    return job._value(index)


def write_and_submit(job: Job[Any], fn: Any = None, tasks: list[Any] | None = None, form: str = "entries",
                     *, communicating: bool = False, register_late: bool = False) -> None:
    """Submit ``job`` with ``tasks`` (in ``form``, see ``tasks_from_inputs``) and the tasks
    staged by ``add_task``: the core writes, registers and hands it to its cluster."""
    entries: list[Any] = list(tasks or [])
    staged = job._staged
    if staged:
        entries = as_entries(entries, form) + staged
        form = "entries"
    meta = submit_job(job.cluster, job._handle, fn, entries, form, job._job_data, queue_n=job._queue_n,
                      communicating=communicating, extra_fns=tuple(e[0] for e in staged),
                      register_late=register_late)  # fmt: skip
    job._staged = []
    job._meta = meta
    job._dirty()
