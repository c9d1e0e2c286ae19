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

import importlib.util
import os
import shutil
from collections.abc import Callable
from typing import Any

from .errors import ConfigError

INSTALL_MPI = (
    "install an MPI and mpi4py: on Debian/Ubuntu `apt-get install openmpi-bin libopenmpi-dev`, "
    "then `pip install mpi4py` (or `conda install -c conda-forge mpi4py openmpi`)"
)


def find_launcher(launcher: str | None = None) -> list[str]:
    """The launcher command as words; ConfigError saying what to install when missing."""
    words = (launcher or "mpiexec").split()
    if shutil.which(words[0]) is None:
        raise ConfigError(f"no MPI launcher {words[0]!r} on PATH: {INSTALL_MPI}")
    return words


def check_mpi4py() -> None:
    """ConfigError when mpi4py is not importable by this interpreter."""
    if importlib.util.find_spec("mpi4py") is None:
        raise ConfigError(f"mpi4py is not installed for this Python: {INSTALL_MPI}")


def launcher_argv(launcher: list[str], ranks: int, extra: list[str], *, oversubscribe: bool) -> list[str]:
    """mpiexec's words for ``ranks`` ranks (Open MPI's flags for root and oversubscription)."""
    argv = [*launcher, "-n", str(ranks)]
    name = os.path.basename(launcher[0])
    if name in ("mpiexec", "mpirun", "orterun") and _is_open_mpi(launcher[0]):
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        if oversubscribe:
            argv.append("--oversubscribe")
    return [*argv, *extra]


def _is_open_mpi(path: str) -> bool:
    real = os.path.realpath(shutil.which(path) or path)
    return "openmpi" in real or os.path.basename(real) in ("orterun", "prterun")


def submit_communicating(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    ranks: int,
    on: Any = None,
    name: str | None = None,
    **options: Any,
) -> Any:
    """Start ``fn(*args, **kwargs)`` on ``ranks`` ranks that talk over MPI; returns the Job.

    ``job.results()`` has one entry per rank, in rank order. Options are
    those of :func:`elsewhere.create_job` (seed, tag, env, files, job_data).
    """
    from . import api

    if not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be a positive integer, not {ranks!r}")
    if not callable(fn):
        raise ConfigError(f"submit_communicating needs a callable, not {fn!r}")
    job = api.create_job(on, name=name, _fn=fn, **options)
    job._meta["communicating"] = True
    job.store.update_meta(communicating=True, ranks=ranks)
    job._meta["ranks"] = ranks
    tasks = [(None, tuple(args), dict(kwargs or {})) for _ in range(ranks)]
    api._write_and_submit(job, fn, tasks, "entries", communicating=True)
    return job
