"""Jobs that wait for others: ``after=[job, ...]`` of ``ew.submit``, ``ew.map`` and ``ew.create_job``.

A job made with ``after=`` runs only once every job it names has finished OK (each of their
tasks finished); if one of them fails, is cancelled or purged, it is cancelled, with a reason
that names that job. Cancelling a job cancels the jobs that wait for it, and theirs in turn::

    submit_job ──> hold (queue "after": registered, not handed over) ──> begin:
      ├─ a job it waits for failed, was cancelled or purged: cancelled with the reason
      ├─ all of them finished: released (handed over) at once
      ├─ its backend waits for them itself (Cluster.native_after: SLURM --dependency=afterok,
      │  SGE -hold_jid, PBS -W depend=afterok, LSF -w "done(..)", Flux --dependency=afterok):
      │  released at once, with ``handle.after``: the scheduler holds it
      └─ else held by the library: local workers, ssh nodes, peers, HTCondor, plugins
    then watched: ``settle`` at every poll of the job (a wait, a status) and in a small
    detached process (``python -m elsewhere.core.dependencies DIR``, its log the job's
    ``dependencies.log``) that lives while there is something to watch: it releases a held
    job once the jobs it waits for finished, and cancels a waiting job (held, or held by its
    scheduler) when one of them failed. A job whose scheduler found its dependency can never
    be met (SLURM's DependencyNeverSatisfied: a task of the job it waits for was lost and run
    again in a new scheduler job) is submitted again without it once they all finished.

Each waiting job leaves a file in the folder of each job it waits for,
``dependents/<its id>.json`` (``{"id", "name", "path"}``), written once by its submitter: how a
cancel finds the jobs that wait (:func:`cancel_dependents`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder.registry import Registry
from ..folder.store import write_json
from ..util.errors import ConfigError, JobNotFound
from ..util.states import JobState

if TYPE_CHECKING:
    from ..backends.base import Cluster
    from ..folder.handle import JobHandle

log = logging.getLogger(__name__)

__all__ = ["begin", "cancel_dependents", "hold", "note", "resolve", "settle", "watch"]

DEPENDENTS = "dependents"
#: the least time between two looks at the jobs a job waits for, from one process
LOOK_S = 1.0
_FINISHED = "finished"


# -- at submission ---------------------------------------------------------------------
def resolve(after: Any, *, own_id: str = "") -> list[dict[str, str]]:
    """``after=`` as the jobs to wait for: ``[{"id", "name", "path"}, ...]``. Takes a Job (or
    anything with ``id``, ``name`` and ``path``), a job's name or id (the newest job of that
    name), or a list of them. A ConfigError for anything else, a JobNotFound for a name no
    job has."""
    if after is None:
        return []
    items = [after] if isinstance(after, str) or _is_job(after) else after
    if not isinstance(items, Iterable) or isinstance(items, (bytes, dict)):
        raise ConfigError(f"after= takes jobs (Job objects, or their names or ids) or a list of them, "
                          f"not {after!r}")  # fmt: skip
    out: list[dict[str, str]] = []
    for item in items:
        if _is_job(item):
            entry = {"id": str(item.id), "name": str(item.name), "path": str(item.path)}
            if not (Path(entry["path"]) / "job.json").exists():
                raise JobNotFound(f"after=: job {entry['name']!r} is gone (purged): a job cannot wait for it")
        elif isinstance(item, str) and item:
            entry = _registered(item)
        else:
            raise ConfigError(f"after= takes jobs (Job objects, or their names or ids), not {item!r}")
        if entry["id"] == own_id:
            raise ConfigError("after=: a job cannot wait for itself")
        if all(e["id"] != entry["id"] for e in out):
            out.append(entry)
    return out


def _is_job(obj: Any) -> bool:
    return not isinstance(obj, str) and all(hasattr(obj, a) for a in ("id", "name", "path"))


def _registered(name_or_id: str) -> dict[str, str]:
    rows = Registry().find(name_or_id)
    for row in rows:
        if (Path(row["path"]) / "job.json").exists():
            return {"id": str(row["id"]), "name": str(row["name"]), "path": str(row["path"])}
    if rows:
        raise JobNotFound(f"after=: job {name_or_id!r} is gone (purged): a job cannot wait for it")
    raise JobNotFound(f"after=: no job named {name_or_id!r} (see ew.jobs() or `elsewhere jobs`)")


def hold(handle: JobHandle) -> None:
    """Before the job is registered: its queue holds it for the jobs of ``after=`` (so that
    no process hands it over before they finished, not even one taking over from a client
    killed while it submitted)."""
    ids = [e["id"] for e in handle.spec.get("after") or ()]
    if ids:
        with handle.store.locked_queue() as q:
            q.hold(ids)


def begin(cluster: Cluster, handle: JobHandle) -> None:
    """After the job is registered (held): cancel it, release it, hand it to a backend that
    waits itself, or leave it held; then watch it while there is something to watch (see
    the module)."""
    entries = list(handle.spec.get("after") or ())
    for entry in entries:
        _note_dependent(Path(entry["path"]), handle)
    looks = _look(handle, force=True)
    bad = _failure(looks)
    if bad is not None:
        _cancel(cluster, handle, bad)
        return
    waiting = [entry for entry, state in looks if state != _FINISHED]
    if not waiting:
        handle.upstream[_FINISHED] = True
        release(cluster, handle)
        return
    handle.after = [_handle_of(handle, e["id"]) for e in waiting]
    native = False
    try:
        native = bool(cluster.native_after(handle))
    except Exception as exc:  # a plugin's question: held by the library instead
        log.warning("job %r: %s.native_after failed (%s): elsewhere holds it", handle.name, type(cluster).__name__, exc)
    if native:
        try:
            release(cluster, handle)
        finally:
            handle.after = []
    _start_watcher(handle)


def _note_dependent(upstream: Path, handle: JobHandle) -> None:
    """``dependents/<id>.json`` in the folder of a job that ``handle``'s waits for."""
    folder = upstream / DEPENDENTS
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        write_json(folder / f"{handle.id}.json", {"id": handle.id, "name": handle.name, "path": str(handle.path)})
    except OSError as exc:  # purged meanwhile: the look that follows says so
        log.debug("cannot note job %r as waiting in %s: %s", handle.name, upstream, exc)


