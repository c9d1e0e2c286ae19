"""Opening a job made earlier, perhaps by another process: its cluster rebuilt from its
description, its handle given the function that starts its tasks again (what
``JobHandle.report_lost`` calls for a lost task while the job's retries last)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder.handle import JobHandle, Restart
from ..folder.store import JobStore

if TYPE_CHECKING:
    from ..backends.base import Cluster

__all__ = ["FORMAT", "check_format", "open_job", "restarter"]

#: The job folder format this version writes and reads (``job.json``'s "format").
FORMAT = 2  # 2: checksummed bodies, frames and JSON files (1 is read too)


def restarter(cluster: Cluster) -> Restart:
    """The function that starts tasks again on ``cluster`` (given to every handle)."""

    def restart(handle: JobHandle, tasks: list[int]) -> None:
        cluster.submit_independent(handle.for_tasks(tasks))

    return restart


def open_job(path: Path, *, check: bool = False) -> tuple[Cluster, JobHandle]:
    """The cluster and handle of the job folder at ``path`` (for a job made earlier, perhaps by
    another process). ``check``: run the cluster's ``post_construct`` (a user asked for the
    cluster; not when it is rebuilt only to read a job)."""
    from ..backends import from_description

    store = JobStore(path)
    meta = store.meta()
    check_format(meta, path)
    cluster = from_description(meta["cluster"], check=check)
    return cluster, JobHandle(store, meta, restart=restarter(cluster))


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
