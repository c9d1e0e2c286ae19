"""The job handle: what a backend gets of a job (never the user's ``Job``). The table of
what it offers is :class:`JobHandle`'s docstring."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..util.states import JobState
from . import records
from .journal import JournalReader, Outcomes, lock_is_free
from .records import Kind
from .snapshot import Snapshot
from .store import CUR, JobStore

#: Starts ``tasks`` again on the job's backend: given by the core, called by ``report_lost``.
Restart = Callable[["JobHandle", list[int]], None]


class JobHandle:
    """A job as a backend sees it: every operation of the plugin contract
    (:class:`elsewhere.Cluster`) receives one.

    ==========================  ===========================================================
    ``id``, ``name``            the job's id (unique for ever) and name
    ``path``, ``store``         the job folder on this machine, and its files
    ``spec``                    the job's metadata (job.json), read-only: ``n_tasks``,
                                ``cores_per_task``, ``seed``, ``retries``, ``env``, ...
    ``n_tasks``                 how many tasks the job has
    ``tasks``                   the tasks this call is about: every task on the first
                                ``submit_independent``, exactly the ones to run again on a
                                retry (a rerun of a lost task included)
    ``attempt(i)``              the attempt of task ``i`` now due (0: its first run)
    ``resources``               resources asked for this call (``job.retry(mem="8G")``)
    ``snapshot()``              the tasks' states now, read from the folder
    ``outcomes``                the tasks that have an outcome (a result, an error, lost,
                                cancelled): ``{task: (worker id, record)}``
    ``report_lost(reasons)``    tasks that ended without a result: failed as "lost" with
                                the reason, or run again while the job's retries last
    ``cluster_data()``          what the backend stored with ``set_job_cluster_data``
    ==========================  ===========================================================

    Also ``job.store`` (the job folder's files), ``job.stream`` (an open ``ew.Executor``
    job) and ``job.communicating``. A handle reads the folder through one journal reader,
    so what it returns is current: a ``report_lost`` is seen by the next ``snapshot()`` at
    once. ``for_tasks``, ``with_meta``, ``given_running`` and ``vanished`` are the
    library's own.
    """

    def __init__(self, store: JobStore, meta: Mapping[str, Any] | None = None, *,
                 tasks: list[int] | None = None, resources: Mapping[str, Any] | None = None,
                 reader: JournalReader | None = None, restart: Restart | None = None) -> None:  # fmt: skip
        self.store = store
        self._meta = dict(meta if meta is not None else store.meta())
        self.reader = reader if reader is not None else JournalReader(store)
        self._tasks = tasks
        self.resources: dict[str, Any] = dict(resources or {})
        self._restart = restart

    def for_tasks(self, tasks: list[int], resources: Mapping[str, Any] | None = None) -> JobHandle:
        """The same job, about ``tasks`` only (what the core passes to start them again)."""
        return JobHandle(self.store, self._meta, tasks=list(tasks), resources=resources, reader=self.reader,
                         restart=self._restart)  # fmt: skip

    def with_meta(self, meta: Mapping[str, Any]) -> None:
        """The job's metadata changed (the core wrote it): see the new one."""
        self._meta = dict(meta)

    # -- what the job is --------------------------------------------------------------
    @property
    def id(self) -> str:
        """The job's id: unique for ever (a folder name, a scheduler job name)."""
        return str(self._meta["id"])

    @property
    def name(self) -> str:
        """The job's name, as the user gave it."""
        return str(self._meta["name"])

    @property
    def path(self) -> Path:
        """The job folder on this machine."""
        return self.store.path

    @property
    def spec(self) -> Mapping[str, Any]:
        """The job's metadata (job.json); read-only (the core is its writer). Keys a backend
        reads: ``n_tasks``, ``cores_per_task``, ``seed``, ``retries``, ``env``, ``cwd``,
        ``communicating``, ``ranks``, ``stream`` (an open ``Executor`` job: tasks come
        later), ``cluster`` (the cluster's description)."""
        return self._meta

    @property
    def n_tasks(self) -> int:
        """How many tasks the job has (a stream job: how many so far)."""
        if self._meta.get("stream"):
            return self.store.queue().n
        return int(self._meta.get("n_tasks", 0))

    @property
    def communicating(self) -> bool:
        """An MPI job: its tasks are ranks started together."""
        return bool(self._meta.get("communicating"))

    @property
    def stream(self) -> bool:
        """An open job that grows while it runs (``ew.Executor``)."""
        return bool(self._meta.get("stream"))

    @property
    def tasks(self) -> list[int]:
        """The tasks this call is about: all of them, unless the core asks for some (a retry)."""
        return list(range(self.n_tasks)) if self._tasks is None else list(self._tasks)

    def attempt(self, task: int) -> int:
        """The attempt of ``task`` now due: 0 for its first run, 1 for its first rerun, ..."""
        return self.store.queue().attempt(task)

    # -- what the backend keeps -------------------------------------------------------
    def cluster_data(self) -> dict[str, Any]:
        """What the backend stored with ``set_job_cluster_data`` (``{}`` if nothing)."""
        return self.store.cluster_data()

    def set_cluster_data(self, data: dict[str, Any]) -> None:
        """Keep ``data`` (JSON-able) with the job: scheduler ids, hosts, pids."""
        self.store.set_cluster_data(data)

    # -- the tasks' states -------------------------------------------------------------
    @property
    def outcomes(self) -> Outcomes:
        """The tasks with an outcome, as last read: ``{task: (worker id, record)}``."""
        return self.reader.final

    def refresh(self) -> Outcomes:
        """Read the outcomes written since the last look; the tasks with an outcome."""
        self.reader.refresh()
        return self.reader.final

    def snapshot(self) -> Snapshot:
        """The tasks' states now, as the job folder tells them (a backend may know more:
        ``Cluster.job_state`` is given this and returns a fresher one)."""
        reader = self.reader
        reader.refresh()
        q = self.store.queue()
        reruns = q.reruns
        if reruns:
            reader.forget(reruns)
        final = reader.final
        running: dict[int, tuple[str, float]] = {}
        members = q.members
        for wid, m in members.items():
            if m.get("state") == "active" and m.get("claim"):
                idx, since, _ = self.store.read_running(wid)
                if idx >= 0 and idx not in final:
                    running[idx] = (wid, since)
        for wid, (idx, since) in self.given_running(skip=members).items():
            if idx not in final:
                running[idx] = (wid, since)
        n = q.n if self._meta.get("stream") else int(self._meta.get("n_tasks", 0))
        return Snapshot(n=n, submitted=q.submitted, cancelled=q.cancelled, final=final, running=running,
                        cancelled_tasks=set(q.cancelled_tasks), kind_counts=dict(reader.kind_counts))  # fmt: skip

    @property
    def state(self) -> JobState:
        """The job's state as the folder tells it."""
        return self.snapshot().job_state()

    def given_running(self, skip: Mapping[str, Any] = {}) -> dict[str, tuple[int, float]]:
        """The tasks that workers started with their tasks given (``--tasks``, array elements;
        no queue membership) run now: ``{worker id: (task, since)}``. A worker on this
        machine whose lock is free has ended: its last task is not running (see
        :meth:`vanished`)."""
        out: dict[str, tuple[int, float]] = {}
        for wid in self._given_workers(skip):
            idx, since, _ = self.store.read_running(wid)
            if idx >= 0 and not self._ended_here(wid):
                out[wid] = (idx, since)
        return out

    def vanished(self) -> dict[int, str]:
        """Tasks whose worker, started with its tasks given on this machine, ended while it
        ran them (killed, crashed) and left no outcome: ``{task: why}``."""
        out: dict[int, str] = {}
        for wid in self._given_workers({}):
            idx, _, _ = self.store.read_running(wid)
            if idx < 0 or not self._ended_here(wid):
                continue
            self.reader.refresh()  # after the lock was seen free: its journal is whole
            info = self.store.worker_info(wid)
            earlier = float(info.get("started", 0.0)) < self.store.queue().retried_at(idx)
            if idx not in self.reader.final and not earlier:  # (an earlier attempt's worker: no news)
                out[idx] = (f"the worker running it (pid {info.get('pid', '?')} on {info.get('host', '?')}) "
                            "ended without a result: killed, out of memory, or crashed")
            self._settle(wid)
        return out

    def _settle(self, wid: str) -> None:
        """Mark the ended worker ``wid`` as running nothing, so that its last task is found
        lost once (a rerun of it is another worker's)."""
        import fcntl

        try:
            fd = os.open(self.store._p("workers", f"{wid}.cur"), os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: its worker has ended
            os.pwrite(fd, CUR.pack(-1, 0.0, 0), 0)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)

    def _given_workers(self, skip: Mapping[str, Any]) -> list[str]:
        try:
            names = os.listdir(self.store.path / "workers")
        except FileNotFoundError:
            return []
        return [n[:-5] for n in names if n.endswith(".json") and n[:-5] not in skip]

    def _ended_here(self, wid: str) -> bool:
        info = self.store.worker_info(wid)
        if info.get("host") != _host():
            return False  # another machine's lock tells nothing here
        return lock_is_free(self.store._p("workers", f"{wid}.cur"))

    # -- lost tasks ----------------------------------------------------------------------
    def report_lost(self, reasons: Mapping[int, str]) -> Snapshot:
        """Tasks that ended without a result (``{task: why}``): a scheduler said their job
        ended, their process is gone. While the job's ``retries`` last, each is run again
        (the backend's ``submit_independent`` is asked to start exactly those tasks);
        after that it is failed as "lost", ``why`` being its TaskError's message. A task
        that has an outcome meanwhile, or of a cancelled job, is left alone. Report a task
        once, from what ran its current attempt: a task started again is held by its new
        worker (a scheduler job, a process) and is not lost when its old one is found gone.
        Returns the tasks' states after the report."""
        self.reader.refresh()
        again: list[int] = []
        with self.store.locked_queue() as q:
            if q.cancelled:
                return self.snapshot()
            recs = []
            for t, why in reasons.items():
                if t in self.reader.final or q.lost_reason(t) is not None or t in q.cancelled_tasks:
                    continue
                used = q.count_attempt(t)
                if used <= q.retries and self._restart is not None:
                    again.append(t)
                    continue
                q.lose(t, reason=why)
                recs.append(records.make_record(Kind.LOST, t, used - 1, t_end=time.time()))
            if again:
                q.retry({t: q.attempt(t) for t in again})
            if recs:
                self.store.append_control(recs)
        if again and self._restart is not None:
            try:
                self._restart(self, again)
            except Exception as exc:  # they cannot run again: failed with both reasons
                self.write_off({t: f"{reasons[t]}; it could not be started again: {type(exc).__name__}: {exc}"
                                for t in again})  # fmt: skip
        return self.snapshot()

    def write_off(self, reasons: Mapping[int, str]) -> None:
        """Fail tasks as "lost" at once, each with its reason (``{task: why}``), retries or
        not: tasks that cannot be started (again)."""
        with self.store.locked_queue() as q:
            recs = []
            for t, why in reasons.items():
                q.lose(t, reason=why)
                recs.append(records.make_record(Kind.LOST, t, q.attempt(t), t_end=time.time()))
            self.store.append_control(recs)


def _host() -> str:
    return socket.gethostname()