def _start_watcher(handle: JobHandle) -> None:
    """The small detached process that watches a waiting job (see the module)."""
    from ..folder.lifecycle import job_folders
    from ..hosts.spawn import spawn_python

    meta = handle.spec
    # as the job's client: its folders importable (a peer controller it may start reads the payload)
    found = job_folders(meta)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*found, *filter(None, [os.environ.get("PYTHONPATH")])])
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) and os.path.isdir(meta["cwd"]) else None
    try:
        spawn_python(["-m", "elsewhere.core.dependencies", str(handle.path)], log=handle.path / "dependencies.log",
                     env=env, cwd=cwd)  # fmt: skip
    except OSError as exc:  # then the job's next poll (a wait, a status) does its work
        log.warning("job %r: cannot start the process that watches the jobs it waits for: %s", handle.name, exc)


# -- the jobs waited for ----------------------------------------------------------------
def _handle_of(handle: JobHandle, job_id: str) -> JobHandle:
    got = handle.upstream.get(job_id)
    if isinstance(got, tuple):
        return got[1]
    entry = next(e for e in handle.spec.get("after") or () if e["id"] == job_id)
    from .submit import open_job

    cluster, up = open_job(Path(entry["path"]))
    handle.upstream[job_id] = (cluster, up)
    return up


