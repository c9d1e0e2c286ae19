"""Submitting a job: write its payload, register it, hand it to its backend, roll back on failure.

The one path every submission takes (``ew.submit``, ``ew.map``, ``job.submit()``,
``ew.submit_communicating``, an ``Executor``'s stream job)::

    submit_job(cluster, handle, fn, entries, form, job_data)
      ├─ cluster.prepare(handle, n)        workers may start while the inputs are written
      ├─ payload.log                       the function, the job data, one entry per task
      ├─ job.json: n_tasks, submitted      (made durable in the background)
      ├─ the registry                      the name is checked against running jobs here
      ├─ cluster.submit_independent(handle) / submit_communicating(handle)
      └─ queue: submitted                  whatever the backend did, the job is in its hands

A failure at any step removes the job folder and its registry entry: nothing half-submitted
is left behind.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder import housekeeping, serial
from ..folder.handle import JobHandle
from ..folder.lifecycle import remove_folder
from ..folder.payload import PayloadWriter
from ..folder.registry import Registry
from ..folder.store import META, JobStore
from ..util.errors import ConfigError

if TYPE_CHECKING:
    from ..backends.base import Cluster


def as_entries(tasks: list[Any], form: str) -> list[Any]:
    """``(fn, args, kwargs)`` triples from tasks in ``form``: ``"single"`` (each task's only
    argument), ``"args"`` (argument tuples) or ``"entries"`` (the triples already)."""
    if form == "single":
        return [(None, (a,), {}) for a in tasks]
    if form == "args":
        return [(None, a, {}) for a in tasks]
    return tasks


def submit_job(cluster: Cluster, handle: JobHandle, fn: Any, entries: list[Any], form: str, job_data: Any,
               *, queue_n: int | None = None, communicating: bool = False,
               extra_fns: tuple[Any, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """Write ``entries`` (tasks in ``form``) as the job's payload, register the job and hand it
    to ``cluster``; returns the job's metadata as written. ``queue_n``: the task count the
    queue was made with, if known (else it is written here)."""
    store = handle.store
    if not communicating:
        try:
            cluster.prepare(handle, len(entries))  # workers start while the inputs are written
        except Exception:
            pass  # submit_independent will try again and report
    try:
        shared = cluster.shares_filesystem()
        with (PayloadWriter(store.path / "payload.log", compress=not shared) as w,
              serial.by_value_for([fn, *extra_fns], shared_fs=shared)):
            try:
                w.write_common(fn, job_data)
                if entries:
                    w.write_tasks(0, entries, form=form)
            except Exception:
                serial.check_serialisable(fn, as_entries(entries, form), job_data=job_data)  # names the culprit
                raise
    except BaseException:
        remove_folder(store.path)  # workers started early may be inside: rename, then remove
        raise
    n = len(entries)
    meta = dict(handle.spec)
    if meta.get("stream"):
        meta = store.update_meta(fsync=False, submitted=time.time())
    elif meta.get("n_tasks") != n or not meta.get("submitted"):
        meta = store.update_meta(fsync=False, n_tasks=n, submitted=time.time())
    housekeeping.sync_later(store.path, (META, "payload.log"))  # durable in the background, at exit at the latest
    handle.with_meta(meta)
    if not meta.get("stream") and queue_n != n and store.queue().n != n:  # usually written at creation
        with store.locked_queue() as q:
            q.set_size(n)
    reg = Registry()
    try:
        reg.add(meta, store.path, current_state)
    except BaseException:
        remove_folder(store.path)  # workers started early may be inside: rename, then remove
        raise
    try:
        if meta.get("stream"):
            with store.locked_queue() as q:
                q.set_max_workers(cluster.max_workers(0))
        if communicating:
            if "communicating" not in cluster.capabilities:
                raise ConfigError(f"the {cluster.kind or type(cluster).__name__} cluster cannot run communicating "
                                  "jobs (its backend lacks the capability 'communicating')")  # fmt: skip
            cluster.submit_communicating(handle)
        else:
            cluster.submit_independent(handle)
        if not store.seen_submitted and not store.queue().submitted:  # only ever set: no lock to look
            with store.locked_queue() as q:
                q.submit()  # whatever the plugin did: the job is now in its hands
    except BaseException:
        # Do not leave a half-submitted job behind: the backend takes back what it started
        # (best effort: the error that brought us here is the one to raise), then the folder goes.
        try:
            with store.locked_queue() as q:
                q.cancel_job()
            cluster.cancel_job(handle)
            cluster.delete_job(handle)
        except Exception:
            pass
        reg.remove(handle.id)
        remove_folder(store.path)
        raise
    return meta


def open_job(path: Path, *, check: bool = False) -> tuple[Cluster, JobHandle]:
    """The cluster and handle of the job folder at ``path`` (for a job made earlier, perhaps by
    another process). ``check``: run the cluster's ``post_construct`` (a user asked for the
    cluster; not when it is rebuilt only to read a job)."""
    from ..backends import from_description

    store = JobStore(path)
    meta = store.meta()
    check_format(meta, path)
    cluster = from_description(meta["cluster"], check=check)
    from .control import restarter

    return cluster, JobHandle(store, meta, restart=restarter(cluster))


#: The job folder format this version writes and reads (``job.json``'s "format").
FORMAT = 1


def check_format(meta: dict[str, Any], path: Path) -> None:
    """JobError unless this version reads the job folder at ``path`` (its ``job.json``)."""
    from ..util.errors import JobError

    got = meta.get("format")
    if not isinstance(got, int) or not isinstance(meta.get("cluster"), dict) or "id" not in meta:
        raise JobError(f"{path} is not a job folder this version of elsewhere can read "
                       f"(job.json has no format, id or cluster)")  # fmt: skip
    if got > FORMAT:
        from ..util.version import __version__

        raise JobError(f"the job folder {path} was written by a newer elsewhere (format {got}); "
                       f"elsewhere {__version__} reads format {FORMAT}: upgrade it to read this job")  # fmt: skip


def current_state(row: dict[str, Any]) -> str | None:
    """The state of a registered job now (the registry asks when a name is taken again)."""
    path = Path(row["path"])
    if not (path / "job.json").exists():
        return None
    try:
        cluster, handle = open_job(path)
        cluster.poll(handle)  # a job whose workers all died is not running
        return handle.state.value
    except Exception:
        return None
