"""The job handle: what a backend gets of a job (never the user's ``Job``). The table of
what it offers is :class:`JobHandle`'s docstring."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..util.states import JobState
from ..util.system import process_alive
from . import records
from .journal import JournalReader, Outcomes, lock_is_free
from .payload import read_damage
from .records import Kind
from .snapshot import Snapshot
from .store import CUR, JobStore

if TYPE_CHECKING:
    from .queue import Queue

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
    ``after``                   the jobs this one must wait for (``after=``), as handles:
                                those not finished yet, on the first ``submit_independent``
                                of a backend that waits for them itself
                                (``Cluster.native_after``); else empty
    ``snapshot()``              the tasks' states now, read from the folder
    ``outcomes``                the tasks that have an outcome (a result, an error, lost,
                                cancelled): ``{task: (worker id, record)}``
    ``report_lost(reasons)``    tasks that ended without a result: failed as "lost" with
                                the reason, or run again while the job's retries last
    ``cluster_data()``          what the backend stored with ``set_job_cluster_data``
    ``damage()``                what of the job folder is found damaged, one line each
    ``mark_damaged(marks)``     tasks whose outcome was found damaged: failed, with why
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
        self._checked: set[tuple[str, int]] = set()  # result bodies found whole: (worker, offset)
        self._checked_at = -1  # the reader's count of changes when every body was checked
        self._left_clean: dict[str, tuple[int, bool]] = {}  # workers that left, their files found whole
        self.after: list[JobHandle] = []  # the jobs to wait for, for a backend that does so itself
        self.upstream: dict[str, Any] = {}  # the core's look at the jobs it waits for (after=)
        self.rerun_types: dict[tuple[str, int, int], str] = {}  # errors run again: their types
        self._last: tuple[float, Snapshot] | None = None  # the last snapshot (monotonic time, it)

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
        q = self.store.queue()
        n = q.n if self._meta.get("stream") else int(self._meta.get("n_tasks", 0))
        marked: list[tuple[int, str, float]] = []  # (task, worker, since) the workers say they run
        if q.reruns or len(reader.final) < n:  # (all ended: none runs, and nothing can end now)
            members = q.members
            for wid, m in members.items():
                if m.get("state") == "active" and m.get("claim"):
                    idx, since, _ = self.store.read_running(wid)
                    if idx >= 0:
                        marked.append((idx, wid, since))
            marked += [(idx, wid, since) for wid, (idx, since) in self.given_running(skip=members).items()]
            # The journals after the running marks: a task that ended in between is read as
            # ended (read before, it would be neither running nor ended: shown queued a moment).
            reader.refresh()
        reruns = q.reruns
        if reruns:
            reader.forget(reruns)
        final = reader.final
        running = {idx: (wid, since) for idx, wid, since in marked if idx not in final}
        snap = Snapshot(n=n, submitted=q.submitted, cancelled=q.cancelled, final=final, running=running,
                        cancelled_tasks=set(q.cancelled_tasks), kind_counts=dict(reader.kind_counts),
                        damaged=self.damage(q),
                        reruns={t: e[1].attempt + 1 for t, e in reader.reruns.items()})  # fmt: skip
        self._last = (time.monotonic(), snap)
        return snap

    def seen_done(self, within_s: float) -> bool:
        """Whether a snapshot of the last ``within_s`` seconds saw the job done (a done job
        stays done, unless tasks of it are run again)."""
        last = self._last
        return last is not None and time.monotonic() - last[0] <= within_s and last[1].done

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

    def reap_workers(self) -> list[str]:
        """Write off the workers that claim this job's tasks from its queue (``elsewhere.worker``
        without ``--tasks``, as an open job's are) and have ended: the task each was running
        is failed as lost, or run again while ``retries=`` last; the rest of its claim goes
        back to the queue. A plugin whose workers claim calls this from ``poll``. Returns the
        workers written off."""
        from .journal import reap

        with self.store.locked_queue() as q:
            if not q.submitted or q.cancelled:
                return []
            return reap(self.store, q)

    def vanished(self) -> dict[int, str]:
        """Tasks whose worker, started with its tasks given on this machine, ended while it
        ran them (killed, crashed) and left no outcome: ``{task: why}``; not a batch
        scheduler's element, whose loss its backend reports with the scheduler's reason
        (``deleted by qdel``, ``out of memory``). (Called at each poll,
        it also fails the tasks whose outcome damage took: :meth:`_write_off_damage`.)"""
        out: dict[int, str] = {}
        for wid in self._given_workers({}):
            idx, _, _ = self.store.read_running(wid)
            if idx < 0 or not self._ended_here(wid):
                continue
            info = self.store.worker_info(wid)
            if info.get("element"):
                continue  # its scheduler tells why it ended, through the backend's poll
            watcher = info.get("watcher")
            if isinstance(watcher, int) and watcher > 0 and process_alive(watcher):
                continue  # the process that started it accounts for it (run/supervise.py)
            self.reader.refresh()  # after the lock was seen free: its journal is whole
            earlier = float(info.get("started", 0.0)) < self.store.queue().retried_at(idx)
            if idx not in self.reader.final and not earlier:  # (an earlier attempt's worker: no news)
                out[idx] = (f"the worker running it (pid {info.get('pid', '?')} on {info.get('host', '?')}) "
                            "ended without a result: killed, out of memory, or crashed")
            self._settle(wid)
        self._write_off_damage()
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

    # -- damage ------------------------------------------------------------------------
    def damage(self, q: Queue | None = None) -> list[str]:
        """What of the job folder is found damaged, one line each (nothing: ``[]``): journals
        (damaged stretches skipped, missing or cut journals of workers that left) and the
        tasks failed as damaged. Cheap: reads no result body."""
        reader = self.reader
        q = q if q is not None else self.store.queue()
        found = self._left_damage(q)
        if found:  # perhaps read before the queue said the worker left: look again
            reader.refresh()
            found = self._left_damage(q)
        notes = reader.damage_notes() + found + read_damage(self.store.dir)[:5]
        if reader.damaged_tasks:
            k = len(reader.damaged_tasks)
            t = min(reader.damaged_tasks)
            why = q.lost_reason(t) or "damaged"
            notes.append(f"{k} task{'s' if k > 1 else ''} failed as damaged (task {t}: {why.removeprefix('damaged: ')})")
        return list(dict.fromkeys(notes))

    def _left_damage(self, q: Queue) -> list[str]:
        """Damage seen in the files of the workers that left the job (all they wrote is
        written): a journal missing or cut inside a frame, result bodies no record points to."""
        reader = self.reader
        out = []
        clean = self._left_clean
        for wid, m in q.members.items():
            if m.get("state") != "left" or clean.get(wid) == (reader.offset(wid), wid in reader.listed):
                continue
            if wid not in reader.listed:
                if m.get("claimed", True):  # (one that never claimed a task wrote no journal)
                    out.append(f"damaged: journal/{wid}.rec is missing")
                continue
            if reader.tails.get(wid):
                out.append(f"damaged: journal/{wid}.rec: cut inside a frame at byte {reader.offset(wid)}")
            try:
                size = os.path.getsize(self.store.results_path(wid))
            except OSError:
                continue
            end = reader.body_end.get(wid, 0)
            if size > end:
                out.append(f"damaged: journal/{wid}.rec: cut short? results/{wid}.bin holds {size - end} "
                           "bytes after the last result its records point to")  # fmt: skip
            elif not reader.tails.get(wid):
                clean[wid] = (reader.offset(wid), True)  # whole: not looked at again while so
        return out

    def mark_damaged(self, marks: Mapping[int, tuple[int, str]]) -> None:
        """Fail tasks whose outcome was found damaged: ``{task: (attempt, why)}``, ``why``
        starting "damaged: " and naming the file. The mark outranks the outcome of the same
        attempt (``records.FLAG_DAMAGED``); ``job.retry()`` runs the task again."""
        with self.store.locked_queue() as q:
            recs = []
            for t, (attempt, why) in marks.items():
                q.lose(t, reason=why)
                recs.append(records.make_record(Kind.LOST, t, attempt, flags=records.FLAG_DAMAGED,
                                                t_end=time.time()))  # fmt: skip
            self.store.append_control(recs)
        self.reader.refresh()

    def _write_off_damage(self) -> None:
        """Poll-time care of a damaged folder (after the backend's poll brought the workers'
        files here): tasks whose outcome was lost in a damaged journal are failed as damaged
        once every worker has left, so a wait ends; and once every task has an outcome, the
        result bodies not checked yet are (:meth:`_check_bodies`)."""
        reader = self.reader
        q = self.store.queue()
        if not q.submitted or q.cancelled:
            return
        reader.refresh()
        n = q.n if self._meta.get("stream") else int(self._meta.get("n_tasks", 0))
        final = reader.final
        if len(final) < n and q.members and self._quiet(q):
            reader.refresh()  # after the queue said all left: their journals are whole
            notes = reader.damage_notes() + self._left_damage(q)
            if notes:
                skip = set(q.cancelled_tasks) | set(q.to_rerun)
                lost = [t for t in range(min(q.next, n)) if t not in final and t not in skip]
                if lost:
                    self.mark_damaged({t: (q.attempt(t), f"{notes[0]}; the outcome of task {t} was lost with it")
                                       for t in lost})  # fmt: skip
        if len(final) >= n:
            self._check_bodies()

    def _quiet(self, q: Queue) -> bool:
        """Nothing runs, waits or is about to start: every worker that joined has left."""
        if not q.closed or q.unclaimed() or q.live_members() or q.dispatched():
            return False
        return not self.given_running(skip=q.members)

    #: Bytes of result bodies checked at most per poll (the rest at the next ones).
    CHECK_BYTES = 256 << 20

    def _check_bodies(self) -> None:
        """Check the result bodies of a job whose tasks have all ended, once each (a bit
        flipped in a results file is otherwise found only when that result is read): the
        tasks of a damaged one are failed as damaged."""
        reader = self.reader
        if self._checked_at == reader.changes:
            return
        from .journal import body_damage

        budget = self.CHECK_BYTES
        marks: dict[int, tuple[int, str]] = {}
        whole = True
        for (wid, rec), tasks in reader.final.by_entry().items():
            key = (wid, rec.res_off)
            if rec.kind > Kind.ERROR or key in self._checked:
                continue
            if budget < 0:
                whole = False
                break
            budget -= rec.res_len
            what = body_damage(self.store, wid, rec)
            if what is None:
                self._checked.add(key)
                continue
            for t in tasks:
                marks[t] = (rec.attempt, f"damaged: results/{wid}.bin, task {t}, {what}")
        if marks:
            self.mark_damaged(marks)
        if whole:
            self._checked_at = reader.changes


def _host() -> str:
    return socket.gethostname()
