"""Handing a job to its backend: at submission (:func:`hand_over`), and later, for a job whose
client was killed inside ``submit`` after it registered the job and before it handed it over
(:func:`orphaned`), by the next poll of any process that looks at it (:func:`take_over`).

    submit ──register──> hand_over: submit_independent / submit_communicating ─> queue: submitted
       ✗ killed here: the job is registered, its queue not submitted, its client gone
    poll (control.py) ──take_over──> this process becomes the job's client ─> hand_over
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..folder.registry import Registry
from ..util.errors import ConfigError, JobError
from ..util.system import process_alive

if TYPE_CHECKING:
    from ..backends.base import Cluster
    from ..folder.handle import JobHandle


def hand_over(cluster: Cluster, handle: JobHandle, *, communicating: bool) -> None:
    """Hand the job (written and registered) to ``cluster``: ``submit_communicating`` or
    ``submit_independent``; then its queue says submitted, whatever the plugin did."""
    store = handle.store
    if communicating:
        if "communicating" not in cluster.capabilities:
            raise ConfigError(f"the {cluster.kind or type(cluster).__name__} cluster cannot run communicating "
                              "jobs (its backend lacks the capability 'communicating')")  # fmt: skip
        cluster.submit_communicating(handle)
    else:
        cluster.submit_independent(handle)
    if not store.seen_submitted and not store.queue().submitted:  # only ever set: no lock to look
        with store.locked_queue() as q:
            q.submit()  # the job is now in its hands


def orphaned(handle: JobHandle, meta: Mapping[str, Any] | None = None) -> bool:
    """Whether the job of ``handle`` (not submitted) was registered by a client of this
    machine that has ended (killed inside ``submit``, before it handed the job over), by
    ``meta`` (job.json; default the handle's). A client of another machine is never taken
    for gone (it cannot be looked at from here); nor is an open stream's (its tasks come
    from its client)."""
    meta = handle.spec if meta is None else meta
    client = meta.get("client")
    if meta.get("stream") or not isinstance(client, dict):
        return False
    if meta.get("after") and handle.store.queue().held:
        return False  # held for the jobs it waits for (after=): released by dependencies.settle
    pid = client.get("pid")
    if client.get("host") != os.uname().nodename or not isinstance(pid, int) or process_alive(pid):
        return False
    return bool(Registry().find(handle.id))  # registered: its inputs are whole


def take_over(cluster: Cluster, handle: JobHandle) -> bool:
    """Hand over a job whose client was killed inside ``submit`` after it registered the job
    and before it handed it to its cluster (the queue not submitted, the client gone, see
    :func:`orphaned`); True if this process did. It becomes the job's client (job.json's
    ``client`` names it, under the queue lock: of several processes looking at once, one
    hands the job over), then hands it over as ``submit`` would have. If that fails, a
    JobError says why, and the job is left to the next look (its client is again the one
    that died); unless the backend took it in part (its queue says submitted): then its tasks
    without an outcome fail as lost with that reason (``job.retry()`` runs them), so that
    nothing waits for ever for what was never started."""
    if not orphaned(handle):
        return False
    store = handle.store
    with store.locked_queue() as q:
        meta = store.meta()
        if q.submitted or not orphaned(handle, meta):  # another process took it over meanwhile
            handle.with_meta(meta)
            return False
        dead = meta["client"]
        meta = store.update_meta(client={**dead, "pid": os.getpid()})
    handle.with_meta(meta)
    try:
        hand_over(cluster, handle, communicating=bool(meta.get("communicating")))
    except BaseException as exc:
        try:
            with store.locked_queue():
                if store.meta().get("client") == meta["client"]:
                    handle.with_meta(store.update_meta(client=dead))
        except (OSError, ValueError):
            pass  # purged or damaged meanwhile: the error that brought us here says more
        if not isinstance(exc, Exception):
            raise
        kind = cluster.kind or type(cluster).__name__
        said = (f"job {handle.name!r} was registered by a client (process {dead.get('pid')} on "
                f"{dead.get('host')}) that ended before it handed the job to its {kind} cluster; handing it "
                "over now failed")  # fmt: skip
        why = f"{type(exc).__name__}: {exc}"
        if _written_off(handle, f"could not be handed to its {kind} cluster: {why}"):
            raise JobError(f"{said}, and its tasks not started fail with the reason (job.retry() runs "
                           f"them again once the cause is fixed): {why}") from exc  # fmt: skip
        raise JobError(f"{said} (the job stays registered: wait again once the cause is fixed, or purge "
                       f"it): {why}") from exc  # fmt: skip
    return True


def _written_off(handle: JobHandle, why: str) -> bool:
    """After a failed hand-over: if the backend took the job in part (its queue says
    submitted), fail its tasks without an outcome as lost with ``why``; whether it did."""
    try:
        if not handle.store.queue().submitted:
            return False
        done = handle.refresh()
        handle.write_off(dict.fromkeys((t for t in range(handle.n_tasks) if t not in done), why))
    except (OSError, ValueError):
        return False  # purged or damaged meanwhile
    return True