def _look(handle: JobHandle, *, force: bool = False) -> list[tuple[dict[str, str], str]]:
    """Each job ``handle``'s waits for and its state now: a JobState's value, "gone" (purged)
    or "unreadable: why"; polled first (periodic care: results mirrored, lost tasks rerun).
    A job found finished is not looked at again."""
    from . import control
    from .submit import open_job

    out: list[tuple[dict[str, str], str]] = []
    for entry in handle.spec.get("after") or ():
        job_id = entry["id"]
        got = handle.upstream.get(job_id)
        if got == _FINISHED:
            out.append((entry, _FINISHED))
            continue
        path = Path(entry["path"])
        if not (path / "job.json").exists():
            out.append((entry, "gone"))
            continue
        try:
            if not isinstance(got, tuple):
                got = handle.upstream[job_id] = open_job(path)
            cluster, up = got
            try:
                control.poll(cluster, up)
            except Exception as exc:  # (an unreachable host): its state as the folder tells it
                log.info("polling job %r, which job %r waits for: %s", entry["name"], handle.name, exc)
            state = control.snapshot(cluster, up).job_state().value
        except Exception as exc:
            if not (path / "job.json").exists():
                state = "gone"
            else:
                state = f"unreadable: {type(exc).__name__}: {exc}"
        if state == _FINISHED:
            handle.upstream[job_id] = _FINISHED
        out.append((entry, state))
    return out


def _failure(looks: list[tuple[dict[str, str], str]]) -> str | None:
    """Why the job cannot run (a job it waits for failed, was cancelled or purged), or None."""
    for entry, state in looks:
        what = {JobState.FAILED.value: "failed", JobState.CANCELLED.value: "was cancelled",
                "gone": "was purged"}.get(state)  # fmt: skip
        if what is None and state.startswith("unreadable: "):
            what = f"cannot be read ({state.removeprefix('unreadable: ')})"
        if what is not None:
            return f"job {entry['name']!r} (id {entry['id']}), which it waits for, {what}"
    return None


def _cancel(cluster: Cluster, handle: JobHandle, reason: str) -> None:
    from . import control

    log.info("job %r is cancelled: %s", handle.name, reason)
    control.cancel(cluster, handle, reason=reason)


def release(cluster: Cluster, handle: JobHandle) -> bool:
    """Hand the held job to its cluster (the jobs it waits for finished, or its backend waits
    for them itself); False if it was not held any more (released or cancelled by another
    process meanwhile). This process becomes its client, as one taking over a job does."""
    from .handover import hand_over

    store = handle.store
    with store.locked_queue() as q:
        held = q.held
        if q.cancelled or q.submitted or not held:
            return False
        q.release()
        meta = store.meta()
        meta = store.update_meta(client={**(meta.get("client") or {}), "host": os.uname().nodename,
                                         "pid": os.getpid()})  # fmt: skip
    handle.with_meta(meta)
    try:
        hand_over(cluster, handle, communicating=bool(meta.get("communicating")))
    except BaseException:
        try:  # held again: the next look tries again
            with store.locked_queue() as q:
                if not q.submitted and not q.cancelled:
                    q.hold(held)
        except (OSError, ValueError):
            pass
        raise
    return True


# -- while it waits -----------------------------------------------------------------------
def settle(cluster: Cluster, handle: JobHandle) -> str:
    """Periodic care of a job made with ``after=``, at most once a second (:data:`LOOK_S`) per
    process: a held job whose jobs all finished is released, one of which failed (was
    cancelled, purged) is cancelled with the reason; so is a job its scheduler holds.
    Returns what there is left to watch: "held", "waiting" (its scheduler holds it), or
    "" (nothing: released and running, cancelled, or free)."""
    if not handle.spec.get("after"):
        return ""
    q = handle.store.queue()
    if q.cancelled:
        return ""
    held = bool(q.held)
    if not held and (handle.upstream.get("_done") or _started(handle)):
        handle.upstream["_done"] = True
        return ""
    now = time.monotonic()
    if now - float(handle.upstream.get("_looked", -LOOK_S)) < LOOK_S:
        return "held" if held else "waiting"
    handle.upstream["_looked"] = now
    looks = _look(handle)
    bad = _failure(looks)
    if bad is not None:
        _cancel(cluster, handle, bad)
        return ""
    if any(state != _FINISHED for _, state in looks):
        return "held" if held else "waiting"
    if held:
        release(cluster, handle)
        return ""
    return "" if _never_satisfied(cluster, handle) else "waiting"


