"""An idle worker of the local pool waits on a core of its own, under SCHED_BATCH
(run/idlecore.py), and takes back its cores and policy before anything of its next job runs."""

from __future__ import annotations

import os
import time

import pytest

import elsewhere as ew
from elsewhere.folder.store import JobStore

_CAN = hasattr(os, "sched_setaffinity") and hasattr(os, "SCHED_BATCH")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not _CAN, reason="this OS binds no process to cores (no sched_setaffinity)"),
]

_PROBE = """
import os
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
"""


def _may_change_scheduling() -> str:
    """Why a process here may not bind itself to a core or switch its policy ("" if it may):
    some containers forbid it, and the workers then wait as they are."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=30)
    return "" if out.returncode == 0 else out.stderr.strip().splitlines()[-1]


def _seen(_):
    """What a task sees of its worker's scheduling: (pid, cores, policy)."""
    return os.getpid(), tuple(sorted(os.sched_getaffinity(0))), os.sched_getscheduler(0)


def _until(what, check, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.01)


def test_idle_workers_wait_on_cores_of_their_own_and_their_tasks_see_none_of_it(ew_home):
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if len(cores) < 2:
        pytest.skip("a single core: nothing to spread the workers over")
    why = _may_change_scheduling()
    if why:
        pytest.skip(f"processes here may not change their cores or scheduling policy: {why}")
    mine = (cores, os.sched_getscheduler(0))
    cl = ew.local(cores=2)
    job = ew.submit(_seen, range(50), on=cl)
    job.wait(timeout=60, progress=False)
    assert {v[1:] for v in job.results()} == {mine}
    pids = sorted(m["pid"] for m in JobStore(job.path).queue().members.values())
    assert len(pids) == 2, pids
    idle = cl.pool_dir() / "idle"
    _until("both workers idle", lambda: len(os.listdir(idle)) == 2)

    def bound():
        seen = [(os.sched_getaffinity(p), os.sched_getscheduler(p)) for p in pids]
        return seen if all(len(a) == 1 and s == os.SCHED_BATCH for a, s in seen) else None

    (a, _), (b, _) = _until("each idle worker bound to one core, under SCHED_BATCH", bound)
    assert a != b  # a core each: woken together, they run side by side
    assert sorted(os.listdir(cl.pool_dir() / "cores")) == sorted(str(c) for c in (*a, *b))
    # the next job's tasks run with the cores and the policy the workers had
    again = ew.map(_seen, range(50), on=cl, progress=False)
    assert {v[1:] for v in again} == {mine}
    job.purge()
