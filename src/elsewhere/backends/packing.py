"""How many array elements a batch job gets, and how they take their tasks.

An array element costs time before it runs anything: the scheduler starts it, Python starts,
the worker joins the job. On the SLURM of the CI machine the first element of a new array
runs Python 0.4-0.6 s after ``sbatch`` returns, and 8 CPUs start a new wave of elements about
every second (:data:`ELEMENT_START_S`). A thousand tasks of 10 ms, one element each, so take
two minutes there; in 8 elements they take two seconds. :func:`plan_elements` decides::

    tasks_per_element=k given     ceil(n / k) elements, each given k tasks (as asked)
    tasks known to be long        one element per task, given (a task of >= LONG_TASK
      (mean >= LONG_TASK x start)   element starts pays little for its element, and the
                                    scheduler accounts, cancels and limits each on its own)
    otherwise                     E = the least of: the tasks; the queue's usable slots
                                    (CPUs in service // cores_per_task); max_running;
                                    max_elements; and, once task times are known, the
                                    slots idle now and the work over an element's start
                                    (n x mean / ELEMENT_START_S)
      E == n                        one element per task, given (as before: small jobs)
      E <  n                        E elements that claim their tasks from the job's queue
                                    (``run/claims.py``): elements that start early or get
                                    short tasks take more, so the load balances; an element
                                    that starts when nothing is left exits at once

The usable slots count CPUs that run other jobs now: an element that waits for one joins
when it frees up and claims what is left, so a job of long tasks on a busy queue still gets
as many CPUs as the queue can give it, and a job of short tasks that is done before that
element starts costs it one start. Where the scheduler cannot be asked
(``SchedulerSyntax.build_free_cpus`` returns None) the bound is the tasks and max_elements.

Elements claim only where they see the client's job folder (no ``remote_storage``): the
queue is a file shared under a lock. Otherwise the E elements are given ceil(n / E) tasks
each. Task times are known on a rerun (:func:`measured`: the job's own outcomes); a new
job's are not, and its elements measure them as they claim.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..folder.records import Kind
from .claiming import runs

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..schedulers.capacity import FreeCpus

__all__ = [
    "ELEMENT_START_S",
    "LONG_TASK",
    "Packing",
    "measured",
    "packed_record",
    "plan_elements",
    "plan_job",
]

#: Seconds an array element costs before its first task, measured on the CI machine's SLURM
#: (``bench/slurm_short.py`` prints it): used until a job has measured its own.
ELEMENT_START_S = 1.0
#: A task this many times an element's start is long: one element per task.
LONG_TASK = 10.0


@dataclass(frozen=True)
class Packing:
    """What :func:`plan_elements` decided for ``n`` tasks.

    Attributes:
        elements: array elements to submit (before any split at the scheduler's largest array).
        per_element: tasks each element is given (the last one may have fewer); 0: the
            elements claim their tasks from the job's queue.
        why: the reason, one line (kept with the submission, shown by ``elsewhere status``).
    """

    elements: int
    per_element: int
    why: str

    def __post_init__(self) -> None:
        if self.elements < 1 or self.per_element < 0:
            raise ValueError(f"a packing needs elements >= 1 and per_element >= 0, not {self!r}")

    @property
    def claims(self) -> bool:
        """Whether the elements claim their tasks from the job's queue."""
        return self.per_element == 0


def plan_elements(
    n: int,
    *,
    cpus: FreeCpus | None,
    cores_per_task: int = 1,
    tasks_per_element: int | None = None,
    max_elements: int = 1000,
    max_running: int | None = None,
    mean_s: float | None = None,
    start_s: float = ELEMENT_START_S,
    can_claim: bool = True,
) -> Packing:
    """The elements for ``n`` tasks (see the module's table).

    Args:
        n: tasks to run (at least 1).
        cpus: the queue's CPUs now (``FreeCpus``), None when the scheduler cannot be asked.
        cores_per_task: cores each task (so each element) asks for.
        tasks_per_element: the user's choice; it wins.
        max_elements: the most elements (the user's bound and the scheduler's largest array).
        max_running: elements the scheduler may run at once (SLURM ``%N``), if bounded.
        mean_s: seconds a task takes, when measured (a rerun); None for a new job.
        start_s: seconds an element costs before its first task.
        can_claim: whether elements can claim from the job's queue (they see its folder).
    """
    if n < 1:
        raise ValueError(f"plan_elements needs at least one task, not {n!r}")
    most = max(1, max_elements)
    if tasks_per_element:
        return Packing(math.ceil(n / tasks_per_element), tasks_per_element, "tasks_per_element")
    if mean_s is not None and mean_s >= LONG_TASK * start_s:
        per = math.ceil(n / most)
        return Packing(math.ceil(n / per), per, f"tasks of {mean_s:.3g} s: one element per task")
    bound, why = min(n, most), "one element per task"
    slots = max(1, cpus.usable // cores_per_task) if cpus is not None else None
    if slots is not None and slots < bound:
        bound, why = slots, f"{slots} usable slots"
    if max_running and max_running < bound:
        bound, why = max_running, f"max_running={max_running}"
    if mean_s is not None:
        idle = cpus.idle // cores_per_task if cpus is not None else 0
        if 1 <= idle < bound:  # the others would start once the short work is done
            bound, why = idle, f"{idle} idle slots, tasks of {mean_s:.3g} s"
        work = max(1, math.ceil(n * mean_s / start_s))
        if work < bound:
            bound, why = work, f"{n} tasks of {mean_s:.3g} s: {n * mean_s:.3g} s of work"
    if bound >= n:
        return Packing(n, 1, why)
    if can_claim:
        return Packing(bound, 0, why)
    per = math.ceil(n / bound)
    return Packing(math.ceil(n / per), per, why)


class _Cluster(Protocol):
    """What :func:`plan_job` reads of a batch cluster (``BatchCluster``)."""

    cores_per_task: int
    tasks_per_element: int | None
    max_elements: int
    max_running: int | None

    def free_cpus(self) -> FreeCpus | None: ...
    def max_array_size(self) -> int: ...
    def shares_filesystem(self) -> bool: ...
    def get_job_cluster_data(self, job: JobHandle) -> dict[str, Any]: ...


def plan_job(cluster: _Cluster, job: JobHandle, n: int) -> Packing:
    """:func:`plan_elements` for ``n`` tasks of ``job`` on ``cluster``: its settings, its
    queue's CPUs now (not asked for one task, nor with ``tasks_per_element``), its largest
    array, and what the job measured so far (:func:`measured`)."""
    subs = cluster.get_job_cluster_data(job).get("submissions", [])
    mean_s, start_s = measured(job, subs) if subs else (None, None)
    given = cluster.tasks_per_element
    return plan_elements(
        n,
        cpus=cluster.free_cpus() if n > 1 and not given else None,
        cores_per_task=cluster.cores_per_task,
        tasks_per_element=given,
        max_elements=cluster.max_elements
        if given
        else min(cluster.max_elements, cluster.max_array_size()),
        max_running=cluster.max_running,
        mean_s=mean_s,
        start_s=start_s or ELEMENT_START_S,
        can_claim=cluster.shares_filesystem(),
    )


def packed_record(job: JobHandle, tasks: list[int], plan: Packing) -> dict[str, Any]:
    """What a submission's record (cluster data) keeps of its packing: why; for elements that
    claim, the tasks they were made for (as runs) and the job's outcomes then (claiming.py)."""
    if not plan.claims:
        return {"packing": plan.why}
    return {
        "packing": plan.why,
        "tasks": len(tasks),
        "claim": runs(tasks),
        "outcomes_before": len(job.outcomes),
    }


def measured(job: JobHandle, subs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(mean seconds per task, seconds an element took to start) that the job measured so
    far, each None while unknown: the mean over the outcomes of tasks that ran (at most
    10 000 runs of records read), the start from the job's latest submission (the earliest
    of its workers to join, after it was submitted)."""
    final = job.outcomes
    busy, count, seen = 0.0, 0, 0
    for first, end, (_, rec) in final.spans():
        if rec.kind not in (Kind.OK, Kind.ERROR) or rec.t_end <= 0 or rec.t_start <= 0:
            continue
        busy += max(0.0, rec.t_end - rec.t_start) / max(1, rec.count) * (end - first)
        count += end - first
        seen += 1
        if seen >= 10_000:
            break
    mean = busy / count if count else None
    start = None
    if subs:
        since = float(subs[-1].get("submitted", 0.0))
        joined = [float(m.get("joined", 0.0)) for m in job.store.queue().members.values()]
        try:
            names = [f for f in os.listdir(job.path / "workers") if f.endswith(".json")]
        except FileNotFoundError:
            names = []
        for name in names:
            joined.append(float(job.store.worker_info(name[:-5]).get("started", 0.0)))
        after = [t - since for t in joined if t >= since]
        start = min(after) if after else None
    return mean, start
