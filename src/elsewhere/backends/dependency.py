"""A batch scheduler's own dependency, for a job made with ``after=`` (``core/dependencies.py``).

A job that waits for jobs of the same scheduler, reached from the same host, is submitted at
once with the scheduler's flag (``syntax.build_dependency``: SLURM ``--dependency=afterok:ID``,
SGE ``-hold_jid ID``, PBS ``-W depend=afterok:ID``, LSF ``-w "done(ID)"``, Flux
``--dependency=afterok:ID``) naming every scheduler job of those jobs so far; the scheduler
holds it. Anything else (another scheduler, a job not submitted yet, a syntax without a
dependency: HTCondor) is held by the library.

A scheduler whose dependency waits for the jobs' end however they ended (Grid Engine's
``-hold_jid``: its syntax's ``dependency_checks_outcome`` is False) gets ``"check_after":
true`` in the waiting job's cluster data: its workers then look at the jobs it waits for
before they run anything, and cancel the job, with the reason, if one of them failed or was
cancelled (``run/jobrun.py``), whether or not a client looks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..folder.handle import JobHandle


class BatchCluster(Protocol):
    """What of a batch cluster (``batch.BatchCluster``, which imports this module) is used here."""

    syntax: Any

    def describe(self) -> dict[str, Any]: ...
    def get_job_cluster_data(self, job: JobHandle) -> dict[str, Any]: ...
    def set_job_cluster_data(self, job: JobHandle, data: dict[str, Any]) -> None: ...


__all__ = ["dependency_words"]

#: what must match in two clusters' descriptions for one's native ids to mean something to the other
SAME = ("class", "kind", "host", "syntax_options")


def dependency_words(
    cluster: BatchCluster, job: JobHandle, *, submitting: bool = False
) -> list[str] | None:
    """The words of ``cluster``'s submit command that make ``job`` wait until the jobs
    ``job.after`` finished OK, or None when the scheduler cannot hold it for them.
    ``submitting``: they go on the command now (the job's cluster data then says whether its
    workers must check the jobs' outcomes themselves)."""
    build = getattr(cluster.syntax, "build_dependency", None)
    if not job.after or build is None:
        return None
    mine = cluster.describe()
    ids: list[str] = []
    for up in job.after:
        theirs = up.spec.get("cluster") or {}
        if any(theirs.get(k) != mine.get(k) for k in SAME):
            return None  # another scheduler (or the same one reached from elsewhere)
        subs = up.cluster_data().get("submissions") or []
        if not subs:
            return None  # not submitted to it (yet)
        ids += [str(sub["native_id"]) for sub in subs]
    words = build(ids)
    if not words:
        return None
    if submitting and not getattr(cluster.syntax, "dependency_checks_outcome", True):
        cluster.set_job_cluster_data(
            job, {**cluster.get_job_cluster_data(job), "check_after": True}
        )
    return list(words)
