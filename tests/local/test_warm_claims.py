"""A warm worker that knows the function from its last job claims its first share in one go,
and runs it on the fast path where that job's quiet tasks ended."""

from __future__ import annotations

import fcntl
import operator
import os
import select
import time

import pytest

import elsewhere as ew
from elsewhere.folder import records
from elsewhere.folder.queue import read_queue
from elsewhere.folder.store import CUR, JobStore

pytestmark = pytest.mark.timeout(120)


def _first_record(fn, n: int, cluster) -> records.Record:
    """Run ``fn`` over ``n`` inputs on ``cluster``'s one warm worker: the journal record that
    holds task 0's outcome (a range of tasks on the fast path, ``count`` > 1)."""
    job = ew.submit(fn, range(n), on=cluster)
    job.wait(timeout=60, progress=False)
    assert job.results() == [fn(i) for i in range(n)]
    journal = os.path.join(job.path, "journal")
    recs = []
    for name in os.listdir(journal):
        with open(os.path.join(journal, name), "rb") as f:
            recs += records.parse_frames(f.read())[0]
    _wait_idle(cluster)
    job.purge()
    return next(r for r in recs if r.task <= 0 < r.task + r.count)


def _wait_idle(cluster) -> None:
    idle = cluster.pool_dir() / "idle"
    deadline = time.monotonic() + 30
    while not os.listdir(idle):  # the worker leaves the job (a last claim), then goes idle
        assert time.monotonic() < deadline, "the worker did not go idle"
        time.sleep(0.01)


def _updates(fn, n: int, cluster) -> int:
    """Run ``fn`` over ``n`` inputs on ``cluster``'s one warm worker: how many times the job's
    queue was written (its generation), once that worker is idle again."""
    job = ew.submit(fn, range(n), on=cluster)
    job.wait(timeout=60, progress=False)
    assert job.results() == [fn(i) for i in range(n)]
    _wait_idle(cluster)
    updates = read_queue(JobStore(job.path))[0]
    job.purge()
    return updates


def test_the_same_function_again_is_claimed_without_a_first_task_alone(ew_home):
    one = ew.local(cores=1)
    _updates(operator.pos, 10, one)  # a warm worker (its start wrote to the queue of this job)
    first = _updates(abs, 1000, one)  # submitted, joined with one task, the rest, nothing left
    again = _updates(abs, 1000, one)  # the worker knows abs: joined with all of it, nothing left
    other = _updates(operator.neg, 1000, one)  # another function: one task first again
    # (a slow first task on a busy machine makes the first claims smaller, never fewer)
    assert again < first and again < other


def _loud(x: int) -> int:
    print(f"task of {x}")
    return x


def test_the_same_quiet_function_again_starts_on_the_fast_path(ew_home):
    one = ew.local(cores=1)
    _first_record(operator.pos, 10, one)  # a warm worker
    first = _first_record(abs, 1000, one)  # unknown: one by one until tasks in a row were quiet
    again = _first_record(abs, 1000, one)  # known quiet and fast: its first claim on the fast path
    other = _first_record(operator.neg, 1000, one)  # another function: one by one first again
    assert first.count == 1 and other.count == 1
    assert again.count > 1 and again.kind == records.Kind.OK


def test_a_function_that_printed_is_run_one_by_one_again_each_task_its_own_output(ew_home):
    one = ew.local(cores=1)
    _first_record(_loud, 20, one)
    assert _first_record(_loud, 20, one).count == 1  # it printed last time: no range
    job = ew.submit(_loud, range(20), on=one)
    job.wait(timeout=60, progress=False)
    assert job.log(3).strip() == "task of 3"
    _wait_idle(one)
    job.purge()


def _nap(x: int) -> int:
    time.sleep(0.5)
    return x


def test_a_client_waiting_for_the_end_hears_of_the_last_tasks_before_the_last_claim(ew_home):
    # The claim that finds nothing left takes the queue's lock and looks at the other members;
    # a client that waits for the job's end (ew.map's) is told before it, not after.
    one = ew.local(cores=1)
    _first_record(operator.pos, 10, one)  # a warm worker
    job = ew.submit(_nap, [7], on=one, _waited=True, _purged=True)  # ew.map's: told at its end
    fifo = os.open(os.path.join(job.path, "notify.fifo"), os.O_RDONLY | os.O_NONBLOCK)
    lock = os.open(os.path.join(job.path, "queue.lock"), os.O_RDWR)
    try:
        workers = os.path.join(job.path, "workers")
        deadline = time.monotonic() + 30
        while True:  # the task runs: its claim is made (the worker's map names it)
            curs = [n for n in os.listdir(workers) if n.endswith(".cur")]
            data = (job.path / "workers" / curs[0]).read_bytes() if curs else b""
            if len(data) == CUR.size and CUR.unpack(data)[0] == 0:
                break
            assert time.monotonic() < deadline, "the task did not start"
            time.sleep(0.01)
        fcntl.flock(lock, fcntl.LOCK_EX)  # the worker's next claim waits for this
        try:
            told, _, _ = select.select([fifo], [], [], 20)
            assert told, "the client was not told of the last task while the worker's last claim waited"
            assert os.read(fifo, 16)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        job.wait(timeout=60, progress=False)
        assert job.results() == [7]
    finally:
        os.close(fifo)
        os.close(lock)
    _wait_idle(one)
    job.purge()
