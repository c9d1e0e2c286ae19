"""The joblib backend "elsewhere" on the real SLURM of ci/services (single node): joblib's
batches go as array jobs of ew.submit (SLURM has no capability "stream"), with real
scikit-learn. Skipped, with the reason, where SLURM is not up."""

from __future__ import annotations

import os

import pytest

joblib = pytest.importorskip("joblib")
pytest.importorskip("sklearn")

import numpy as np
from joblib import Parallel, delayed
from sklearn.datasets import load_iris
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import elsewhere as ew
import elsewhere.joblib  # registers the backend "elsewhere"
from elsewhere.util.errors import RemoteTraceback

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def cluster(**kw):
    kw.setdefault("partition", "debug")
    kw.setdefault("status_interval_s", 0.5)
    return ew.slurm(**kw)


def array_job(x: int) -> tuple[int, str | None]:
    return x, os.environ.get("SLURM_ARRAY_JOB_ID")


def fails(x: int) -> int:
    if x == 3:
        raise ArithmeticError(f"bad {x}")
    return x


def test_n_jobs_minus_one_is_the_partitions_cpus(ew_home, slurm_info) -> None:
    with joblib.parallel_config(backend="elsewhere", on=cluster()):
        assert joblib.effective_n_jobs(-1) == slurm_info.cpus
    with joblib.parallel_config(backend="elsewhere", on=cluster(max_running=3)):
        assert joblib.effective_n_jobs(-1) == 3
    with joblib.parallel_config(backend="elsewhere", on=cluster(cores_per_task=2)):
        assert joblib.effective_n_jobs(-1) == slurm_info.cpus // 2


def test_calls_run_in_array_jobs(ew_home, slurm_info) -> None:
    cl = cluster()
    with joblib.parallel_config(backend="elsewhere", on=cl, n_jobs=4):
        out = Parallel(pre_dispatch="all")(delayed(array_job)(i) for i in range(20))
        gen = Parallel(return_as="generator")(delayed(array_job)(i) for i in range(6))
        assert [x for x, _ in gen] == list(range(6))
    assert [x for x, _ in out] == list(range(20))
    assert all(native for _, native in out)  # every call ran in a SLURM array job
    sbatch = [c for c in cl.commands_run if c[0] == "sbatch"]
    assert len(sbatch) < 20 + 6  # batches went together, not one job each
    assert len({native for _, native in out}) < 20
    assert ew.jobs() == []  # each job purged once its results were in


def total(a: np.ndarray, i: int) -> float:
    return float(a.sum()) + i


def test_a_large_argument_goes_once_per_job(ew_home, slurm_info) -> None:
    a = np.random.default_rng(2).random(1 << 18)  # 2 MiB: the job's data, not each batch's
    with joblib.parallel_config(backend="elsewhere", on=cluster(), n_jobs=3):
        out = Parallel(batch_size=1, pre_dispatch="all")(delayed(total)(a, i) for i in range(9))
    np.testing.assert_allclose(out, [float(a.sum()) + i for i in range(9)])  # sums may differ in the last bit


def test_a_call_that_raises(ew_home, slurm_info) -> None:
    on = cluster()
    with joblib.parallel_config(backend="elsewhere", on=on, n_jobs=4), pytest.raises(ArithmeticError) as info:
        Parallel()(delayed(fails)(i) for i in range(8))
    assert str(info.value) == "bad 3"
    assert isinstance(info.value.__cause__, RemoteTraceback)


def test_grid_search_on_slurm(ew_home, slurm_info) -> None:
    X, y = load_iris(return_X_y=True)
    grid = {"C": [0.1, 1.0, 10.0], "gamma": [0.01, 0.1, 1.0]}
    expected = GridSearchCV(SVC(), grid, cv=3, n_jobs=1).fit(X, y)
    cl = cluster()
    with joblib.parallel_config(backend="elsewhere", on=cl):
        # pre_dispatch="all": the 27 fits go at once, as one array job of at most n_jobs elements
        got = GridSearchCV(SVC(), grid, cv=3, pre_dispatch="all").fit(X, y)
    assert got.best_params_ == expected.best_params_
    np.testing.assert_allclose(got.cv_results_["mean_test_score"], expected.cv_results_["mean_test_score"])
    assert len([c for c in cl.commands_run if c[0] == "sbatch"]) < 27
