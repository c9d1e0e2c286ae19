"""Controlling a job: its state, cancel, cancel one task, retry, poll, report what was lost.

Every change of a job's state goes through here, the same way for every backend, plugins
included: first the job folder (the queue's named transitions, checked against the state
vocabulary), then the backend's hook. So a task cancelled or retried is so in the folder
whatever the backend does, and a job recovered in another process sees it.

=======================  ===========================================================
``snapshot``             the tasks' states: read from the folder, then made fresher by
                         the backend's ``job_state``
``poll``                 periodic care: the backend's ``poll``; workers on this machine
                         that ended while running a task are reported lost
``cancel``               queue: cancelled; then ``cancel_job``
``cancel_task``          queue: that task cancelled; then ``cancel_task``
``retry``                queue: the tasks to run again, with their attempts; then
                         ``submit_independent`` with exactly those tasks
``restarter``            what ``JobHandle.report_lost`` calls to rerun lost tasks
=======================  ===========================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..folder.handle import JobHandle, Restart
from ..folder.registry import Registry
from ..folder.snapshot import Snapshot
from ..util.errors import ConfigError
from ..util.states import TERMINAL, TaskState, check_move

if TYPE_CHECKING:
    from ..backends.base import Cluster


def restarter(cluster: Cluster) -> Restart:
    """The function that starts tasks again on ``cluster`` (given to every handle)."""

    def restart(handle: JobHandle, tasks: list[int]) -> None:
        cluster.submit_independent(handle.for_tasks(tasks))

    return restart


def snapshot(cluster: Cluster, handle: JobHandle) -> Snapshot:
    """The tasks' states now: the folder's, made fresher by the backend where it knows more."""
    snap = handle.snapshot()
    if snap.submitted and not snap.cancelled and len(snap.final) < snap.n:
        snap = cluster.job_state(handle, snap)
    return snap


def poll(cluster: Cluster, handle: JobHandle) -> None:
    """Periodic care while someone looks at the job: the backend's ``poll``, and tasks whose
    worker (started with its tasks given, on this machine) ended without a result are
    reported lost, for every backend."""
    cluster.poll(handle)
    if handle.store.queue().submitted:
        lost = handle.vanished()
        if lost:
            handle.report_lost(lost)


def cancel(cluster: Cluster, handle: JobHandle) -> None:
    """Cancel the job: nothing new starts, the backend stops what runs."""
    with handle.store.locked_queue() as q:
        q.cancel_job()  # first: nothing new starts, whatever the backend does
        submitted = q.submitted
    if submitted:
        cluster.cancel_job(handle)
    Registry().set_state(handle.id, handle.state.value)


def cancel_task(cluster: Cluster, handle: JobHandle, index: int) -> bool:
    """Cancel task ``index``: marked cancelled in the folder, then the backend stops it. The
    job's other tasks go on. False if the task had ended already (nothing changes)."""
    snap = handle.snapshot()
    if not 0 <= index < snap.n:
        raise IndexError(f"job {handle.name!r} has no task {index} (it has {snap.n})")
    state = snap.task_state(index)
    if state in TERMINAL:
        return False
    check_move(state, TaskState.CANCELLED, task=index, job=handle.name)
    with handle.store.locked_queue() as q:
        q.cancel_task(index)
        submitted = q.submitted
    if submitted:
        cluster.cancel_task(handle, index)
    return True


def retry(cluster: Cluster, handle: JobHandle, tasks: Iterable[int] | None = None,
          **resources: Any) -> list[int]:  # fmt: skip
    """Run failed and cancelled tasks again (``tasks``: those; default every one); returns
    the tasks started again. The backend is asked to start exactly those tasks
    (``submit_independent`` with ``handle.tasks`` set to them); ``resources`` reach it as
    ``handle.resources`` (batch schedulers: ``mem=``, ``walltime=``...)."""
    snap = handle.snapshot()
    if tasks is None:
        again = [i for i in range(snap.n) if snap.task_state(i) in (TaskState.FAILED, TaskState.CANCELLED)]
    else:
        again = sorted(set(tasks))
        for i in again:
            if not 0 <= i < snap.n:
                raise IndexError(f"job {handle.name!r} has no task {i} (it has {snap.n})")
            check_move(snap.task_state(i), TaskState.QUEUED, task=i, job=handle.name, retry=True)
    if not again:
        return []
    if resources and not cluster.takes_resources():
        raise ConfigError(f"the {cluster.kind or type(cluster).__name__} cluster takes no resources for a "
                          f"retry: {', '.join(sorted(resources))}")  # fmt: skip
    with handle.store.locked_queue() as q:
        attempts = {}
        for i in again:
            f = snap.final.get(i)
            attempts[i] = (f[1].attempt + 1) if f else q.attempt(i) + 1
        q.retry(attempts)
    handle.reader.forget(attempts)
    try:
        cluster.submit_independent(handle.for_tasks(again, resources))
    except BaseException as exc:
        # They will not run: failed with the reason, not left queued for ever.
        handle.write_off(dict.fromkeys(again, f"could not be started again: {type(exc).__name__}: {exc}"))
        raise
    return again
