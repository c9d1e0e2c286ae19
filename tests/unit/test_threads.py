"""Threads of numerical libraries in a task process: the job's cores per task, unless the user
set them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elsewhere.run.threads import THREAD_VARS, ThreadLimits

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in (*THREAD_VARS, "ELSEWHERE_THREADS"):
        monkeypatch.delenv(k, raising=False)


def test_every_variable_is_set_to_the_cores_of_the_job(clean_env: None) -> None:
    limits = ThreadLimits()
    assert limits.enter(3) == 3
    assert {k: os.environ[k] for k in THREAD_VARS} == dict.fromkeys(THREAD_VARS, "3")
    assert limits.enter(1, {"OTHER": "x"}) == 1
    assert {os.environ[k] for k in THREAD_VARS} == {"1"}


def test_the_users_own_setting_wins(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MKL_NUM_THREADS", "4")
    assert ThreadLimits().enter(2) is None
    assert os.environ["MKL_NUM_THREADS"] == "4"
    assert all(k not in os.environ for k in THREAD_VARS if k != "MKL_NUM_THREADS")


def test_a_jobs_env_wins(clean_env: None) -> None:
    assert ThreadLimits().enter(2, {"OMP_NUM_THREADS": "8"}) is None
    assert all(k not in os.environ for k in THREAD_VARS)


def test_values_elsewhere_set_are_not_taken_for_the_users(clean_env: None) -> None:
    inherited = {**dict.fromkeys(THREAD_VARS, "1"), "ELSEWHERE_THREADS": "1"}
    limits = ThreadLimits(inherited)  # a process started by a task process
    assert limits.users == frozenset()
    assert ThreadLimits({**inherited, "OMP_NUM_THREADS": "6"}).users == {"OMP_NUM_THREADS"}


def test_cores_that_are_not_a_count_change_nothing(clean_env: None) -> None:
    assert ThreadLimits().enter("many") is None
    assert all(k not in os.environ for k in THREAD_VARS)


_LOADED = """
import json, os, sys
import numpy, threadpoolctl
from elsewhere.run.threads import ThreadLimits

def blas():
    return sorted({p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"})

out = {"before": blas()}
limits = ThreadLimits()
for n in (1, 2, 1):
    limits.enter(n)
    out[str(n) + "-" + str(len(out))] = blas()
limits.enter(1, {"OMP_NUM_THREADS": "2"})  # a job that sets its own
out["own"] = blas()
print(json.dumps(out))
"""


def test_libraries_loaded_before_a_job_are_told_its_cores() -> None:
    """A task process reused from a job with other cores has NumPy's BLAS loaded already:
    the variables alone would not reach it."""
    pytest.importorskip("numpy")
    pytest.importorskip("threadpoolctl")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores: BLAS starts with one thread on one core")
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARS, "ELSEWHERE_THREADS")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _LOADED], env=env, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    out = json.loads(done.stdout)
    if not out["before"]:
        pytest.skip("NumPy's BLAS is not one threadpoolctl knows")
    assert out["before"][0] > 1
    assert (out["1-1"], out["2-2"], out["1-3"], out["own"]) == ([1], [2], [1], [2])


def test_a_job_that_sets_them_itself_after_one_that_did_not_gets_none_of_ours(clean_env: None) -> None:
    """Else OPENBLAS_NUM_THREADS=1 left from the earlier job would outrank the job's own
    OMP_NUM_THREADS for OpenBLAS loaded from then on."""
    limits = ThreadLimits()
    assert limits.enter(1) == 1
    assert limits.enter(1, {"OMP_NUM_THREADS": "4"}) is None
    assert all(k not in os.environ for k in (*THREAD_VARS, "ELSEWHERE_THREADS"))
    assert limits.enter(2) == 2  # and the next job of ours is set again
    assert {os.environ[k] for k in THREAD_VARS} == {"2"}
