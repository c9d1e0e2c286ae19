"""The contract every backend keeps, the same behaviours on each (conftest.py lists them).

A behaviour a backend cannot have by design is one of its declared capabilities: when the
backend lacks it (see ``conformance.contract.lacks``), the test checks that the operation
raises a ConfigError that says so instead. Capabilities these tests look at:

- ``cancel_task``: ``job.tasks[i].cancel()`` stops that one task (behaviour 5).

Tasks are short; every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import elsewhere as ew
from conformance.contract import Backend, end_running_task, gone, lacks, recorded_worker, wait_until
from conformance.tasks import (
    chatty,
    crash_on,
    fail_first_time,
    hold,
    long_unless_marked,
    nap,
    pid_of,
    raise_on_two,
    result_kills_its_worker,
    square_late,
    starts_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

START_S = 30  # how long a task may take to start running (a batch scheduler's queue)
END_S = 30  # how long a job of short tasks may take to end once they run
PROMPT_S = 15  # what "promptly" means: a cancel, a stop


# -- 1. map ----------------------------------------------------------------------------------


def test_map_gives_the_results_in_order(backend: Backend) -> None:
    assert ew.map(square_late, range(6), on=backend(), timeout=END_S) == [x * x for x in range(6)]


# -- 2. errors ----------------------------------------------------------------------------


def test_a_task_error_is_a_value_with_the_remote_traceback_or_raised_as_its_type(
    backend: Backend,
) -> None:
    name = f"conformance-errors-{backend.name}"
    out = ew.map(
        raise_on_two, range(4), on=backend(), errors="return", timeout=END_S, keep=True, name=name
    )
    assert out[:2] == [0, 1] and out[3] == 3, out
    err = out[2]
    assert isinstance(err, ew.TaskError) and err.type_name == "ValueError", repr(err)
    assert err.message == "bad input 2" and err.index == 2
    assert "raise_on_two" in err.traceback, err.traceback
    with pytest.raises(ValueError, match="bad input 2"):
        ew.recover(name).get()  # errors="raise", as ew.map's default


# -- 3. recover ------------------------------------------------------------------------------

SUBMIT = """
import time
import elsewhere as ew

def slow_negate(x):
    time.sleep(0.1)
    return -x

job = ew.submit(slow_negate, range(4), name={name!r}, on={cluster})
print(job.id, flush=True)
"""

RECOVER = """
import json
import elsewhere as ew

