"""The core's control of a job on local workers: cancel one task, retry some, report lost,
and job folders of other versions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import elsewhere as ew

pytestmark = pytest.mark.timeout(60)


def nap(s):
    time.sleep(s)
    return s


def fail_once(marker):
    import os

    if not os.path.exists(marker):
        open(marker, "w").close()
        raise KeyError("first")
    return "again"


def _until(cond, what, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_a_cancelled_task_ends_cancelled_and_the_job_finished(ew_home):
    job = ew.submit(nap, [0, 30, 0, 0], on=ew.local(cores=2))
    _until(lambda: job.tasks[1].state is ew.TaskState.RUNNING, job.check)
    assert job.tasks[1].cancel() is True
    job.wait(timeout=30)
    assert [t.state for t in job.tasks] == [ew.TaskState.FINISHED, ew.TaskState.CANCELLED,
                                            ew.TaskState.FINISHED, ew.TaskState.FINISHED]
    assert job.check().state is ew.JobState.FINISHED
    err = job.results()[1]
    assert isinstance(err, ew.TaskError) and err.reason == "cancelled"
    assert job.tasks[0].cancel() is False


def test_cancelling_a_task_claimed_and_not_started_stops_the_worker_that_claimed_it(ew_home, tmp_path):
    # From its claim to the start of a task, a worker does not look at the queue again: a
    # task cancelled in between (Executor.kill just after running() said a worker took the
    # call) ran all the same, and held the executor's only worker for its whole length.
    job = ew.submit(nap, [30, 30], on=ew.local(cores=1))
    _until(lambda: job.tasks[0].state is ew.TaskState.RUNNING, job.check)
    lock = tmp_path / "claimed.lock"
    # A worker between its claim of task 1 and that task's start: a process leading its own
    # session and holding its lock, task 1 its claim in the queue, no task in its map yet
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)", str(lock)],
        stdout=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == b"locked\n"
        with job.handle.store.locked_queue() as q:
            assert q.take_next(1) == 1
            q.join("between", {"pid": holder.pid, "host": os.uname().nodename, "lock": str(lock), "fifo": ""})
            q.set_member("between", "active", [1, 2])
        assert job.tasks[1].cancel() is True
        assert holder.wait(timeout=20) == -signal.SIGKILL
        assert job.tasks[0].state is ew.TaskState.RUNNING  # the worker running another task goes on
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
    job.cancel()


def hang_at(x, at, marker):
    if x == at:
        open(marker, "w").close()
        time.sleep(60)
    return x


def test_a_task_cancelled_while_it_hangs_inside_a_flood_s_loop_stops_and_the_rest_run(ew_home, tmp_path):
    # A flood of quiet tiny tasks runs in one loop whose map names no task (SEVERAL): cancelling
    # the one that hangs there stops its worker all the same (its claim holds the task); the
    # claim's other tasks run again, each alone, and keep their values.
    n, at, marker = 20_000, 12_345, tmp_path / "hanging"
    job = ew.submit(hang_at, range(n), [at] * n, [str(marker)] * n, on=ew.local(cores=1), seed=False)
    _until(marker.exists, job.check)
    assert job.tasks[at].cancel() is True
    job.wait(timeout=40)
    res = job.results()
    assert isinstance(res[at], ew.TaskError) and res[at].reason == "cancelled"
    assert [i for i, v in enumerate(res) if v != i] == [at]
    assert job.check().state is ew.JobState.FINISHED


def test_retry_of_given_tasks_checks_their_states(ew_home, tmp_path):
    job = ew.submit(fail_once, [str(tmp_path / "a"), str(tmp_path / "b")], on=ew.local(cores=2))
    job.wait(timeout=30)
    assert [t.state for t in job.tasks] == [ew.TaskState.FAILED] * 2
    job.retry([1])
    job.wait(timeout=30)
    assert job.results()[1] == "again" and isinstance(job.results()[0], ew.TaskError)
    with pytest.raises(ew.StateError, match=r"task 1 of job .* cannot move from finished to queued"):
        job.retry([1])
    with pytest.raises(IndexError):
        job.retry([7])
    with pytest.raises(ew.ConfigError, match="takes no resources"):
        job.retry(mem="8G")


def test_report_lost_is_current_at_once(ew_home):
    job = ew.submit(nap, [30], on=ew.local(cores=1), retries=0)
    _until(lambda: job.tasks[0].state is ew.TaskState.RUNNING, job.check)
    snap = job.cluster.report_lost(job.handle, {0: "the node caught fire"})
    assert snap.task_state(0) is ew.TaskState.FAILED  # no private refresh needed
    assert job.tasks[0].state is ew.TaskState.FAILED
    assert job.results()[0].message == "the node caught fire"
    job.cancel()


def test_a_folder_of_the_previous_layout_is_read_and_a_newer_one_refused(ew_home):
    job = ew.submit(nap, [0, 0], on=ew.local(), name="old-one")
    job.wait(timeout=30)
    meta = json.loads((job.path / "job.json").read_text())
    del meta["_check"]  # (its checksum: a folder of the previous layout has none)
    meta["cluster"]["class"] = "elsewhere.clusters.local:LocalCluster"  # the module before the layers
    (job.path / "job.json").write_text(json.dumps(meta))
    assert ew.recover("old-one").results() == [0, 0]
    meta["format"] = 1  # the first format: no checksums anywhere
    (job.path / "job.json").write_text(json.dumps(meta))
    assert ew.recover("old-one").results() == [0, 0]
    meta["format"] = 3
    (job.path / "job.json").write_text(json.dumps(meta))
    with pytest.raises(ew.JobError, match=r"written by a newer elsewhere \(format 3\).*reads format 2"):
        ew.recover("old-one")



#: a client that dies (SIGKILL) inside ``ew.submit``, once the job is registered and before it
#: hands the job to its cluster (``cluster``, a class of ``module``)
KILLED_CLIENT = """
import os, signal
import elsewhere as ew
from {module} import {cluster} as C

