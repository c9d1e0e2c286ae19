"""The joblib backend "elsewhere" on the peer network: real worker daemons on loopback (one
of one slot, one of two) in a keyed group, the controller in this process, real scikit-learn.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

joblib = pytest.importorskip("joblib")
pytest.importorskip("sklearn")

import numpy as np
from joblib import Parallel, delayed
from peer_procs import Workers, free_port
from sklearn.datasets import load_iris
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.svm import SVC

import elsewhere as ew
import elsewhere.joblib  # registers the backend "elsewhere"
from elsewhere.backends.peer import PeerCluster
from elsewhere.peer.keys import write_key
from elsewhere.util.errors import RemoteTraceback

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    tmp = tmp_path_factory.mktemp("joblib-lab")
    key = write_key("jlab", tmp / "jlab.key")
    port = free_port()
    with Workers(tmp, 2, port=port, key=key, per_worker=[[], ["--slots", "2"]]):
        yield key, port


@pytest.fixture
def on(lab: tuple[Path, int], ew_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PeerCluster:
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "config"))
    key, port = lab
    cluster = ew.peers("jlab", key=key, port=port, interface="127.0.0.1")
    assert isinstance(cluster, PeerCluster)
    return cluster


def where(x: int) -> tuple[int, int]:
    return x, os.getpid()


def fails(x: int) -> int:
    if x == 5:
        raise FileNotFoundError(2, "no such input", f"input-{x}.csv")
    return x


def test_n_jobs_minus_one_is_the_slots_of_the_workers_heard(on: PeerCluster) -> None:
    with joblib.parallel_config(backend="elsewhere", on=on):
        assert joblib.effective_n_jobs(-1) == 3  # 1 + 2 slots
        assert joblib.effective_n_jobs(-2) == 2


def test_calls_run_on_the_workers(on: PeerCluster) -> None:
    with joblib.parallel_config(backend="elsewhere", on=on):
        out = Parallel()(delayed(where)(i) for i in range(30))
    assert [x for x, _ in out] == list(range(30))
    assert os.getpid() not in {p for _, p in out}


def test_generator_and_errors(on: PeerCluster) -> None:
    with joblib.parallel_config(backend="elsewhere", on=on, n_jobs=3):
        gen = Parallel(return_as="generator")(delayed(where)(i) for i in range(12))
        assert [x for x, _ in gen] == list(range(12))
        with pytest.raises(FileNotFoundError) as info:
            Parallel()(delayed(fails)(i) for i in range(12))
    assert info.value.filename == "input-5.csv"  # the exception itself, attributes and all
    assert isinstance(info.value.__cause__, RemoteTraceback)


def total(a: np.ndarray, i: int) -> float:
    return float(a.sum()) + i


def test_a_large_argument_reaches_every_worker(on: PeerCluster) -> None:
    a = np.random.default_rng(1).random(1 << 18)  # 2 MiB: sent once per worker, as job data
    with joblib.parallel_config(backend="elsewhere", on=on):
        out = Parallel(batch_size=1)(delayed(total)(a, i) for i in range(12))
    np.testing.assert_allclose(out, [float(a.sum()) + i for i in range(12)])  # sums may differ in the last bit


def test_grid_search_and_cross_val_score(on: PeerCluster) -> None:
    X, y = load_iris(return_X_y=True)
    grid = {"C": [0.1, 1.0, 10.0], "gamma": [0.01, 0.1, 1.0]}
    expected = GridSearchCV(SVC(), grid, cv=3, n_jobs=1).fit(X, y)
    expected_cv = cross_val_score(SVC(), X, y, cv=4)
    with joblib.parallel_config(backend="elsewhere", on=on):
        got = GridSearchCV(SVC(), grid, cv=3).fit(X, y)  # n_jobs=None: the cluster, as with dask
        got_cv = cross_val_score(SVC(), X, y, cv=4, n_jobs=-1)
    assert got.best_params_ == expected.best_params_
    np.testing.assert_allclose(got.cv_results_["mean_test_score"], expected.cv_results_["mean_test_score"])
    np.testing.assert_allclose(got_cv, expected_cv)


def test_no_worker_heard_says_so(lab: tuple[Path, int], ew_home: Path) -> None:
    key, _ = lab
    lonely = ew.peers("jlab", key=key, port=free_port(), interface="127.0.0.1")
    with (joblib.parallel_config(backend="elsewhere", on=lonely, wait_for_workers_s=0.5),
          pytest.raises(ew.PeerError, match=r"no peer worker of group 'jlab'.*elsewhere peer worker")):
        joblib.effective_n_jobs(-1)
