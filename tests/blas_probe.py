"""What a task process runs NumPy's BLAS with: shared by the thread tests of every backend
(task functions import it where they run; the tests folder is on their ``sys.path``)."""

from __future__ import annotations

import os

import pytest

from elsewhere.run.threads import THREAD_VARS


def blas_threads() -> list[int]:
    """The thread counts of the BLAS pools NumPy loaded here ([] if threadpoolctl knows none)."""
    import numpy  # noqa: F401  (loads BLAS)
    import threadpoolctl

    return sorted({p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"})


def no_thread_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip where threads cannot tell cores apart; else clear the variables a user would set,
    so that the workers started from here see none."""
    pytest.importorskip("numpy")
    pytest.importorskip("threadpoolctl")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores: with one, BLAS has one thread whatever is asked")
    for k in (*THREAD_VARS, "ELSEWHERE_THREADS"):
        monkeypatch.delenv(k, raising=False)