def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)

C.submit_independent = die
ew.submit(abs, [-1, -2, -3], name={name!r}, on={on})
"""


def kill_inside_submit(name, on="ew.local(cores=2)", module="elsewhere.backends.local", cluster="LocalCluster"):
    """Run a client that registers job ``name`` on cluster ``on`` (Python text) and is killed
    before it hands the job over; returns the pid it had."""
    import signal
    import subprocess
    import sys

    code = KILLED_CLIENT.format(module=module, cluster=cluster, name=name, on=on)
    p = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL, err
    return p.pid


def test_a_job_whose_client_died_before_the_hand_over_is_handed_over_by_the_next_poll(ew_home, monkeypatch):
    from elsewhere.backends.local import LocalCluster

    dead = kill_inside_submit("orphan")
    job = ew.recover("orphan")
    assert not job.handle.store.queue().submitted and job.handle.spec["client"]["pid"] == dead

    def refuse(self, handle):
        raise OSError("no workers today")

    with monkeypatch.context() as m:
        m.setattr(LocalCluster, "submit_independent", refuse)
        with pytest.raises(ew.JobError, match=r"'orphan' was registered by a client \(process "
                           rf"{dead} on .*\) that ended before it handed the job to its local cluster; "
                           r"handing it over now failed .*: OSError: no workers today"):
            job.wait(timeout=30)
    # given back: the next look hands it over again, and becomes its client
    assert ew.recover("orphan").handle.spec["client"]["pid"] == dead
    job.wait(timeout=30)
    assert job.results() == [1, 2, 3]
    assert ew.recover("orphan").handle.spec["client"]["pid"] == os.getpid()


def test_a_hand_over_that_fails_part_way_fails_the_tasks_with_the_reason(ew_home, monkeypatch):
    from elsewhere.backends.local import LocalCluster

    kill_inside_submit("half")
    job = ew.recover("half")

    def half(self, handle):  # the backend takes the job in (its queue says so), then fails
        with handle.store.locked_queue() as q:
            q.submit(max_workers=2)
        raise OSError("fork failed")

    with monkeypatch.context() as m:
        m.setattr(LocalCluster, "submit_independent", half)
        with pytest.raises(ew.JobError, match=r"'half' was registered by a client .* handing it over now "
                           r"failed, and its tasks not started fail with the reason .*: OSError: fork failed"):
            job.wait(timeout=30)
    job.wait(timeout=30)  # nothing waits for what was never started
    for v in job.results():
        assert isinstance(v, ew.TaskError) and v.reason == "lost"
        assert v.message == "could not be handed to its local cluster: OSError: fork failed"
    job.retry()
    job.wait(timeout=30)
    assert job.results() == [1, 2, 3]


def test_an_executor_asks_its_cluster_for_its_workers_outside_the_job_queue_lock(ew_home, monkeypatch):
    """A plugin's ``max_workers`` may ask its scheduler (seconds): the job's queue lock,
    which every worker and client of the job takes, is not held meanwhile."""
    import fcntl

    from elsewhere.backends.local import LocalCluster

    held, seen = [], []

    def max_workers(self, n_tasks):
        for lock in ew_home.glob("jobs/*/queue.lock"):
            seen.append(lock.parent.name)
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(lock.parent.name)
            finally:
                os.close(fd)  # (releases it, if taken)
        return 2

    monkeypatch.setattr(LocalCluster, "max_workers", max_workers)
    with ew.Executor(ew.local(cores=2)) as ex:
        assert ex.submit(abs, -3).result(timeout=30) == 3
    assert seen and held == []
