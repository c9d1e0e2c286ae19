"""A warm worker of the local pool makes its files for the next job while it waits (run/kit.py):
the job's files are those, renamed in, new in every job, and they go when the worker does."""

from __future__ import annotations

import os

import pytest

import elsewhere as ew
from conformance.contract import wait_until
from elsewhere.folder.store import JobStore
from elsewhere.run.kit import FILES

pytestmark = pytest.mark.timeout(120)


def _until(what, check):
    return wait_until(check, 20, what, step=0.01)


def _pid(x):
    print("out", x)
    return os.getpid()


def _job_files(path, wid):
    return {"cur": path / "workers" / f"{wid}.cur", "results": path / "results" / f"{wid}.bin",
            "journal": path / "journal" / f"{wid}.rec", "log": path / "logs" / f"{wid}.log"}  # fmt: skip


def test_a_warm_workers_job_files_are_its_kits_new_each_job_and_gone_when_it_exits(ew_home):
    cl = ew.local(cores=1)
    kit = cl.pool_dir() / "kit"
    first = ew.submit(_pid, range(3), on=cl)
    first.wait(timeout=60, progress=False)
    (wid,) = JobStore(first.path).queue().members
    names = {name: kit / f"{wid}.{name}" for name in FILES}
    # idle again: its kit made, a new file for each of a job's
    inodes = _until("the idle worker's kit", lambda: all(p.exists() for p in names.values())
                    and {n: p.stat().st_ino for n, p in names.items()})  # fmt: skip
    first_marker = (cl.pool_dir() / "idle" / wid).stat().st_ino
    second = ew.submit(_pid, range(3), on=cl)
    second.wait(timeout=60, progress=False)
    assert JobStore(second.path).queue().members.keys() == {wid}  # the same warm worker
    files = _job_files(second.path, wid)
    assert {n: p.stat().st_ino for n, p in files.items()} == inodes  # the kit's, renamed in
    before = {n: p.stat().st_ino for n, p in _job_files(first.path, wid).items()}
    assert not set(before.values()) & set(inodes.values())  # no file of a job is another's
    assert second.results() == [second.results()[0]] * 3 and "out 2" in second.log(2)
    assert _until("a new kit", lambda: all(p.exists() and p.stat().st_ino not in inodes.values()
                                            for p in names.values()))  # fmt: skip
    # its idle marker is renamed to taken/ by the client that takes it, and back by the worker
    # (no file made and removed for every job)
    marker = cl.pool_dir() / "idle" / wid
    assert _until("idle again", marker.exists) and marker.stat().st_ino == first_marker
    assert cl.shutdown() == 1
    _until("the kit gone with its worker", lambda: not any(p.exists() for p in names.values()))
    _until("its marker gone", lambda: not marker.exists() and not (cl.pool_dir() / "taken" / wid).exists())
    first.purge()
    second.purge()


def test_a_worker_back_in_a_job_it_ran_before_goes_on_with_its_files(ew_home):
    # job.retry() hands the job to the warm worker that ran it: its journal, results and log
    # there go on (a kit's file never replaces one), and the earlier tasks' outcomes stay
    cl = ew.local(cores=1)
    job = ew.submit(_odd_fails, range(4), on=cl)
    job.wait(timeout=60, progress=False)
    (wid,) = JobStore(job.path).queue().members
    journal = job.path / "journal" / f"{wid}.rec"
    size, ino = journal.stat().st_size, journal.stat().st_ino
    assert [isinstance(v, ew.TaskError) for v in job.results()] == [False, True, False, True]
    idle = cl.pool_dir() / "idle"
    _until("the worker idle again", lambda: os.listdir(idle) == [wid])  # (else a new one runs them)
    job.retry()
    job.wait(timeout=60, progress=False)
    assert JobStore(job.path).queue().members.keys() == {wid}
    assert journal.stat().st_ino == ino and journal.stat().st_size > size
    assert job.results()[0] == 0 and "out 0" in job.log(0)
    job.purge()


def _odd_fails(x):
    print("out", x)
    if x % 2:
        raise ValueError(x)
    return x
