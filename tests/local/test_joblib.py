"""The joblib backend "elsewhere" (``import elsewhere.joblib``) on real local workers, with
joblib's own Parallel and real scikit-learn; and its batch-scheduler path on a local cluster
that lacks the capability "stream" (as a batch scheduler does), so that it runs here too."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import threading
import time

import pytest

joblib = pytest.importorskip("joblib")
pytest.importorskip("sklearn")

import numpy as np
from joblib import Parallel, delayed
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.svm import SVC

import elsewhere as ew
import elsewhere.joblib  # registers the backend "elsewhere"
from elsewhere.api.joblib_backend import ElsewhereBackend
from elsewhere.api.joblib_batch import Sizing, deal, packed
from elsewhere.api.joblib_slots import parse_sinfo_cpus
from elsewhere.backends.local import LocalCluster
from elsewhere.util.errors import RemoteTraceback

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Parallel(backend=..., **options) passes the options to the backend since joblib 1.5
PARALLEL_TAKES_OPTIONS = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(Parallel).parameters.values())


class NoStreamLocal(LocalCluster):
    """Local workers without the capability "stream": the backend takes its batch-scheduler
    path (jobs of ew.submit), as on SLURM."""

    capabilities = frozenset({"communicating"})


@pytest.fixture(params=["stream", "batch"])
def on(request: pytest.FixtureRequest, ew_home) -> LocalCluster:
    return LocalCluster(2) if request.param == "stream" else NoStreamLocal(2)


def pid(_x: int) -> int:
    return os.getpid()


def square(x: int) -> int:
    return x * x


class Refused(Exception):
    """A caller's own exception type, with an __init__ of its own and an attribute."""

    def __init__(self, code: int) -> None:
        super().__init__(f"refused with code {code}")
        self.code = code


def refuse(x: int) -> int:
    if x == 13:
        raise Refused(x)
    return x


def nested_n_jobs(_x: int) -> tuple[int, list[int]]:
    # a Parallel call inside a task: threads, n_jobs=-1 being the task's cores
    inner = Parallel(n_jobs=-1)(delayed(square)(i) for i in range(4))
    return joblib.effective_n_jobs(-1), inner


def wait_for(event_path: str) -> int:
    for _ in range(60_000):  # 10 minutes: longer than any test waits
        if os.path.exists(event_path):
            return 1
        time.sleep(0.01)
    return 0


# -- pure parts -------------------------------------------------------------------------------
def test_registered_by_import() -> None:
    assert joblib.parallel.BACKENDS["elsewhere"] is ElsewhereBackend
    elsewhere.joblib.register("ew2")
    assert joblib.parallel.BACKENDS["ew2"] is ElsewhereBackend


