"""BLAS and OpenMP threads in local task processes: the job's cores per task."""

from __future__ import annotations

import os

import pytest

import elsewhere as ew
from blas_probe import blas_threads
from blas_probe import no_thread_vars as clear_thread_vars

pytestmark = pytest.mark.timeout(120)


def threads_seen(_: int) -> tuple[str | None, list[int], int]:
    """What a task sees: OMP_NUM_THREADS, the threads of NumPy's BLAS, its cores."""
    return os.environ.get("OMP_NUM_THREADS"), blas_threads(), ew.task().cores


@pytest.fixture
def no_thread_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_thread_vars(monkeypatch)


def test_a_task_of_one_core_runs_blas_on_one_thread(ew_home, no_thread_vars) -> None:
    for omp, blas, cores in ew.map(threads_seen, range(2), on=ew.local(cores=2)):
        assert (omp, cores) == ("1", 1)
        assert blas in ([], [1])  # [] where NumPy's BLAS is not one threadpoolctl knows


def test_a_task_of_two_cores_gets_two_threads_after_a_job_of_one(ew_home, no_thread_vars) -> None:
    first = ew.map(threads_seen, range(1), on=ew.local(cores=2))
    again = ew.map(threads_seen, range(1), on=ew.local(cores=2, cores_per_task=2))
    assert first[0][0] == "1" and again[0][0] == "2"
    assert again[0][1] in ([], [2]) and again[0][2] == 2


def test_the_users_setting_is_left_alone(ew_home, no_thread_vars) -> None:
    out = ew.map(threads_seen, range(2), on=ew.local(cores=2), env={"OMP_NUM_THREADS": "3"})
    assert [o[0] for o in out] == ["3", "3"]

    def openblas_var(_: int) -> str | None:
        return os.environ.get("OPENBLAS_NUM_THREADS")

    assert ew.map(openblas_var, range(2), on=ew.local(cores=2), env={"OMP_NUM_THREADS": "3"}) == [None, None]


def blas_and_vars(_: int) -> tuple[int, list[int], str | None, str | None]:
    return os.getpid(), blas_threads(), os.environ.get("OMP_NUM_THREADS"), os.environ.get("OPENBLAS_NUM_THREADS")


def test_a_job_with_its_own_setting_after_one_without_gets_its_own(ew_home, no_thread_vars) -> None:
    first = ew.map(blas_and_vars, range(1), on=ew.local(cores=1))
    own = ew.map(blas_and_vars, range(1), on=ew.local(cores=1), env={"OMP_NUM_THREADS": "2"})
    assert first[0][2:] == ("1", "1")
    assert own[0][2:] == ("2", None)  # no OPENBLAS_NUM_THREADS=1 left to outrank it
    if own[0][0] == first[0][0]:  # the same process: BLAS loaded with 1 thread is told 2
        assert own[0][1] in ([], [2])
