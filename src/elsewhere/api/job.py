"""A job as the user sees it.

A :class:`Job` is a view of a job folder plus the cluster that runs it.
Nothing important lives only in this object: a job recovered by name in a
new process (``ew.recover``) is the same job. Its tasks, the snapshots it
reads and the answer of ``check()`` are in ``tasks.py``; making and removing
its folder in ``jobfolder.py``.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..backends.base import Cluster
from ..folder import records
from ..folder.journal import JournalReader, read_body, read_log
from ..folder.lifecycle import busy, remove_folder
from ..folder.records import Kind
from ..folder.snapshot import Snapshot
from ..folder.store import CONTROL, JobStore
from ..util.errors import ConfigError, JobError, TaskError, TimeoutError
from ..util.states import JobState, TaskState, derive_job_state
from .tasks import Status, Task, _task_error, combine

_LOOK_S = 0.1  # Job.wait reads the whole state at least this often


class Job:
    """A job: tasks that run on a cluster, kept in a job folder.

    Made by :func:`elsewhere.submit`, :func:`elsewhere.create_job` or
    :func:`elsewhere.recover`; not constructed directly.
    """

    def __init__(self, store: JobStore, cluster: Cluster, meta: dict[str, Any] | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self._meta = meta if meta is not None else store.meta()
        self._reader = JournalReader(store)
        self._snap: Snapshot | None = None
        self._snap_at = 0.0
        self._cache: dict[tuple[str, int], list[Any]] = {}
        self._staged: list[tuple[Any, tuple, dict]] = []
        self._common_fn: Any = None
        self._job_data: Any = None
        self._queue_n: int | None = None  # the task count the queue was written with, if known
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
        return self._meta.get("user", "")

    @property
    def tag(self) -> str:
        return self._meta.get("tag", "")

    @property
    def seed(self) -> int:
        """The job's seed; task i runs with seed + i."""
        return int(self._meta.get("seed") or 0)

    @property
    def created(self) -> float:
        return self._meta.get("created", 0.0)

    @property
    def submitted(self) -> float | None:
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
    def path(self) -> Path:
        """The job folder."""
        return self.store.path

    @property
    def n_tasks(self) -> int:
        if self._meta.get("stream"):
            return int(self.store.queue().get("n", 0))
        return int(self._meta.get("n_tasks", 0)) + len(self._staged)

    @property
    def tasks(self) -> list[Task]:
        """The job's tasks, in order."""
        return [Task(self, i) for i in range(self.n_tasks)]

    @property
    def state(self) -> JobState:
        """The job's state now."""
        return derive_job_state(self._snapshot(fresh=True).counts())

    def __repr__(self) -> str:
        return f"<Job {self.name!r} ({self.id}) on {self.cluster.kind}: {self.state.value}, {self.n_tasks} tasks>"

    def __len__(self) -> int:
        return self.n_tasks

    # -- building ---------------------------------------------------------------
    def add_task(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Task:
        """Add a task ``fn(*args, **kwargs)``; only before ``submit()``."""
        if self._meta.get("submitted"):
            raise JobError(f"job {self.name!r} is already submitted; tasks can only be added before")
        if not callable(fn):
            raise ConfigError(f"add_task needs a callable first, not {fn!r}")
        self._staged.append((fn, args, kwargs))
        return Task(self, self.n_tasks - 1)

    def submit(self) -> Job:
        """Write the staged tasks and hand the job to its cluster; returns at once."""
        from . import functions as api

        if self._meta.get("submitted"):
            raise JobError(f"job {self.name!r} was already submitted")
        if not self._staged:  # it would wait for ever (as MATLAB, a job needs a task)
            raise ConfigError(f"job {self.name!r} has no tasks: add them with job.add_task(fn, ...) first")
        api._write_and_submit(self)
        return self

    # -- following ---------------------------------------------------------------
    def _dirty(self) -> None:
        self._snap = None

    def _snapshot(self, fresh: bool = False) -> Snapshot:
        now = time.monotonic()
        if self._snap is not None and not fresh and now - self._snap_at < 0.05:
            return self._snap
        self._reader.refresh()
        q = self.store.queue()
        if q.get("rerun"):
            self._reader.forget({int(t): int(a) for t, a in q["rerun"].items()})
        running: dict[int, tuple[str, float]] = {}
        for wid, m in q.get("members", {}).items():
            if m.get("state") == "active" and m.get("claim"):
                idx, since, _ = self.store.read_running(wid)
                if idx >= 0 and idx not in self._reader.final:
                    running[idx] = (wid, since)
        n = int(q.get("n", 0)) if self._meta.get("stream") else int(self._meta.get("n_tasks", 0))
        snap = Snapshot(
            n=n,
            submitted=bool(q.get("submitted")),
            cancelled=bool(q.get("cancelled")),
            final=self._reader.final,
            running=running,
            cancelled_tasks=set(q.get("cancelled_tasks", [])),
            kind_counts=dict(self._reader.kind_counts),
        )
        if snap.submitted and not snap.cancelled and len(snap.final) < n:
            snap = self.cluster.job_state(self, snap)
        self._snap, self._snap_at = snap, now
        return snap

    def check(self) -> Status:
        """Counts of tasks per state; true once nothing runs or waits.

        Also finds workers that vanished (their running task becomes
        failed/"lost", or is retried) and starts replacements.
        """
        if self._meta.get("submitted"):
            self.cluster.poll(self)
        snap = self._snapshot(fresh=True)
        counts = snap.counts()
        return Status(self, counts, derive_job_state(counts), snap.note, snap.reasons)

    def _done(self, snap: Snapshot) -> bool:
        return derive_job_state(snap.counts()).done

    def wait(
        self,
        timeout: float | None = None,
        *,
        state: str | JobState = "finished",
        progress: bool | None = None,
        poll_interval_s: float = 0.5,
    ) -> Job:
        """Block until the job reaches ``state`` (default: done), or ``timeout`` seconds.

        ``state`` follows MATLAB's ``waitForState``: "queued", "running" or
        "finished" (any end: finished, failed, cancelled). A progress bar
        shows on a terminal after a couple of seconds (``progress=False``
        turns it off). Raises :class:`elsewhere.TimeoutError` when the time
        runs out; the job goes on running.
        """
        target = JobState(state) if not isinstance(state, JobState) else state
        if not self._meta.get("submitted") and target.rank > JobState.PENDING.rank:
            raise JobError(f"job {self.name!r} is not submitted; call job.submit() first")
        from ..util.progress import Progress

        deadline = None if timeout is None else time.monotonic() + timeout
        fd = _open_notify(self.store)
        bar = Progress(self.name, enabled=progress)
        # Waiting for the end of a job of known size, a wake-up that leaves tasks
        # without an outcome cannot end the wait: only the journals are read then,
        # the whole state (queue, running tasks, the bar) at most every _LOOK_S.
        n_known = 0 if self._meta.get("stream") or target is not JobState.FINISHED else self.n_tasks
        looked = time.monotonic() if n_known else 0.0  # just submitted: the journals first
        try:
            return self._wait_loop(target, timeout, deadline, fd, bar, n_known, looked, poll_interval_s)
        except FileNotFoundError:
            if self.store.path.is_dir():
                raise
            raise JobError(f"job {self.name!r} was deleted while it was waited for") from None
        finally:
            bar.close()
            if fd >= 0:
                os.close(fd)

    def _wait_loop(self, target: JobState, timeout: float | None, deadline: float | None, fd: int,
                   bar: Any, n_known: int, looked: float, poll_interval_s: float) -> Job:  # fmt: skip
        """The loop of :meth:`wait`."""
        last_poll = time.monotonic()
        interval = poll_interval_s
        while True:
            now = time.monotonic()
            look = True
            if n_known and now - looked < _LOOK_S:
                self._reader.refresh()
                look = len(self._reader.final) >= n_known
            if look:
                if not self.store.path.is_dir():  # purged meanwhile (by another process)
                    raise JobError(f"job {self.name!r} was deleted while it was waited for")
                snap = self._snapshot(fresh=True)
                counts = snap.counts()
                st = derive_job_state(counts)
                bar.update(counts, snap.n, snap.note)
                if st.rank >= target.rank:
                    if snap.cancelled:  # perhaps by another process: the cluster acts on it
                        self.cluster.poll(self)  # (a peer controller here tells its workers)
                    return self
                looked = now = time.monotonic()
            if deadline is not None and now >= deadline:
                snap = self._snapshot(fresh=True)  # the last word, and the message's
                counts = snap.counts()
                st = derive_job_state(counts)
                if st.rank >= target.rank:
                    return self
                held = f"; {snap.note}" if snap.note else ""
                raise TimeoutError(
                    f"job {self.name!r} did not reach {target.value} within {timeout} s "
                    f"(now {st.value}: {_fmt_counts(counts)}{held}); it goes on running"
                )
            if now - last_poll >= interval:
                self.cluster.poll(self)
                last_poll = now
                # Results from other machines arrive by polling: poll often there.
                interval = min(interval * 1.5, 5.0 if self.cluster.shares_filesystem() else 1.0)
            left = interval - (now - last_poll)
            if n_known:
                left = min(left, looked + _LOOK_S - now)
            if deadline is not None:
                left = min(left, deadline - now)
            if fd >= 0:
                r, _, _ = select.select([fd], [], [], max(0.0, left))
                if r:
                    _drain(fd)
                    interval = poll_interval_s
            else:
                time.sleep(min(max(0.0, left), 0.05))

    # -- results ------------------------------------------------------------------
    def _value(self, index: int) -> Any:
        value = self._value_of(index)
        if isinstance(value, TaskError) and self._meta.get("communicating"):
            value.rank = index
        return value

    def _value_of(self, index: int) -> Any:
        # An outcome already read stands (a rerun makes the reader forget it first): no
        # new look at the job for it (an Executor reads each value as it arrives).
        f = self._reader.final.get(index)
        if f is None:
            snap = self._snapshot()
            f = snap.final.get(index)
        if f is None:
            st = snap.task_state(index)
            if st is TaskState.CANCELLED:
                return TaskError("the task was cancelled before it finished", type_name="Cancelled",
                                 index=index, job=self.name, reason="cancelled", seed=self.seed + index)
            raise JobError(f"task {index} of job {self.name!r} has no result yet (it is {st.value})")
        wid, rec = f
        if rec.kind == Kind.LOST:
            return self._lost_error(index, rec)
        if rec.kind == Kind.CANCELLED:
            return TaskError("the task was cancelled", type_name="Cancelled", index=index,
                             job=self.name, reason="cancelled", seed=rec.seed)
        value = read_body(self.store, wid, rec, self._cache, index)
        if rec.kind == Kind.ERROR:
            return _task_error(value, self.name, rec)
        return value

    def _lost_error(self, index: int, rec: records.Record) -> TaskError:
        q = self.store.queue()
        if str(index) not in q.get("lost_by", {}) and str(index) not in q.get("lost_reason", {}):
            # The reaper appends the record before it writes the queue that says
            # who was lost: wait for it to finish (it holds the lock meanwhile).
            with self.store.locked_queue() as q:
                pass
        why = q.get("lost_reason", {}).get(str(index))
        if why:
            return TaskError(why, type_name="WorkerLost", index=index, seed=self.seed + index,
                             job=self.name, reason="lost")
        wid = q.get("lost_by", {}).get(str(index), "")
        info = self.store.worker_info(wid) if wid else {}
        host = info.get("host", "")
        output = read_log(self.store, wid, rec.log_off, rec.log_len) if wid else ""
        # a crash report (faulthandler) names the error and the innermost frames first
        head = "\n".join(output.strip().splitlines()[:8])
        msg = (f"the worker running it (pid {info.get('pid', '?')}) vanished: it crashed or was "
               "killed (out of memory? a segfault in compiled code? a kill signal?)")
        if head:
            msg += f"; its output:\n{head}"
        return TaskError(msg, type_name="WorkerLost", host=host, index=index, seed=self.seed + index,
                         job=self.name, reason="lost")

    def results(self, *, partial: bool = False) -> list[Any]:
        """One entry per task, in task order; a failed task's entry is a TaskError.

        Raises JobError while tasks are unfinished, unless ``partial=True``
        (then unfinished tasks give None).
        """
        with busy():
            return self._results(partial)

    def _results(self, partial: bool) -> list[Any]:
        snap = self._snapshot()
        if len(snap.final) < snap.n or not snap.done:  # a done job's outcomes are all in: no second look
            snap = self._snapshot(fresh=True)
        out: list[Any] = []
        missing = 0
        failed = self._failed = []  # where the TaskErrors are (errors, lost, cancelled tasks)
        final = snap.final
        ok = int(Kind.OK)
        cache = self._cache
        store = self.store
        get = final.get
        append = out.append
        n = snap.n
        i = 0
        while i < n:
            f = get(i)
            if f is not None and f[1][0] == ok and not f[1][1]:
                rec = f[1]
                values = cache.get((f[0], rec.res_off))
                if values is None:
                    value = read_body(store, f[0], rec, cache, i)
                    values = cache.get((f[0], rec.res_off))
                    if values is None:
                        append(value)
                        i += 1
                        continue
                end = min(n, final.run_end(i)) if rec.count > 1 else i
                if end - i > 1:
                    # the rest of a range record, none of it overtaken by a retry: one slice
                    out.extend(values[rec.item + i - rec.task:rec.item + end - rec.task])
                    i = end
                    continue
                append(values[rec.item + i - rec.task])
            elif f is not None or snap.task_state(i) is TaskState.CANCELLED:  # errors, single bodies
                v = self._value(i)
                if isinstance(v, TaskError):
                    failed.append(i)
                out.append(v)
            else:
                missing += 1
                out.append(None)
            i += 1
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
                fetch(self)
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
        """The captured stdout and stderr of task ``index``."""
        if not 0 <= index < self.n_tasks:
            raise IndexError(f"job {self.name!r} has no task {index} (it has {self.n_tasks})")
        snap = self._snapshot(fresh=True)
        f = snap.final.get(index)
        if f is not None:
            wid, rec = f
            if wid == CONTROL:
                wid = self.store.queue().get("lost_by", {}).get(str(index), "")
            text = read_log(self.store, wid, rec.log_off, rec.log_len) if wid else ""
            if rec.count > 1 and text:
                text = (f"[tasks {rec.task}..{rec.task + rec.count - 1} ran as one fast batch; "
                        "this is their output together]\n") + text
            return text
        r = snap.running.get(index)
        if r is not None:
            _, _, off = self.store.read_running(r[0])
            return read_log(self.store, r[0], off, -1)
        return ""

    # -- control -----------------------------------------------------------------
    def cancel(self) -> None:
        """Stop what runs; nothing new starts (dMod2's terminate)."""
        with self.store.locked_queue() as q:
            q["cancelled"] = True  # first: nothing new starts, whatever the plugin does
        if self._meta.get("submitted"):
            self.cluster.cancel_job(self)
        self._dirty()
        from ..folder.registry import Registry

        Registry().set_state(self.id, self.state.value)

    def retry(self, **resources: Any) -> Job:
        """Run the failed and cancelled tasks again (the others keep their results).

        Backends that take resources (batch schedulers) accept them here, e.g.
        ``job.retry(mem="8G", walltime="02:00:00")``.
        """
        snap = self._snapshot(fresh=True)
        again = [i for i in range(snap.n) if snap.task_state(i) in (TaskState.FAILED, TaskState.CANCELLED)]
        if not again:
            return self
        retry = getattr(self.cluster, "retry_tasks", None)
        if retry is not None:
            retry(self, again, **resources)
        else:
            if resources:
                raise ConfigError(f"the {self.cluster.kind} cluster takes no resources for retry: {resources}")
            with self.store.locked_queue() as q:
                q["cancelled"] = False
                q["cancelled_tasks"] = [i for i in q.get("cancelled_tasks", []) if i not in again]
                rerun = q.setdefault("rerun", {})
                for i in again:
                    f = snap.final.get(i)
                    q["attempts"][str(i)] = (f[1].attempt + 1) if f else q["attempts"].get(str(i), 0) + 1
                    rerun[str(i)] = q["attempts"][str(i)]
                q["retry"] = sorted(set(q["retry"]) | set(again))
            self.cluster.poll(self)
        self._dirty()
        return self

    def purge(self, *, local: bool | None = None) -> None:
        """Delete the job: stop it and remove what the cluster keeps of it.

        On this machine's clusters that is the job folder and its registry
        entry. Where the job has copies elsewhere (ssh nodes, a cluster's
        remote storage), those are removed and the local folder is kept, so
        its results can still be read, unless ``local=True``.
        """
        from ..folder.registry import Registry

        if local is None:
            local = self.cluster.shares_filesystem()
        try:
            self.cluster.delete_job(self)
        finally:
            if local:
                remove_folder(self.store.path)
                Registry().remove(self.id)


def _open_notify(store: JobStore) -> int:
    try:
        return os.open(store.path / "notify.fifo", os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return -1


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _fmt_counts(counts: dict[TaskState, int]) -> str:
    return ", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no tasks"