def test_batches_are_dealt_in_turn_into_at_most_n_tasks() -> None:
    assert deal(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert deal([1, 2], 8) == [[1], [2]]


def test_batch_sizes_follow_what_the_workers_measured() -> None:
    s = Sizing()
    assert s.batch_size() == 1  # nothing measured: one call a batch
    s.calls_ran(1, 0.01)
    s.started(3.0)  # an element takes 3 s to start its first task: batches of ~3 s
    assert s.batch_size() == 300
    t = Sizing()
    t.calls_ran(1, 5000.0)  # calls longer than MAX_S: one a batch
    assert t.batch_size() == 1


def test_a_batch_scheduler_packs_a_jobs_tasks_into_elements() -> None:
    from elsewhere.backends.schedulers import SlurmCluster

    slurm = SlurmCluster(partition="debug", check=False)
    twin = packed(slurm, 3)
    assert twin.tasks_per_element == 3 and twin.queue == "debug"
    assert slurm.tasks_per_element is None  # the user's cluster is left as it was
    local = LocalCluster(2)
    assert packed(local, 3) is local  # the others run a job's tasks as they do


def test_sinfo_cpus_of_a_partition() -> None:
    text = "debug* 2/6/0/8\nother 0/4/4/8\n"
    assert parse_sinfo_cpus(text, None) == 8  # the default partition: allocated + idle
    assert parse_sinfo_cpus(text, "other") == 4  # CPUs down or drained do not count
    assert parse_sinfo_cpus(text, "gpu") is None


def test_unknown_options_are_refused(ew_home) -> None:
    with pytest.raises(ew.ConfigError, match=r"unknown option.*cores"):
        joblib.parallel_config(backend="elsewhere", cores=4)
    if not PARALLEL_TAKES_OPTIONS:
        return
    with pytest.raises(ew.ConfigError, match=r"unknown keyword.*colour"):
        Parallel(n_jobs=2, backend="elsewhere", colour="red")(delayed(square)(i) for i in range(3))


# -- joblib.Parallel ----------------------------------------------------------------------------
def test_results_in_order_from_the_workers(on) -> None:
    with joblib.parallel_config(backend="elsewhere", on=on):
        assert Parallel()(delayed(square)(i) for i in range(50)) == [i * i for i in range(50)]
        pids = Parallel(n_jobs=2)(delayed(pid)(i) for i in range(8))
    assert os.getpid() not in pids
    assert ew.jobs() == []  # each call's job is purged when it returns


def test_n_jobs_minus_one_is_the_clusters_slots(ew_home) -> None:
    with joblib.parallel_config(backend="elsewhere", on=ew.local(cores=2)):
        assert joblib.effective_n_jobs(-1) == 2
        assert joblib.effective_n_jobs(None) == 2  # the default, as with dask's backend
        assert joblib.effective_n_jobs(3) == 3
        # n_jobs=1 asked for: in the caller, as joblib always does
        assert Parallel(n_jobs=1)(delayed(pid)(i) for i in range(3)) == [os.getpid()] * 3
    with joblib.parallel_config(backend="elsewhere", on=ew.local(cores=1)):
        # a cluster of one slot still runs the calls (one at a time), not the caller
        assert joblib.effective_n_jobs(-1) == 2
        assert os.getpid() not in Parallel()(delayed(pid)(i) for i in range(3))


def test_parallel_backend_and_the_backend_named_in_parallel(ew_home) -> None:
    cluster = ew.local(cores=2)
    with joblib.parallel_backend("elsewhere", on=cluster):
        assert Parallel()(delayed(square)(i) for i in range(5)) == [0, 1, 4, 9, 16]
    if not PARALLEL_TAKES_OPTIONS:
        return
    out = Parallel(n_jobs=2, backend="elsewhere", on=cluster)(delayed(pid)(i) for i in range(4))
    assert os.getpid() not in out


def test_auto_batching_groups_many_short_calls(ew_home) -> None:
    with joblib.parallel_config(backend="elsewhere", on=ew.local(cores=2), keep=True, name="many"):
        assert Parallel()(delayed(square)(i) for i in range(3000)) == [i * i for i in range(3000)]
    (row,) = ew.jobs()
    assert row["name"].startswith("many-")
    assert row["n_tasks"] < 3000  # calls travelled in batches: fewer tasks than calls
    ew.recover(row["name"]).purge()


def test_generators_yield_as_results_come(on) -> None:
    with joblib.parallel_config(backend="elsewhere", on=on):
        gen = Parallel(return_as="generator")(delayed(square)(i) for i in range(30))
        assert next(gen) == 0
        assert list(gen) == [i * i for i in range(1, 30)]
        unordered = Parallel(return_as="generator_unordered")(delayed(square)(i) for i in range(30))
        assert sorted(unordered) == [i * i for i in range(30)]


def test_a_call_that_raises_raises_its_own_exception(on) -> None:
    with joblib.parallel_config(backend="elsewhere", on=on):
        with pytest.raises(Refused) as info:
            Parallel()(delayed(refuse)(i) for i in range(40))
        assert info.value.code == 13
        assert isinstance(info.value.__cause__, RemoteTraceback)
        assert "refuse" in str(info.value.__cause__)  # the worker's traceback
        # in a Parallel block the backend is made ready again after an error (joblib itself
        # then sends, in a later call of the same block, batches left over from the failed
        # one, with loky too: a fresh Parallel is the way on)
        with Parallel(n_jobs=2) as parallel:
            assert parallel(delayed(square)(i) for i in range(6)) == [0, 1, 4, 9, 16, 25]
            with pytest.raises(Refused):
                parallel(delayed(refuse)(i) for i in range(20))
        assert Parallel(n_jobs=2)(delayed(square)(i) for i in range(6)) == [0, 1, 4, 9, 16, 25]
    assert ew.jobs() == []


def test_a_call_that_cannot_be_sent_fails_the_parallel_call(on) -> None:
    with joblib.parallel_config(backend="elsewhere", on=on), pytest.raises(Exception, match="lock"):
        Parallel(n_jobs=2)(delayed(square)(threading.Lock()) for _ in range(3))


def test_a_timeout_stops_the_calls(on, tmp_path) -> None:
    never = str(tmp_path / "never")
    with joblib.parallel_config(backend="elsewhere", on=on):
        with pytest.raises(multiprocessing.TimeoutError):  # what joblib raises
            Parallel(n_jobs=2, timeout=1)(delayed(wait_for)(never) for _ in range(2))
        assert Parallel(n_jobs=2)(delayed(square)(i) for i in range(3)) == [0, 1, 4]


def total(a: np.ndarray, i: int) -> float:
    return float(a.sum()) + i


def test_a_large_argument_travels_once(on, tmp_path) -> None:
    # as loky memory-maps it: an array of max_nbytes or more that every call takes is sent
    # once (as the job's data), not once per batch
    a = np.random.default_rng(0).random(1 << 18)  # 2 MiB
    with joblib.parallel_config(backend="elsewhere", on=on, keep=True, storage=tmp_path / "jobs"):
        # 20 batches, all sent at once: one job
        out = Parallel(batch_size=1, pre_dispatch="all")(delayed(total)(a, i) for i in range(20))
    np.testing.assert_allclose(out, [float(a.sum()) + i for i in range(20)])  # sums may differ in the last bit
    (job,) = [p for p in (tmp_path / "jobs").iterdir() if (p / "job.json").exists()]
    written = sum(f.stat().st_size for f in job.rglob("*") if f.is_file())
    assert written < 3 * a.nbytes, written / a.nbytes  # not 20 times
    for row in ew.jobs():
        ew.recover(row["name"]).purge()


def test_a_dropped_generator_stops_its_calls(on, tmp_path) -> None:
    never = str(tmp_path / "never")
    with joblib.parallel_config(backend="elsewhere", on=on, n_jobs=2):
        gen = Parallel(return_as="generator", batch_size=1)(
            delayed(wait_for)(never) if i else delayed(square)(3) for i in range(6))
        assert next(gen) == 9
        with pytest.warns(UserWarning, match="cancelled"):  # joblib's word on it
            del gen  # its calls are stopped, their job cancelled and purged
    deadline = time.monotonic() + 60
    while ew.jobs():
        assert time.monotonic() < deadline, ew.jobs()
        time.sleep(0.1)


def test_nested_parallel_uses_the_tasks_cores(ew_home) -> None:
    on = ew.local(cores=2, cores_per_task=2)
    with joblib.parallel_config(backend="elsewhere", on=on):
        out = Parallel()(delayed(nested_n_jobs)(i) for i in range(2))
    assert out == [(2, [0, 1, 4, 9])] * 2


# -- scikit-learn ---------------------------------------------------------------------------------
def test_grid_search_matches_a_sequential_one(on) -> None:
    X, y = load_iris(return_X_y=True)
    grid = {"C": [0.1, 1.0, 10.0], "gamma": [0.01, 0.1, 1.0]}
    expected = GridSearchCV(SVC(), grid, cv=3, n_jobs=1).fit(X, y)
    with joblib.parallel_config(backend="elsewhere", on=on):
        got = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1).fit(X, y)  # 27 fits
    assert got.best_params_ == expected.best_params_
    np.testing.assert_allclose(got.cv_results_["mean_test_score"], expected.cv_results_["mean_test_score"])


def test_grid_search_error_score_raise(on) -> None:
    X, y = load_iris(return_X_y=True)
    with joblib.parallel_config(backend="elsewhere", on=on), pytest.raises(ValueError, match="gamma"):
        GridSearchCV(SVC(), {"gamma": [0.1, -1.0]}, cv=2, error_score="raise").fit(X, y)


def test_cross_val_score_and_random_forest(ew_home) -> None:
    X, y = load_iris(return_X_y=True)
    expected = cross_val_score(SVC(), X, y, cv=5)
    forest = RandomForestClassifier(n_estimators=20, random_state=0).fit(X, y)
    with joblib.parallel_config(backend="elsewhere", on=ew.local(cores=2)):
        np.testing.assert_allclose(cross_val_score(SVC(), X, y, cv=5, n_jobs=-1), expected)
        remote = RandomForestClassifier(n_estimators=20, random_state=0, n_jobs=-1).fit(X, y)
    np.testing.assert_array_equal(remote.predict_proba(X), forest.predict_proba(X))
