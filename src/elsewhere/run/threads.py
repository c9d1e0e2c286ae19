"""Threads of numerical libraries in a task process: as many as the task has cores.

OpenBLAS, MKL, BLIS, Accelerate, OpenMP and numexpr start a thread per core of
the machine unless told otherwise. A worker that runs one task per core would
then run as many threads per task as the machine has cores: on N cores, N
tasks of N threads each, and OpenBLAS's threads spin while they wait for work,
so that ``ew.map(np.linalg.pinv, ...)`` on two workers of one slot took twice as
long as a loop in the caller on this project's 2-core test machine (and, now
and then, twenty times). So, before a task process enters a job, the
variables these libraries read when they load are set to the job's
``cores_per_task``, and libraries that were loaded already (a process reused
from a job with other cores) are told at run time, through ``threadpoolctl``.

The user's own settings win: if the environment the process started with, or
the job's ``env=``, sets any of these variables, none of them is touched.
Values that elsewhere set itself (inherited by a process a task process
started) are recognised by ``ELSEWHERE_THREADS`` and are not taken for the
user's.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["THREAD_VARS", "ThreadLimits"]

THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
_OURS = "ELSEWHERE_THREADS"  # the value elsewhere set them to, when it did
# modules that load a library with a thread pool (BLAS, OpenMP) when imported
_POOL_MODULES = ("numpy", "scipy", "torch", "numexpr", "sklearn")


class ThreadLimits:
    """The thread limits of one task process, set as it enters each job."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        ours = env.get(_OURS)
        self.users = frozenset(k for k in THREAD_VARS if env.get(k) and env.get(k) != ours)
        self.limit: int | None = None  # what the loaded libraries run with, when elsewhere set it

    def enter(self, cores: Any, job_env: Mapping[str, Any] | None = None) -> int | None:
        """Set the limits for a job whose tasks have ``cores`` cores; the number of
        threads set, or None where the user set them (or ``cores`` is not a count)."""
        if self.users:
            return None
        if job_env and any(k in job_env for k in THREAD_VARS):
            self._hand_over(job_env)
            return None
        try:
            n = max(1, int(cores))
        except (TypeError, ValueError):
            return None
        if n == self.limit:
            return n
        value = str(n)
        for k in THREAD_VARS:
            os.environ[k] = value  # for libraries loaded from now on, and subprocesses
        os.environ[_OURS] = value
        if any(m in sys.modules for m in _POOL_MODULES):
            _limit_loaded(n)
        self.limit = n
        return n

    def _hand_over(self, job_env: Mapping[str, Any]) -> None:
        """The job sets these variables itself: take back what an earlier job of this
        process was given (``OPENBLAS_NUM_THREADS`` left from it would outrank the job's
        own ``OMP_NUM_THREADS``), and tell loaded libraries the job's number."""
        if self.limit is None:
            return
        for k in (*THREAD_VARS, _OURS):
            os.environ.pop(k, None)  # the job's env= is applied after this
        self.limit = None
        counts = [int(v) for v in map(str, (job_env.get(k, "") for k in THREAD_VARS)) if v.isdigit()]
        if counts and counts[0] > 0 and any(m in sys.modules for m in _POOL_MODULES):
            _limit_loaded(counts[0])  # OMP_NUM_THREADS first


def _limit_loaded(n: int) -> None:
    """Tell the thread pools of the libraries loaded in this process to use ``n`` threads."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency; the variables still hold for new loads
        return
    try:
        threadpool_limits(limits=n)
    except Exception:  # pragma: no cover - a library that cannot be told keeps its threads
        pass