job = ew.recover({name!r})
job.wait(timeout={timeout}, progress=False)
print(json.dumps(job.results()), flush=True)
"""


def _python(code: str, timeout: float) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_a_job_submitted_by_a_process_that_exits_is_recovered_in_another(backend: Backend) -> None:
    name = f"conformance-recover-{backend.name}"
    job_id = _python(SUBMIT.format(name=name, cluster=backend.source()), timeout=60).strip()
    out = _python(RECOVER.format(name=name, timeout=END_S), timeout=END_S + 30)
    assert json.loads(out.strip().splitlines()[-1]) == [0, -1, -2, -3]
    assert ew.recover(name).id == job_id


# -- 4. cancel a job ----------------------------------------------------------------------


def test_cancel_stops_the_job_and_wait_returns_promptly(backend: Backend, tmp_path: Path) -> None:
    n = 3
    job = ew.submit(nap, [60] * n, [str(tmp_path)] * n, range(n), on=backend())
    wait_until(lambda: any(pid_of(tmp_path, i) for i in range(n)), START_S, job.check)  # one runs
    started = [i for i in range(n) if pid_of(tmp_path, i)]
    t0 = time.monotonic()
    job.cancel()
    assert job.state is ew.JobState.CANCELLED
    job.wait(timeout=PROMPT_S)
    assert time.monotonic() - t0 < PROMPT_S
    assert job.state is ew.JobState.CANCELLED
    results = job.results()
    assert all(isinstance(r, ew.TaskError) and r.reason == "cancelled" for r in results), results
    # what ran is stopped (a task that started just now may have missed the list)
    pids = [pid_of(tmp_path, i) for i in started]
    wait_until(
        lambda: all(gone(p) for p in pids), PROMPT_S, lambda: [p for p in pids if not gone(p)]
    )


# -- 5. cancel one task -------------------------------------------------------------------


def test_cancel_one_task_the_others_finish(backend: Backend, tmp_path: Path) -> None:
    cluster = backend()
    seconds = [0.5, 60, 0.5, 0.5]
    job = ew.submit(nap, seconds, [str(tmp_path)] * 4, range(4), on=cluster)
    long_task = job.tasks[1]
    wait_until(lambda: pid_of(tmp_path, 1), START_S, job.check)  # it runs
    if lacks(cluster, "cancel_task"):
        with pytest.raises(ew.ConfigError, match=re.escape(cluster.kind or type(cluster).__name__)):
            long_task.cancel()
        return
    t0 = time.monotonic()
    assert long_task.cancel() is True
    job.wait(timeout=END_S)
    assert time.monotonic() - t0 < END_S  # it did not wait for the long task
    assert job.state is ew.JobState.FINISHED, job.check()
    assert long_task.state is ew.TaskState.CANCELLED
    results = job.results()
    assert [results[i] for i in (0, 2, 3)] == [0, 2, 3], results
    assert isinstance(results[1], ew.TaskError) and results[1].reason == "cancelled", results[1]
    pid = pid_of(tmp_path, 1)
    wait_until(lambda: gone(pid), PROMPT_S, f"the cancelled task's process {pid} still runs")


# -- 6. a worker killed mid-task ------------------------------------------------------------


def test_a_task_whose_worker_is_killed_is_lost_with_a_reason_or_rerun_with_retries(
        backend: Backend, tmp_path: Path) -> None:  # fmt: skip
    cluster = backend()
    once, again = tmp_path / "no-retries", tmp_path / "one-retry"
    once.mkdir()
    again.mkdir()
    jobs = {
        once: ew.submit(long_unless_marked, range(2), [str(once)] * 2, on=cluster, retries=0),
        again: ew.submit(long_unless_marked, range(2), [str(again)] * 2, on=cluster, retries=1),
    }
    recorded = {}
    for folder, job in jobs.items():
        # task 1 runs
        wait_until(lambda job=job, folder=folder: pid_of(folder, 1), START_S, job.check)
        recorded[folder] = recorded_worker(job, 1, pid_of(folder, 1))
        end_running_task(job, 1, pid_of(folder, 1))
    for job in jobs.values():
        job.wait(timeout=END_S)
    lost = jobs[once].results()
    assert lost[0] == 0, lost
    assert isinstance(lost[1], ew.TaskError) and lost[1].reason == "lost", repr(lost[1])
    assert lost[1].message.strip(), "a lost task's error says why"
    assert jobs[once].state is ew.JobState.FAILED
    assert jobs[again].results() == [0, 1]
    assert starts_of(again, 1) == 2 and starts_of(again, 0) == 1  # task 1 ran again, task 0 did not
    assert jobs[again].state is ew.JobState.FINISHED
    # the job folder knew which worker ran the task (where a process was killed)
    for folder, problem in recorded.items():
        assert not problem, f"{folder.name}: {problem}"


def test_a_task_that_crashes_its_worker_is_lost_alone_and_the_tasks_after_it_run(backend: Backend) -> None:
    # however the backend gives out tasks (claimed from the queue, or a list to each worker or
    # array element), the crash costs the task that crashed, not the others its worker held
    job = ew.submit(crash_on, range(12), [3] * 12, on=backend())
    job.wait(timeout=END_S * 2)
    res = job.results()
    assert isinstance(res[3], ew.TaskError) and res[3].reason == "lost", repr(res[3])
    assert res[3].message.strip(), "a lost task's error says why"
    assert [r for i, r in enumerate(res) if i != 3] == [i for i in range(12) if i != 3], res


def test_a_value_that_kills_its_worker_fails_its_own_task_and_no_other(backend: Backend) -> None:
    # 50 tiny tasks: their values are pickled together, so a death then cannot say whose value
    # did it; the backend finds it (the tasks run again one by one) rather than failing another
    # task in its place, or running the batch, and killing a worker, for ever
    job = ew.submit(result_kills_its_worker, range(50), [20] * 50, on=backend())
    job.wait(timeout=END_S * 2)
    res = job.results()
    assert isinstance(res[20], ew.TaskError) and res[20].reason == "lost", repr(res[20])
    assert [r for i, r in enumerate(res) if i != 20] == [i for i in range(50) if i != 20], res
    assert job.state is ew.JobState.FAILED


# -- 7. retry ------------------------------------------------------------------------------


def test_retry_runs_the_failed_task_again(backend: Backend, tmp_path: Path) -> None:
    job = ew.submit(fail_first_time, range(3), [str(tmp_path)] * 3, on=backend())
    job.wait(timeout=END_S)
    first = job.results()
    assert first[0] == 0 and first[2] == 20, first
    err = first[1]
    assert isinstance(err, ew.TaskError) and err.type_name == "RuntimeError", repr(err)
    assert job.state is ew.JobState.FAILED
    job.retry()
    job.wait(timeout=END_S)
    assert job.results() == [0, 10, 20]
    assert job.state is ew.JobState.FINISHED
    assert [starts_of(tmp_path, i) for i in range(3)] == [1, 2, 1]  # only the failed task ran again


# -- 8. states ---------------------------------------------------------------------------


def test_states_move_forward_from_queued_through_running_to_finished(
    backend: Backend, tmp_path: Path
) -> None:
    n = 2
    job = ew.submit(hold, [str(tmp_path)] * n, range(n), on=backend())
    first = job.state
    assert first in (ew.JobState.QUEUED, ew.JobState.RUNNING), first
    seen: list[tuple[ew.JobState, list[ew.TaskState]]] = []
    # The tasks run until released: once one was seen running, or a few seconds after one
    # started (a backend that never shows a task running fails fast).
    release = tmp_path / "release"
    started_at = 0.0
    deadline = time.monotonic() + START_S + END_S
    while True:
        status = job.check()
        seen.append((status.state, [t.state for t in job.tasks]))
        if status.state.done:
            break
        assert time.monotonic() < deadline, seen[-5:]
        if not release.exists():
            if not started_at and any(pid_of(tmp_path, i) for i in range(n)):
                started_at = time.monotonic()
            if ew.TaskState.RUNNING in seen[-1][1] or (
                started_at and time.monotonic() - started_at > 5
            ):
                release.touch()
        time.sleep(0.02 if release.exists() else 0.1)  # closely while the tasks end
    shown = _looks(seen)
    assert seen[-1][0] is ew.JobState.FINISHED, shown
    assert any(ew.TaskState.RUNNING in tasks for _, tasks in seen), f"no task seen running: {shown}"
    for i in range(n):
        ranks = [min(list(ew.TaskState).index(tasks[i]), 3) for _, tasks in seen]
        assert ranks == sorted(ranks), f"task {i} moved backwards: {shown}"
    assert ew.JobState.RUNNING in {s for s, _ in seen}, shown
    ranks = [first.rank] + [state.rank for state, _ in seen]
    assert ranks == sorted(ranks), f"the job moved backwards: {first.value}, then {shown}"


def _looks(seen: list[tuple[ew.JobState, list[ew.TaskState]]]) -> str:
    """The states seen, one look after another, repeats counted: "queued (queued, queued) x3"."""
    out: list[str] = []
    last, count = "", 0
    for job_state, tasks in [*seen, (None, [])]:
        text = f"{job_state.value} ({', '.join(t.value for t in tasks)})" if job_state else ""
        if text == last:
            count += 1
            continue
        if last:
            out.append(last + (f" x{count}" if count > 1 else ""))
        last, count = text, 1
    return " -> ".join(out)


# -- 9. logs --------------------------------------------------------------------------------


def test_a_tasks_log_holds_what_it_printed(backend: Backend) -> None:
    job = ew.submit(chatty, range(2), on=backend())
    job.wait(timeout=END_S)
    assert job.results() == [0, 1]
    for i in range(2):
        log = job.log(i)
        assert f"conformance stdout of task {i}" in log, log
        assert f"conformance stderr of task {i}" in log, log
        assert f"of task {1 - i}" not in log, log


# -- 10. purge ------------------------------------------------------------------------------


def test_purge_leaves_nothing_behind(backend: Backend) -> None:
    name = f"conformance-purge-{backend.name}"
    job = ew.submit(square_late, range(2), name=name, on=backend())
    job.wait(timeout=END_S)
    assert job.results() == [0, 1]
    if backend.remote is not None:
        assert backend.leftovers(job.id), f"no copy of the job in {backend.remote} to purge"
    job.purge()
    assert backend.leftovers(job.id) == []  # nothing on the node
    assert not job.path.exists(), (
        f"the job folder is still there after purge: {sorted(p.name for p in job.path.iterdir())}"
    )
    with pytest.raises(ew.JobNotFound):
        ew.recover(name)
