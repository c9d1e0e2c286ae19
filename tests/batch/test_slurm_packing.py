"""Packing short tasks into fewer array elements, on the real SLURM (ci/services/slurm.sh).

With no option set, a job of more tasks than the partition has usable CPUs is one sbatch of
that many elements, which claim the tasks from the job's queue; a job of fewer tasks, or with
``tasks_per_element=``, gets its elements as before (backends/packing.py, claiming.py).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import elsewhere as ew

pytestmark = pytest.mark.timeout(120)


def double(x):
    return 2 * x


def double_slowly(x):
    time.sleep(0.05)  # 200 of them: 10 s for one element alone, the others join well before
    return 2 * x


def nap(seconds, x):
    time.sleep(seconds)
    return x


def double_or_die(x, killer):
    if x == killer:  # the others end meanwhile: its element dies alone, its claim not all run
        time.sleep(3)
        os.kill(os.getpid(), signal.SIGKILL)
    return 2 * x


def _sbatch(cl):
    return [c for c in cl.commands_run if c[0] == "sbatch"]


def _subs(cl, job):
    return cl.get_job_cluster_data(job)["submissions"]


def test_many_tiny_tasks_are_one_sbatch_of_fewer_elements_that_claim_them(ew_home, slurm_info):
    cl = ew.slurm()  # no option
    usable = cl.free_cpus().usable
    # (tasks of 50 ms: with no-ops the first element to start could claim all 200 before
    # another started, on a loaded machine; the element count is decided before any ran)
    job = ew.submit(double_slowly, range(200), on=cl)
    job.wait(timeout=90, progress=False)
    assert job.results() == [2 * x for x in range(200)]
    assert len(_sbatch(cl)) == 1
    (sub,) = _subs(cl, job)
    assert sub["elements"] == min(200, usable) < 200
    assert sub["claim"] == [[0, 200]] and sub["tasks"] == 200
    chunks = json.loads((job.path / "submissions" / "0.json").read_text())
    assert chunks == [[]] * sub["elements"]  # each element claims its tasks
    # the tasks were spread over the elements' workers, each named after its element
    workers = {job.handle.outcomes[t][0] for t in range(200)}
    assert all(w.startswith("c0.") for w in workers), workers
    assert len(workers) > 1
    status = [c for c in cl.commands_run if c[0] == "squeue"]
    assert all(",".join(c).count("squeue") == 1 for c in status)  # one call for the whole job


def test_tasks_per_element_one_still_gives_one_element_per_task(ew_home, slurm_info):
    cl = ew.slurm(tasks_per_element=1)
    n = 10
    job = ew.submit(double, range(n), on=cl)
    job.wait(timeout=90, progress=False)
    assert job.results() == [2 * x for x in range(n)]
    (sub,) = _subs(cl, job)
    assert sub["elements"] == n and "claim" not in sub
    chunks = json.loads((job.path / "submissions" / "0.json").read_text())
    assert chunks == [[i, i + 1] for i in range(n)]
    assert len(_sbatch(cl)) == 1


def test_a_few_long_tasks_get_one_element_each(ew_home, slurm_info):
    cl = ew.slurm()
    assert cl.free_cpus().usable >= 4
    job = ew.submit(nap, [2] * 4, range(4), on=cl)
    job.wait(timeout=90, progress=False)
    assert job.results() == [0, 1, 2, 3]
    (sub,) = _subs(cl, job)
    assert sub["elements"] == 4 and "claim" not in sub
    assert len(_sbatch(cl)) == 1


def test_a_killed_packed_element_loses_its_task_and_the_others_finish_the_rest(ew_home, slurm_info):
    cl = ew.slurm(status_interval_s=0.5)
    n = 2 * cl.free_cpus().usable
    job = ew.submit(nap, [1.5] * n, range(n), on=cl, retries=0)
    deadline = time.monotonic() + 60
    while not job.handle.snapshot().running:
        assert time.monotonic() < deadline, job.check()
        time.sleep(0.1)
    task, (wid, _) = next(iter(job.handle.snapshot().running.items()))
    native = _subs(cl, job)[0]["native_id"]
    index = int(wid.split("-", 1)[0].split(".")[1])  # c<submission>.<index>-...
    elem = cl.syntax.element_id(native, index)
    cl._cancel([elem])
    job.wait(timeout=90, progress=False)
    res = job.results()
    err = res[task]
    assert isinstance(err, ew.TaskError) and err.reason == "lost", repr(err)
    assert elem in err.message or "vanished" in err.message, err.message
    assert [r for i, r in enumerate(res) if i != task] == [i for i in range(n) if i != task]
    assert job.check().state is ew.JobState.FAILED


def test_elements_stop_claiming_before_their_walltime_and_what_is_left_is_submitted_again(
    ew_home, slurm_info
):
    # walltime 5 s (SLURM itself allows a minute): an element claims a task of 1 s only while
    # twice its longest task and a second still fit, so it runs two at most; the rest is left
    cl = ew.slurm(walltime="5s", status_interval_s=0.5)
    n = 3 * cl.free_cpus().usable
    job = ew.submit(nap, [1] * n, range(n), on=cl, retries=0)
    job.wait(timeout=90, progress=False)
    assert job.results() == list(range(n))  # none lost, no retry used
    subs = _subs(cl, job)
    assert len(subs) >= 2 and len(_sbatch(cl)) == len(subs)
    assert subs[0]["claim"] == [[0, n]]
    per_worker = {}
    for t in range(n):
        wid = job.handle.outcomes[t][0]
        per_worker[wid] = per_worker.get(wid, 0) + 1
    first = [k for w, k in per_worker.items() if w.startswith("c0.")]
    assert first and max(first) <= 2, per_worker


def test_when_every_element_fails_to_start_the_tasks_are_lost_with_the_reason(ew_home, slurm_info):
    cl = ew.slurm(python="false", status_interval_s=0.5)  # the "interpreter" exits 1 at once
    job = ew.submit(double, range(50), on=cl)
    job.wait(timeout=90, progress=False)
    res = job.results()
    assert all(isinstance(r, ew.TaskError) and r.reason == "lost" for r in res), res[:3]
    why = res[0].message
    assert "no element of slurm job" in why and "NonZeroExitCode" in why, why
    assert job.check().state is ew.JobState.FAILED


def test_the_tasks_of_an_element_that_died_run_again_when_no_element_is_left(ew_home, slurm_info):
    # a task kills its element after the other elements ended (nothing was left to claim):
    # the tasks its element had claimed and not run go back to the queue with no element to
    # run them. The one that killed it is lost; the others never ran, and a new submission
    # runs them (they were lost with it, as "no element is left to run it", before)
    cl = ew.slurm(status_interval_s=0.5)
    killer = 100
    job = ew.submit(double_or_die, range(200), [killer] * 200, on=cl, retries=0)
    job.wait(timeout=90, progress=False)
    res = job.results()
    assert isinstance(res[killer], ew.TaskError) and res[killer].reason == "lost", repr(res[killer])
    assert [r for i, r in enumerate(res) if i != killer] == [2 * i for i in range(200) if i != killer], [
        (i, r) for i, r in enumerate(res) if isinstance(r, ew.TaskError)][:3]
    assert job.check().state is ew.JobState.FAILED
