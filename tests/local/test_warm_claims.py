"""A warm worker that knows the function from its last job claims its first share in one go."""

from __future__ import annotations

import operator
import os
import time

import pytest

import elsewhere as ew
from elsewhere.folder.queue import read_queue
from elsewhere.folder.store import JobStore

pytestmark = pytest.mark.timeout(120)


def _updates(fn, n: int, cluster) -> int:
    """Run ``fn`` over ``n`` inputs on ``cluster``'s one warm worker: how many times the job's
    queue was written (its generation), once that worker is idle again."""
    job = ew.submit(fn, range(n), on=cluster)
    job.wait(timeout=60, progress=False)
    assert job.results() == [fn(i) for i in range(n)]
    idle = cluster.pool_dir() / "idle"
    deadline = time.monotonic() + 30
    while not os.listdir(idle):  # the worker leaves the job (a last claim), then goes idle
        assert time.monotonic() < deadline, "the worker did not go idle"
        time.sleep(0.01)
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
