"""``retries=``: errors of chosen types run again after a growing delay, lost workers' tasks as
before; on every backend of the conformance suite (conftest.py lists them).

Task 1 of ``fail_twice`` raises on its first two runs (its starts are counted in a file of the
test's folder, which every backend's workers reach): with ``ew.Retry(times=2, on=OSError)``
its third run gives the result; without retries, or with another type listed, its first error
is the result. The jobs of one test run at once, so a batch scheduler's queue is waited for once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import elsewhere as ew
from conformance.contract import Backend, end_running_task, folders, wait_until
from conformance.retry_tasks import fail_twice, start_times, starts
from conformance.tasks import long_unless_marked, pid_of, starts_of
from elsewhere.util.retry import rerun_delay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

START_S = 30  # how long a task may take to start running (a batch scheduler's queue)
END_S = 120  # how long a job of short tasks (and reruns 0.2 s and 0.4 s apart) may take to end


def test_an_error_of_a_listed_type_runs_again_after_a_growing_delay_and_others_do_not(
        backend: Backend, tmp_path: Path) -> None:  # fmt: skip
    cluster = backend()
    again, never, other, used_up = folders(tmp_path, "again", "never", "other", "used-up")
    policy = ew.Retry(times=2, on=(OSError, TimeoutError), delay_s=0.2, backoff=2.0, max_delay_s=5)
    jobs = {
        # ConnectionResetError is an OSError: matched by its base, by name, where it ran
        again: ew.submit(fail_twice, range(3), [str(again)] * 3, on=cluster, retries=policy),
        never: ew.submit(fail_twice, range(3), [str(never)] * 3, on=cluster),
        other: ew.submit(fail_twice, range(3), [str(other)] * 3, on=cluster,
                         retries=ew.Retry(times=2, on="ValueError", delay_s=0.2)),
        used_up: ew.submit(fail_twice, range(3), [str(used_up)] * 3, on=cluster,
                           retries=ew.Retry(times=1, on="ConnectionResetError", delay_s=0)),
    }  # fmt: skip
    for job in jobs.values():
        job.wait(timeout=END_S)

    job = jobs[again]
    assert job.results() == [0, 10, 20], job.check()
    assert job.state is ew.JobState.FINISHED
    assert [starts(again, i) for i in range(3)] == [
        1,
        3,
        1,
    ]  # task 1 ran three times, the others once
    assert job.tasks[1].attempts == 3 and job.tasks[0].attempts == 1
    assert "errors run again: task 1 (ConnectionResetError; run 3 of 3)" in job.check().note
    t = start_times(again, 1)
    assert t[1] - t[0] >= 0.2 and t[2] - t[1] >= 0.4, t  # the delay, doubled (lower bounds only)
    for folder in (never, other):
        values = jobs[folder].results()
        assert values[0] == 0 and values[2] == 20, values
        err = values[1]
        assert isinstance(err, ew.TaskError) and err.type_name == "ConnectionResetError", repr(err)
        assert err.message == "run 1 of task 1 fails"  # the first run's error: it did not run again
        assert jobs[folder].state is ew.JobState.FAILED
        assert starts(folder, 1) == 1 and jobs[folder].tasks[1].attempts == 1

    # its reruns used up, a task ends with its last error; job.retry() runs it once more
    job = jobs[used_up]
    err = job.results()[1]
    assert isinstance(err, ew.TaskError) and err.message == "run 2 of task 1 fails", repr(err)
    assert starts(used_up, 1) == 2 and job.tasks[1].attempts == 2
    job.retry()
    job.wait(timeout=END_S)
    assert job.results() == [0, 10, 20]
    assert job.tasks[1].attempts == 3


def test_a_lost_workers_task_runs_again_with_a_retry_policy_as_with_a_count(
        backend: Backend, tmp_path: Path) -> None:  # fmt: skip
    cluster = backend()
    lost, kept = folders(tmp_path, "lost", "kept")
    jobs = {
        # lost=True: a lost task runs again, as retries=1 does
        kept: ew.submit(long_unless_marked, range(2), [str(kept)] * 2, on=cluster,
                        retries=ew.Retry(times=1, on=OSError, lost=True)),
        # lost=False: errors only; a lost task fails at once
        lost: ew.submit(long_unless_marked, range(2), [str(lost)] * 2, on=cluster,
                        retries=ew.Retry(times=1, on=OSError, lost=False)),
    }  # fmt: skip
    for folder, job in jobs.items():
        wait_until(lambda job=job, folder=folder: pid_of(folder, 1), START_S, job.check)
        end_running_task(job, 1, pid_of(folder, 1))
    for job in jobs.values():
        job.wait(timeout=END_S)
    assert jobs[kept].results() == [0, 1]
    assert starts_of(kept, 1) == 2 and starts_of(kept, 0) == 1
    values = jobs[lost].results()
    assert isinstance(values[1], ew.TaskError) and values[1].reason == "lost", repr(values[1])
    assert starts_of(lost, 1) == 1


def test_retry_options_are_checked_when_the_job_is_made(ew_home: Path) -> None:
    with pytest.raises(ew.ConfigError, match="whole number"):
        ew.Retry(times=-1)
    with pytest.raises(ew.ConfigError, match="exception classes or their names"):
        ew.Retry(times=1, on=(int,))
    with pytest.raises(ew.ConfigError, match="backoff"):
        ew.Retry(times=1, backoff=0.5)
    with pytest.raises(ew.ConfigError, match="retries= takes a whole number"):
        ew.create_job(ew.local(cores=1), retries="3")  # type: ignore[arg-type]
    assert ew.Retry.of(2) == ew.Retry(times=2, on=(), lost=True)
    assert ew.Retry(times=1, on=(OSError, "requests.ConnectionError")).on == (
        "OSError",
        "requests.ConnectionError",
    )


def test_the_delay_grows_by_the_backoff_up_to_its_most_and_types_match_by_name() -> None:
    spec = ew.Retry(
        times=4, on=(OSError, "HTTPError"), delay_s="1s", backoff=2, max_delay_s=3
    ).spec()
    oserror = {
        "type": "ConnectionResetError",
        "bases": ["ConnectionError", "OSError", "Exception", "BaseException"],
    }
    assert [rerun_delay(spec, oserror, a) for a in range(5)] == [
        1.0,
        2.0,
        3.0,
        3.0,
        None,
    ]  # 4 reruns, then none
    assert (
        rerun_delay(spec, {"type": "urllib.error.HTTPError", "bases": []}, 0) == 1.0
    )  # a bare name: any module
    assert rerun_delay(spec, {"type": "ValueError", "bases": ["Exception"]}, 0) is None
    assert rerun_delay(spec, {"type": "WorkerLost"}, 0) is None  # a fate is no exception
    assert rerun_delay(None, oserror, 0) is None
