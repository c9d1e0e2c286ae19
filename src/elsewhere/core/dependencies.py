"""Jobs that wait for others: ``after=[job, ...]`` of ``ew.submit``, ``ew.map`` and ``ew.create_job``.

A job made with ``after=`` runs only once every job it names has finished OK (each of their
tasks finished); if one of them fails, is cancelled or purged, it is cancelled, with a reason
that names that job. Cancelling a job cancels the jobs that wait for it, and theirs in turn::

    submit_job ──> hold (queue "after": registered, not handed over) ──> control.begin_after:
      ├─ a job it waits for failed, was cancelled or purged: cancelled with the reason
      ├─ all of them finished: released (handed over) at once
      ├─ its backend waits for them itself (Cluster.native_after: SLURM --dependency=afterok,
      │  SGE -hold_jid, PBS -W depend=afterok, LSF -w "done(..)", Flux --dependency=afterok):
      │  released at once, with ``handle.after``: the scheduler holds it
      └─ else held by the library: local workers, ssh nodes, peers, HTCondor, plugins
    then watched: ``control.settle`` at every poll of the job (a wait, a status) and in a
    small detached process (``python -m elsewhere.core.watcher DIR``, its log the job's
    ``dependencies.log``) that lives while there is something to watch: it releases a held
    job once the jobs it waits for finished, and cancels a waiting job (held, or held by its
    scheduler) when one of them failed. A job whose scheduler found its dependency can never
    be met (SLURM's DependencyNeverSatisfied: a task of the job it waits for was lost and run
    again in a new scheduler job) is submitted again without it once they all finished.

Here: what does not act on other jobs (naming the jobs, holding, releasing, the notes and
the links between jobs); ``control.py`` looks at the jobs waited for and cancels.

Each waiting job leaves a file in the folder of each job it waits for,
``dependents/<its id>.json`` (``{"id", "name", "path"}``), written once by its submitter: how a
cancel finds the jobs that wait (:func:`dependents`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder.registry import Registry
from ..folder.store import write_json
from ..util.errors import ConfigError, JobNotFound
from ..util.states import JobState
from .handover import hand_over

if TYPE_CHECKING:
    from ..backends.base import Cluster
    from ..folder.handle import JobHandle

log = logging.getLogger(__name__)

__all__ = ["dependents", "failure", "hold", "link", "note", "release", "resolve", "start_watcher"]

DEPENDENTS = "dependents"
#: the least time between two looks at the jobs a job waits for, from one process
LOOK_S = 1.0
#: the state of a job waited for that finished (a JobState's value)
FINISHED = JobState.FINISHED.value


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


def link(handle: JobHandle) -> None:
    """``dependents/<id>.json`` in the folder of each job ``handle``'s waits for: how a
    cancel of that job finds this one."""
    for entry in handle.spec.get("after") or ():
        folder = Path(entry["path"]) / DEPENDENTS
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            write_json(folder / f"{handle.id}.json", {"id": handle.id, "name": handle.name, "path": str(handle.path)})
        except OSError as exc:  # purged meanwhile: the look that follows says so
            log.debug("cannot note job %r as waiting in %s: %s", handle.name, entry["path"], exc)


def dependents(handle: JobHandle) -> list[dict[str, str]]:
    """The jobs that wait for ``handle``'s (``{"id", "name", "path"}`` each), as their links say."""
    folder = handle.path / DEPENDENTS
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            entry = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            out.append(entry)
    return out


def failure(looks: list[tuple[dict[str, str], str]]) -> str | None:
    """Why a job cannot run, from the states of the jobs it waits for (``(entry, state)``: a
    JobState's value, "gone" or "unreadable: why"): one of them failed, was cancelled or
    purged; or None."""
    for entry, state in looks:
        what = {JobState.FAILED.value: "failed", JobState.CANCELLED.value: "was cancelled",
                "gone": "was purged"}.get(state)  # fmt: skip
        if what is None and state.startswith("unreadable: "):
            what = f"cannot be read ({state.removeprefix('unreadable: ')})"
        if what is not None:
            return f"job {entry['name']!r}, which it waits for, {what}"
    return None


def note(handle: JobHandle, held: list[str]) -> str:
    """What a held job waits for, for its status (``held``: the ids, from its queue)."""
    names = [e["name"] for e in handle.spec.get("after") or () if e["id"] in held]
    if not names:
        return ""
    shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"waiting for job{'s' if len(names) > 1 else ''} {shown} to finish (after=)"


def release(cluster: Cluster, handle: JobHandle) -> bool:
    """Hand the held job to its cluster (the jobs it waits for finished, or its backend waits
    for them itself); False if it was not held any more (released or cancelled by another
    process meanwhile). This process becomes its client, as one taking over a job does."""
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


def start_watcher(handle: JobHandle) -> None:
    """The small detached process that watches a waiting job (``core/watcher.py``)."""
    from ..folder.lifecycle import job_folders
    from ..hosts.spawn import spawn_python

    meta = handle.spec
    # as the job's client: its folders importable (a peer controller it may start reads the payload)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*job_folders(meta), *filter(None, [os.environ.get("PYTHONPATH")])])
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) and os.path.isdir(meta["cwd"]) else None
    try:
        spawn_python(["-m", "elsewhere.core.watcher", str(handle.path)], log=handle.path / "dependencies.log",
                     env=env, cwd=cwd)  # fmt: skip
    except OSError as exc:  # then the job's next poll (a wait, a status) does its work
        log.warning("job %r: cannot start the process that watches the jobs it waits for: %s", handle.name, exc)
