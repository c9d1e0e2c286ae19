"""Communicating jobs: N ranks started together by an MPI launcher.

``ew.submit_communicating(fn, args=..., ranks=N, on=cluster)`` makes a job
of N tasks, one per rank, started at once by the launcher that fits the
cluster (``mpiexec`` here, ``srun --mpi=pmix`` inside a SLURM allocation).
Each rank runs ``python -m elsewhere.worker --mpi``, which reads its rank
from the launcher's environment; ``ew.task().rank``, ``.size`` and ``.comm``
(an mpi4py communicator) tell the function who it is. A rank that raises
writes its error, then aborts every rank (``MPI_Abort``), so no rank is left
waiting in a collective until the walltime.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..util.errors import ConfigError

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

    from ..backends.base import Cluster
    from .job import Job
    from .options import JobOptions

T = TypeVar("T")


def submit_communicating(
    fn: Callable[..., T],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    ranks: int,
    on: Cluster | str | None = None,
    name: str | None = None,
    **options: Unpack[JobOptions],
) -> Job[T]:
    """Start ``fn(*args, **kwargs)`` on ``ranks`` ranks that talk over MPI; returns the Job.

    ``job.results()`` has one entry per rank, in rank order. Options are
    those of :func:`elsewhere.create_job` (seed, tag, env, files, job_data).
    """
    from . import functions as api
    from .job import make_communicating, write_and_submit

    if not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be a positive integer, not {ranks!r}")
    if not callable(fn):
        raise ConfigError(f"submit_communicating needs a callable, not {fn!r}")
    job = api.create_job(on, name=name, _fn=fn, **options)
    make_communicating(job, ranks)
    tasks = [(None, tuple(args), dict(kwargs or {})) for _ in range(ranks)]
    write_and_submit(job, fn, tasks, "entries", communicating=True)
    return job
