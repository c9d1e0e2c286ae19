"""Submitting a job: write its payload, register it, hand it to its backend, roll back on failure.

The one path every submission takes (``ew.submit``, ``ew.map``, ``job.submit()``,
``ew.submit_communicating``, an ``Executor``'s stream job)::

    submit_job(cluster, handle, fn, entries, form, job_data)
      ├─ cluster.prepare(handle, n)        workers may start while the inputs are written
      ├─ payload.log                       the function, the job data, one entry per task
      ├─ job.json: n_tasks, submitted      (made durable in the background)
      ├─ the registry                      the name is checked against running jobs here
      │                                    (ew.map's job, its name made unique: after the
      │                                    hand-over, once it has run a second; its purge
      │                                    forgets a registration not made yet)
      ├─ cluster.submit_independent(handle) / submit_communicating(handle)
      └─ queue: submitted                  whatever the backend did, the job is in its hands

A job made with ``after=`` is held in its queue before it is registered, and handed over by
``dependencies.begin`` instead: at once, to a backend that waits for those jobs itself, or
once they finished (``dependencies.py``).

A failure at any step removes the job folder and its registry entry: nothing half-submitted
is left behind (:func:`making`, which also covers the making of the folder). A full disk is
said as such: a JobError "cannot submit job NAME: no space left on <folder> (<n> bytes free)".
A client killed inside ``submit`` leaves a job that is registered (the next poll, of any
backend, hands it over: ``handover.py``) or none: a folder not registered yet is removed in the background
by a later process (:func:`sweep_unsubmitted`), and the workers started early in it leave when
they see its client gone. An ``ew.map`` job whose client was killed before it registered it
(in its first second) is registered by that sweep.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder import housekeeping, serial
from ..folder.handle import JobHandle
from ..folder.lifecycle import remove_folder
from ..folder.payload import PayloadWriter
from ..folder.registry import Registry
from ..folder.store import META, JobStore
from ..util.errors import JobError
from ..util.system import is_disk_full, no_space
from . import control, dependencies
from .handover import hand_over
from .opening import FORMAT, check_format, open_job

__all__ = ["FORMAT", "as_entries", "check_format", "making", "open_job", "submit_job", "sweep_unsubmitted"]

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


@contextmanager
def making(path: Path, name: str) -> Iterator[None]:
    """``with making(folder, name):`` making or submitting the job of the folder ``path``: on
    a failure the folder goes (renamed away at once, removed in the background), and a full
    disk is raised as a JobError that says so."""
    try:
        yield
    except BaseException as exc:
        remove_folder(path)
        if is_disk_full(exc):
            where = path.parent if isinstance(exc, OSError) else Registry().path.parent
            raise JobError(f"cannot submit job {name!r}: {no_space(where)}; nothing of it "
                           "was kept: free some space, then submit again") from exc  # fmt: skip
        raise


#: a job folder never submitted nor registered is removed this long after it was last written,
#: once its client has ended (a client on another machine: a day after)
UNSUBMITTED_GRACE_S = 600.0
_FOREIGN_GRACE_S = 86400.0


def sweep_unsubmitted(root: Path, grace_s: float = UNSUBMITTED_GRACE_S,
                      foreign_grace_s: float = _FOREIGN_GRACE_S) -> list[Path]:  # fmt: skip
    """Remove the job folders under ``root`` that a client killed while it submitted them left
    behind: never submitted (their queue says so, or is not written yet), not in the registry,
    their client (the process in ``job.json``) ended, untouched for ``grace_s`` (a client of
    another machine, or none written yet: ``foreign_grace_s``). Workers waiting in one leave it
    (they watch their client too). Returns the folders removed.

    An ``ew.map`` job whose client was killed in its first second (submitted, registered only
    once it runs a second: see :func:`submit_job`) is registered instead, as it would have
    been: its workers run it to its end, and it is listed, recovered and purged by name."""
    from ..folder.queue import QUEUE, QUEUE_B, QUEUE_LOCK
    from ..util.system import process_alive

    now = time.time()
    try:
        names = [n for n in os.listdir(root) if not n.startswith(".")]
    except OSError:
        return []
    removed: list[Path] = []
    registered: set[str] | None = None

    def listed(name: str) -> bool | None:  # None: the registry cannot be read
        nonlocal registered
        if registered is None:
            try:
                registered = Registry().ids()
            except Exception:
                return None
        return name in registered

    for name in names:
        folder = root / name
        try:
            if not (folder / QUEUE_LOCK).exists():
                continue
            submitted = JobStore(folder).queue().submitted
        except ValueError:
            # no slot whole: damaged (left alone), or never written (made, not yet queued)
            if not _empty(folder / QUEUE) or not _empty(folder / QUEUE_B):
                continue
            submitted = False
        except OSError:
            continue
        if submitted and listed(name) is not False:
            continue  # (the registry read first: most submitted jobs are in it)
        try:
            meta = JobStore(folder).meta()
        except (OSError, ValueError):
            meta = {}
        if not isinstance(meta, dict) or (submitted and meta.get("notify") != "end"):
            continue
        client = meta.get("client")
        if not isinstance(client, dict):
            client = {}
        here = client.get("host") == os.uname().nodename
        pid = client.get("pid")
        if here and isinstance(pid, int) and process_alive(pid):
            continue
        if now - _last_written(folder) < (grace_s if here else max(grace_s, foreign_grace_s)):
            continue
        known = listed(name)
        if known is None:
            return removed  # the registry cannot be read: nothing is known to be unregistered
        if known:
            continue
        if submitted:
            register_found(meta, folder)
        else:
            remove_folder(folder)
            removed.append(folder)
    return removed


def _empty(path: Path) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return False


def _last_written(folder: Path) -> float:
    times = []
    for name in (META, "queue.json", "queue.b.json", "payload.log"):
        try:
            times.append(os.stat(folder / name).st_mtime)
        except OSError:
            pass
    return max(times, default=0.0)


def submit_job(cluster: Cluster, handle: JobHandle, fn: Any, entries: list[Any], form: str, job_data: Any,
               *, queue_n: int | None = None, communicating: bool = False,
               extra_fns: tuple[Any, ...] = (), register_late: bool = False) -> dict[str, Any]:  # fmt: skip
    """Write ``entries`` (tasks in ``form``) as the job's payload, register the job and hand it
    to ``cluster``; returns the job's metadata as written. ``queue_n``: the task count the
    queue was made with, if known (else it is written here). ``register_late``: a job that its
    caller purges once it ends, and whose name was made unique (``ew.map``'s): registered
    only once it has run ``housekeeping.SYNC_DELAY_S`` (see the module)."""
    with making(handle.path, handle.name):
        args = (fn, entries, form, job_data, queue_n, communicating, extra_fns, register_late)
        return _submit(cluster, handle, *args)


def _submit(cluster: Cluster, handle: JobHandle, fn: Any, entries: list[Any], form: str, job_data: Any,
            queue_n: int | None, communicating: bool, extra_fns: tuple[Any, ...],
            register_late: bool) -> dict[str, Any]:  # fmt: skip
    store = handle.store
    root = store.path.parent
    housekeeping.call_later(f"unsubmitted {root}", lambda: sweep_unsubmitted(root))
    waits = bool(handle.spec.get("after"))
    if not communicating and not waits:  # (a job that waits needs no workers yet)
        try:
            cluster.prepare(handle, len(entries))  # workers start while the inputs are written
        except Exception:
            pass  # submit_independent will try again and report
    # (a failure up to registering: the folder goes, see making; workers started early
    # may be inside: it is renamed away first, then removed)
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
    if waits:
        dependencies.hold(handle)  # before it is registered: nobody hands it over early
    late = register_late and not waits and not meta.get("stream")
    reg = None if late else Registry()  # (a late one: registered by housekeeping, if at all)
    if reg is not None:
        reg.add(meta, store.path, current_state)
    try:
        if meta.get("stream"):
            most = cluster.max_workers(0)  # (a plugin may ask its scheduler: not under the lock)
            with store.locked_queue() as q:
                q.set_max_workers(most)
        if waits:
            control.begin_after(cluster, handle)
        else:
            hand_over(cluster, handle, communicating=communicating)
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
        try:
            if reg is not None:
                reg.remove(handle.id)
        finally:
            remove_folder(store.path)  # (and again by making: a no-op)
        raise
    if late:
        path = store.path
        housekeeping.later(control.registration(handle.id), lambda: register_found(meta, path))
    return meta


def register_found(meta: dict[str, Any], path: Path) -> None:
    """Register the job ``meta`` of the folder ``path``, if it is still there, registered late
    (an ``ew.map`` job that ran a second) or found unregistered by a sweep. Its name was made
    unique: one in use (by chance) is said in the log, and the job left unlisted."""
    if not (path / META).exists():
        return
    try:
        Registry().add(meta, path, current_state)
    except JobError as exc:
        logging.getLogger(__name__).warning("elsewhere: job %r is not listed: %s", meta.get("name"), exc)


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
