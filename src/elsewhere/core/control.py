"""Controlling a job: its state, cancel, cancel one task, retry, poll, report what was lost.

Every change of a job's state goes through here, the same way for every backend, plugins
included: first the job folder (the queue's named transitions, checked against the state
vocabulary), then the backend's hook. So a task cancelled or retried is so in the folder
whatever the backend does, and a job recovered in another process sees it.

=======================  ===========================================================
``snapshot``             the tasks' states: read from the folder, then made fresher by
                         the backend's ``job_state``
``poll``                 periodic care: a job whose client died before it handed the
                         job over is handed over; the backend's ``poll``; workers on
                         this machine that ended while running a task are reported lost
``cancel``               queue: cancelled (with a reason, where the library cancels);
                         then ``cancel_job``; then the jobs that wait for it (``after=``),
                         with a reason that names it
``cancel_task``          queue: that task cancelled; then ``cancel_task``
``retry``                queue: the tasks to run again, with their attempts; then
                         ``submit_independent`` with exactly those tasks
``purge``                ``delete_job``, then the folder renamed away and removed, and
                         the registry entry
``restarter``            what ``JobHandle.report_lost`` calls to rerun lost tasks
=======================  ===========================================================

A job made with ``after=`` (``dependencies.py``) is settled at every poll: released once the
jobs it waits for finished, cancelled with the reason when one of them failed; its snapshot's
note says what it waits for.

Several processes may do these at once on one job (two shells, a notebook and a script):
each is safe against the others. A job purged by another process meanwhile makes each of
them raise :class:`~elsewhere.util.errors.JobGone` (a JobNotFound), never the
FileNotFoundError of one of its files; of several purges at once exactly one succeeds, the
others raise JobGone.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.localworkers import stop_running_here
from ..folder import housekeeping
from ..folder.handle import JobHandle
from ..folder.lifecycle import remove_folder
from ..folder.registry import Registry
from ..folder.snapshot import Snapshot
from ..util.errors import ConfigError, JobGone, NoSuchTask
from ..util.states import TERMINAL, TaskState, check_move
from . import dependencies
from .handover import take_over
from .opening import open_job
from .opening import restarter as restarter  # (its home was here: control.restarter)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..backends.base import Cluster


@contextmanager
def present(handle: JobHandle) -> Iterator[None]:
    """``with present(handle):`` a FileNotFoundError of the job's files, once its folder is
    gone, becomes :class:`~elsewhere.util.errors.JobGone` naming the job (it was purged)."""
    try:
        yield
    except FileNotFoundError as exc:
        if handle.path.is_dir() and not isinstance(exc, JobGone):
            raise  # the folder is there: a file of it is missing (damaged), not a purge
        raise gone(handle) from exc


def gone(handle: JobHandle) -> JobGone:
    """The error of the job of ``handle`` purged (by another process, or earlier by this one)."""
    return JobGone(f"job {handle.name!r} is gone: it was purged (its folder {handle.path} no longer "
                   "exists); `elsewhere jobs` lists the jobs there are")  # fmt: skip


def task_index(handle: JobHandle, index: Any, n: int) -> int:
    """``index`` as a task index of the job (``n`` tasks): ConfigError if it is not a whole
    number, NoSuchTask (also an IndexError) if the job has no such task."""
    try:
        if isinstance(index, bool):
            raise TypeError
        i = operator.index(index)  # ints, NumPy's integers; not floats or text
    except TypeError:
        raise ConfigError(f"a task index is a whole number (0 to {n - 1} in job {handle.name!r}), "
                          f"not {index!r}") from None  # fmt: skip
    if not 0 <= i < n:
        raise NoSuchTask(f"job {handle.name!r} has no task {i}: its tasks are 0 to {n - 1}" if n else
                         f"job {handle.name!r} has no task {i}: it has no tasks")  # fmt: skip
    return i


def snapshot(cluster: Cluster, handle: JobHandle) -> Snapshot:
    """The tasks' states now: the folder's, made fresher by the backend where it knows more."""
    with present(handle):
        snap = handle.snapshot()
        if not snap.submitted and not handle.path.is_dir():  # no queue read: purged, not "pending"
            raise gone(handle)
        if snap.submitted and not snap.cancelled and len(snap.final) < snap.n:
            snap = cluster.job_state(handle, snap)
        if handle.spec.get("after") and (snap.cancelled or not snap.submitted):
            q = handle.store.queue()  # held for the jobs it waits for, or cancelled for one of them
            said = q.cancel_reason if q.cancelled else dependencies.note(handle, q.held)
            if said and said not in snap.note:
                snap = snap.but(note="; ".join(filter(None, [said, snap.note])))
        if snap.reruns:
            snap = snap.but(note="; ".join(filter(None, [snap.note, rerun_note(handle, snap)])))
    return snap


def rerun_note(handle: JobHandle, snap: Snapshot, most: int = 3) -> str:
    """The tasks whose error was run again (``retries=ew.Retry(on=...)``), for a status:
    ``errors run again: task 1 (RuntimeError; run 2 of 4), ...``."""
    from ..folder.journal import read_body

    spec = handle.spec.get("retry") or {}
    runs = int(spec.get("times", 0)) + 1
    parts = []
    for t in sorted(snap.reruns)[:most]:
        entry = handle.reader.reruns.get(t)
        name = "an error"
        if entry is not None:
            key = (entry[0], entry[1].res_off, entry[1].item)
            name = handle.rerun_types.get(key, "")
            if not name:
                try:
                    value = read_body(handle.store, entry[0], entry[1], {}, t)
                    name = handle.rerun_types[key] = str(value.get("type") or "an error")
                except Exception:  # (damaged, or written meanwhile): the count says enough
                    name = "an error"
        parts.append(f"task {t} ({name}; run {snap.reruns[t] + 1} of {runs})")
    more = len(snap.reruns) - most
    return "errors run again: " + ", ".join(parts) + (f" and {more} more tasks" if more > 0 else "")


def poll(cluster: Cluster, handle: JobHandle) -> None:
    """Periodic care while someone looks at the job: a job whose client was killed inside
    ``submit`` before it handed the job over is handed over now (``handover.take_over``: a
    JobError says why, if it cannot be); the backend's ``poll``; and tasks whose worker
    (started with its tasks given, on this machine) ended without a result are reported
    lost. The same for every backend."""
    with present(handle):
        if not handle.store.seen_submitted and not handle.store.queue().submitted:
            take_over(cluster, handle)
        cluster.poll(handle)
        if handle.store.queue().submitted:
            lost = handle.vanished()
            if lost:
                handle.report_lost(lost)
        if handle.spec.get("after"):
            settle(cluster, handle)


def cancel(cluster: Cluster, handle: JobHandle, *, reason: str | None = None) -> None:
    """Cancel the job: nothing new starts, the backend stops what runs; then the jobs that
    wait for it (``after=``) are cancelled, with a reason that names it. ``reason``: why,
    where the library cancels a job (its status and its tasks' errors say it). Cancelling a
    cancelled job again changes nothing; a purged one raises JobGone."""
    with present(handle):
        with handle.store.locked_queue() as q:
            q.cancel_job(reason)  # first: nothing new starts, whatever the backend does
            submitted = q.submitted
        if submitted:
            cluster.cancel_job(handle)
        state = handle.state.value
    Registry().set_state(handle.id, state)
    why = f"job {handle.name!r}, which it waits for, was cancelled"
    if reason:
        why += f" ({reason})"
    for entry in dependencies.dependents(handle):
        try:
            down_cluster, down = open_job(Path(entry["path"]))
            if not down.store.queue().cancelled and not snapshot(down_cluster, down).done:
                cancel(down_cluster, down, reason=why)
        except Exception as exc:  # purged, damaged: the others are still cancelled
            log.info("job %r: cannot cancel job %r, which waits for it: %s", handle.name, entry.get("name"), exc)


def cancel_task(cluster: Cluster, handle: JobHandle, index: int) -> bool:
    """Cancel task ``index``: marked cancelled in the folder, then the backend stops it. The
    job's other tasks go on. False if the task had ended already (nothing changes)."""
    with present(handle):
        snap = handle.snapshot()
        index = task_index(handle, index, snap.n)
        state = snap.task_state(index)
        if state in TERMINAL:
            return False
        check_move(state, TaskState.CANCELLED, task=index, job=handle.name)
        with handle.store.locked_queue() as q:
            q.cancel_task(index)
            submitted = q.submitted
        if submitted:
            cluster.cancel_task(handle, index)
            if handle.stream:  # an Executor's call: the worker of this machine running it stops
                stop_running_here(handle, index)
    return True


def retry(cluster: Cluster, handle: JobHandle, tasks: Iterable[int] | None = None,
          **resources: Any) -> list[int]:  # fmt: skip
    """Run failed and cancelled tasks again (``tasks``: those; default every one); returns
    the tasks started again. The backend is asked to start exactly those tasks
    (``submit_independent`` with ``handle.tasks`` set to them); ``resources`` reach it as
    ``handle.resources`` (batch schedulers: ``mem=``, ``walltime=``...). A task that another
    process retried meanwhile is left to that retry (so two retries at once run it once)."""
    if tasks is not None and (isinstance(tasks, (str, bytes)) or not isinstance(tasks, Iterable)):
        raise ConfigError(f"tasks= takes task indices, such as [0, 3] (all failed and cancelled "
                          f"tasks: leave it out), not {tasks!r}")  # fmt: skip
    with present(handle):
        before = handle.store.queue()  # read first: a retry after it is seen under the lock
        snap = handle.snapshot()
        if tasks is None:
            again = [
                i
                for i in range(snap.n)
                if snap.task_state(i) in (TaskState.FAILED, TaskState.CANCELLED)
            ]
        else:
            again = sorted({task_index(handle, i, snap.n) for i in tasks})
            for i in again:
                check_move(
                    snap.task_state(i), TaskState.QUEUED, task=i, job=handle.name, retry=True
                )
        if not again:
            return []
        if resources and not cluster.takes_resources():
            raise ConfigError(f"the {cluster.kind or type(cluster).__name__} cluster takes no resources "
                              f"for a retry: {', '.join(sorted(resources))}")  # fmt: skip
        with handle.store.locked_queue() as q:
            # not those that another process retried since ``before``
            again = [i for i in again if q.retried_at(i) == before.retried_at(i)]
            attempts = {}
            for i in again:
                f = snap.final.get(i)
                attempts[i] = (f[1].attempt + 1) if f else q.attempt(i) + 1
            if attempts:
                q.retry(attempts)
        if not again:
            return []
        handle.reader.forget(attempts)
        try:
            cluster.submit_independent(handle.for_tasks(again, resources))
        except BaseException as exc:
            # They will not run: failed with the reason, not left queued for ever.
            if handle.path.is_dir():
                handle.write_off(
                    dict.fromkeys(again, f"could not be started again: {type(exc).__name__}: {exc}")
                )
            raise
    return again


def purge(cluster: Cluster, handle: JobHandle, *, local: bool = True) -> None:
    """Delete the job: the backend's ``delete_job`` (it stops what runs and removes what the
    cluster keeps of the job), then, with ``local``, the job folder (renamed away at once,
    removed in the background) and its registry entry. Raises JobGone if the folder was gone
    already: of several purges at once, exactly one succeeds."""
    if local and not handle.path.is_dir():
        Registry().remove(handle.id)  # a row pointing at nothing helps no one
        raise gone(handle)
    removed = True
    try:
        with present(handle):
            cluster.delete_job(handle)
    except JobGone:
        if not local:
            raise
    except ValueError as exc:
        if not local or isinstance(exc, ConfigError):
            raise
        # a damaged folder (DamagedJob is a ValueError): its backend cannot read it; it goes all the same
        logging.getLogger(__name__).warning("purging job %r: its folder is damaged (%s); its cluster "
                                            "was not asked to stop it", handle.name, exc)  # fmt: skip
    finally:
        if local:
            removed = remove_folder(handle.path)
            if not housekeeping.drop(registration(handle.id)):  # (an ew.map job not registered yet)
                Registry().remove(handle.id)
    if not removed:
        raise gone(handle)


def registration(job_id: str) -> str:
    """The housekeeping key of the registration of job ``job_id``, made late (``submit.py``)."""
    return f"register {job_id}"


# -- jobs that wait for others (after=; dependencies.py) -----------------------------------------


def begin_after(cluster: Cluster, handle: JobHandle) -> None:
    """After a job made with ``after=`` is registered (held): cancel it (a job it waits for
    failed, was cancelled or purged), release it (they all finished), hand it to a backend
    that waits for them itself (``Cluster.native_after``), or leave it held; then start the
    process that watches it while there is something to watch."""
    dependencies.link(handle)
    looks = _look(handle)
    bad = dependencies.failure(looks)
    if bad is not None:
        log.info("job %r is cancelled: %s", handle.name, bad)
        cancel(cluster, handle, reason=bad)
        return
    waiting = [entry["id"] for entry, state in looks if state != dependencies.FINISHED]
    if not waiting:
        dependencies.release(cluster, handle)
        return
    handle.after = [handle.upstream[job_id][1] for job_id in waiting]
    try:
        if cluster.native_after(handle):
            dependencies.release(cluster, handle)
    except Exception as exc:
        if handle.store.queue().submitted:
            raise  # the backend failed to submit it: the submission fails, as any would
        log.warning("job %r: %s.native_after failed (%s): elsewhere holds it", handle.name,
                    type(cluster).__name__, exc)  # fmt: skip
    finally:
        handle.after = []
    dependencies.start_watcher(handle)


def settle(cluster: Cluster, handle: JobHandle) -> str:
    """Periodic care of a job made with ``after=``, at most once a second per process: a held
    job whose jobs all finished is released, one of which failed (was cancelled, purged) is
    cancelled with the reason; so is a job its scheduler holds. Returns what is left to watch:
    "held", "waiting" (its scheduler holds it), or "" (nothing: released, cancelled, free)."""
    if not handle.spec.get("after"):
        return ""
    q = handle.store.queue()
    if q.cancelled:
        return ""
    held = bool(q.held)
    if not held and handle.upstream.get("_done"):
        return ""
    now = time.monotonic()
    if now - float(handle.upstream.get("_looked", -dependencies.LOOK_S)) < dependencies.LOOK_S:
        return "held" if held else "waiting"
    handle.upstream["_looked"] = now
    looks = _look(handle)
    bad = dependencies.failure(looks)
    if bad is not None:
        log.info("job %r is cancelled: %s", handle.name, bad)
        cancel(cluster, handle, reason=bad)
        return ""
    if any(state != dependencies.FINISHED for _, state in looks):
        return "held" if held else "waiting"
    if held:
        dependencies.release(cluster, handle)
        return ""
    if _never_satisfied(cluster, handle):
        handle.upstream["_done"] = True
        return ""
    return "waiting"


def _look(handle: JobHandle) -> list[tuple[dict[str, str], str]]:
    """Each job ``handle``'s waits for, and its state now: a JobState's value, "gone" (purged)
    or "unreadable: why"; polled first (periodic care: results mirrored, lost tasks run
    again). Their clusters and handles are kept in ``handle.upstream``; a job found finished
    is not looked at again."""
    out: list[tuple[dict[str, str], str]] = []
    for entry in handle.spec.get("after") or ():
        job_id = entry["id"]
        got = handle.upstream.get(job_id)
        if got == dependencies.FINISHED:
            out.append((entry, dependencies.FINISHED))
            continue
        path = Path(entry["path"])
        try:
            if not isinstance(got, tuple):
                got = handle.upstream[job_id] = open_job(path)
            up_cluster, up = got
            try:
                poll(up_cluster, up)
            except JobGone:
                raise
            except Exception as exc:  # (an unreachable host): its state as the folder tells it
                log.info("polling job %r, which job %r waits for: %s", entry["name"], handle.name, exc)
            state = snapshot(up_cluster, up).job_state().value
        except Exception as exc:
            gone_now = isinstance(exc, JobGone) or not (path / "job.json").exists()
            state = "gone" if gone_now else f"unreadable: {type(exc).__name__}: {exc}"
        if state == dependencies.FINISHED:
            handle.upstream[job_id] = dependencies.FINISHED
        out.append((entry, state))
    return out


def _never_satisfied(cluster: Cluster, handle: JobHandle) -> bool:
    """The jobs it waits for all finished and its scheduler still holds it: fine while the
    scheduler catches up; if it says the dependency can never be met (a task of one of them
    was lost and run again in a new scheduler job), submitted again without it. True when
    there is nothing more to watch."""
    snap = snapshot(cluster, handle)
    if snap.running or snap.final or not snap.submitted:
        return snap.submitted
    if not any("DependencyNeverSatisfied" in r for r in snap.reasons.values()):
        return False
    log.info("job %r: its scheduler says its dependency can never be met, though the jobs it waits "
             "for finished: submitted again without it", handle.name)  # fmt: skip
    cluster.cancel_job(handle)
    cluster.submit_independent(handle.for_tasks(list(range(snap.n))))
    return True