def _started(handle: JobHandle) -> bool:
    """Whether a task of the job has run (its scheduler released it): nothing to watch."""
    return bool(handle.refresh()) or bool(handle.given_running())


def _never_satisfied(cluster: Cluster, handle: JobHandle) -> bool:
    """The jobs it waits for all finished and its scheduler still holds it: fine while the
    scheduler catches up; if it says the dependency can never be met (a task of one of them
    was lost and run again in a new scheduler job), submitted again without it. True when
    there is nothing more to watch."""
    from . import control

    snap = control.snapshot(cluster, handle)
    if snap.running or snap.final:
        return True
    if not any("DependencyNeverSatisfied" in r for r in snap.reasons.values()):
        return False
    log.info("job %r: its scheduler says its dependency can never be met, though the jobs it waits "
             "for finished: submitted again without it", handle.name)  # fmt: skip
    cluster.cancel_job(handle)
    cluster.submit_independent(handle.for_tasks(list(range(snap.n))))
    return True


def note(handle: JobHandle, held: list[str]) -> str:
    """What a held job waits for, for its status (``held``: the ids, from its queue)."""
    names = [e["name"] for e in handle.spec.get("after") or () if e["id"] in held]
    if not names:
        return ""
    shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"waiting for job{'s' if len(names) > 1 else ''} {shown} to finish (after=)"


# -- cancelling -------------------------------------------------------------------------------
def cancel_dependents(handle: JobHandle, why: str) -> list[str]:
    """Cancel the jobs that wait for ``handle``'s (those that have not ended), each with the
    reason ``why``; theirs in turn. Returns the names of the jobs cancelled here."""
    from . import control
    from .submit import open_job

    folder = handle.path / DEPENDENTS
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    done: list[str] = []
    for name in names:
        try:
            entry = json.loads((folder / name).read_text())
            cluster, down = open_job(Path(entry["path"]))
            if down.store.queue().cancelled or control.snapshot(cluster, down).done:
                continue
            control.cancel(cluster, down, reason=why)
            done.append(str(entry.get("name")))
        except Exception as exc:  # purged, damaged: the others are still cancelled
            log.info("job %r: cannot cancel the job %s that waits for it: %s", handle.name, name, exc)
    return done


# -- the watcher process ----------------------------------------------------------------------
def watch(path: Path, *, most_s: float = 10.0) -> int:
    """Watch the waiting job at ``path`` until there is nothing left to watch (see
    :func:`settle`), looking every second at first, then less often, up to every ``most_s``
    seconds. A job released here whose backend then runs something in this process (a peer
    controller) is carried on to its end. Returns an exit status."""
    from . import control
    from .submit import open_job

    try:
        cluster, handle = open_job(path)
    except Exception as exc:
        print(f"elsewhere: cannot watch job {path}: {exc}", file=sys.stderr, flush=True)
        return 1
    pause = LOOK_S
    while True:
        if not (path / "job.json").exists():
            return 0  # purged
        try:
            control.poll(cluster, handle)  # (settle included)
            left = settle(cluster, handle)
        except Exception as exc:
            print(f"elsewhere: watching job {handle.name!r}: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)  # fmt: skip
            left = "held"
        if not left:
            if _runs_here(cluster, handle):
                from .waiting import wait_for

                wait_for(cluster, handle, JobState.FINISHED, timeout=None, progress=False, poll_interval_s=1.0)
            return 0
        time.sleep(pause)
        pause = min(most_s, pause * 1.5)


def _runs_here(cluster: Cluster, handle: JobHandle) -> bool:
    """Whether the backend runs the job in this process (a peer controller started here)."""
    controller = getattr(cluster, "controller", None)
    try:
        return callable(controller) and controller(handle) is not None
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m elsewhere.core.dependencies JOB_DIR``: the watcher of a waiting job."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m elsewhere.core.dependencies JOB_DIR", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return watch(Path(args[0]).absolute())


if __name__ == "__main__":
    sys.exit(main())
