"""``job.as_completed()``, ``async for`` and ``await job`` on every backend (conftest.py lists
them): each task's ``(index, result)`` comes as soon as it has finished, not when the job has,
with the errors ``job.results()`` gives (a failed task's TaskError, a cancelled task's, or
raised as its own type with ``errors="raise"``), and a timeout that says how many are left.

The last tests run on local workers only: a task lost with its worker, and what asyncio code
sees of the thread that waits (the event loop runs on; cancelling the awaiting task ends that
thread; nothing is lost or given twice when an ``async for`` is cancelled and taken up again).
"""

from __future__ import annotations

import asyncio
import threading
from itertools import islice
from pathlib import Path

import pytest

import elsewhere as ew
from conformance.contract import Backend, end_running_task, wait_until
from conformance.tasks import hold, nap, pid_of, raise_on_two

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

START_S = 30  # how long a task may take to start running (a batch scheduler's queue)
END_S = 30  # how long a job of short tasks may take to end once they run
PROMPT_S = 15  # what "promptly" means: a cancel, a thread that stops


def test_results_come_as_tasks_finish_with_the_errors_of_results(
    backend: Backend, tmp_path: Path
) -> None:
    job = ew.create_job(on=backend())
    job.add_task(nap, 0.2, str(tmp_path), 0)
    job.add_task(raise_on_two, 2)
    job.add_task(nap, 0.2, str(tmp_path), 2)
    job.add_task(nap, 60, str(tmp_path), 3)  # ends only when the job is cancelled
    job.submit()
    completed = job.as_completed(timeout=START_S + END_S)
    # three come while task 3 still runs: each came as it finished, not with the job
    first = dict(islice(completed, 3))
    assert sorted(first) == [0, 1, 2] and first[0] == 0 and first[2] == 2, first
    assert 3 not in job.handle.refresh()  # no outcome yet
    assert completed.remaining == 1
    err = first[1]  # a failed task's result is its TaskError, as in results()
    assert isinstance(err, ew.TaskError) and err.type_name == "ValueError", repr(err)
    assert "raise_on_two" in err.traceback, err.traceback
    assert job.results(partial=True)[:3] == [first[0], err, first[2]]
    # or raised as its own type (those finished come at once: no wait for task 3)
    with pytest.raises(ValueError, match="bad input 2") as raised:
        for _ in job.as_completed(errors="raise", timeout=END_S):
            pass
    assert isinstance(raised.value, ew.TaskError) and raised.value.index == 1
    # a timeout says how many are left
    again = job.as_completed(timeout=0.1)
    assert sorted(i for i, _ in islice(again, 3)) == [0, 1, 2]
    with pytest.raises(ew.TimeoutError, match=r"1 of 4 tasks of job .* not finished within 0\.1 s"):
        next(again)

    # the same for asyncio; cancelling an await of the job ends its waiting thread
    async def in_asyncio() -> dict[int, object]:
        got = {}
        async for i, result in job:
            got[i] = result
            if len(got) == 3:
                break
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(job, 0.2)
        return got

    assert asyncio.run(asyncio.wait_for(in_asyncio(), END_S)) == first
    wait_until(lambda: not _waiting_threads(), PROMPT_S, _waiting_threads)
    # a cancelled job: its unfinished task comes last, as results() gives it
    wait_until(lambda: pid_of(tmp_path, 3), START_S, job.check)
    job.cancel()
    rest = list(completed)
    assert [i for i, _ in rest] == [3], rest
    cancelled = rest[0][1]
    assert isinstance(cancelled, ew.TaskError) and cancelled.reason == "cancelled", repr(cancelled)
    assert completed.remaining == 0 and list(completed) == []
    assert (
        asyncio.run(asyncio.wait_for(_awaited(job), END_S))
        == job.results()
        == [0, err, 2, cancelled]
    )


async def _awaited(job: ew.Job) -> object:
    return await job


def _waiting_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "elsewhere-await"]


# -- asyncio, on local workers -----------------------------------------------------------------


def test_asyncio_waits_without_blocking_the_loop_and_a_cancel_ends_the_thread(
    ew_home: Path, tmp_path: Path
) -> None:
    cluster = ew.local(cores=2)
    job = ew.submit(hold, [str(tmp_path)] * 2, range(2), on=cluster)
    events: list[object] = []

    async def consume() -> None:
        async for i, result in job:
            events.append((i, result))

    async def release() -> None:
        # runs while consume() waits: were the loop blocked, the tasks would run on
        # until hold()'s own limit and their results would come first
        events.append("release")
        (tmp_path / "release").touch()

    async def main() -> list[object]:
        await asyncio.wait_for(asyncio.gather(consume(), release()), END_S)
        return await job

    assert asyncio.run(main()) == [0, 1]
    assert events[0] == "release" and sorted(events[1:]) == [(0, 0), (1, 1)], events

    # cancelling what awaits a job that goes on: its waiting thread ends too
    (tmp_path / "long").mkdir()
    long = ew.submit(nap, [60], [str(tmp_path / "long")], [0], on=cluster)

    async def cancelled() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(long, 0.3)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(long.as_completed().__anext__(), 0.3)

    asyncio.run(cancelled())
    wait_until(lambda: not _waiting_threads(), PROMPT_S, lambda: _waiting_threads())
    assert long.state is not ew.JobState.CANCELLED  # the job goes on
    long.cancel()


def test_an_async_for_cancelled_and_taken_up_again_gives_each_task_once(
    ew_home: Path, tmp_path: Path
) -> None:
    job = ew.submit(nap, [0.1, 0.1, 0.1, 1.0], [str(tmp_path)] * 4, range(4), on=ew.local(cores=2))
    completed = job.as_completed(timeout=END_S)

    async def main() -> list[tuple[int, object]]:
        got: list[tuple[int, object]] = []
        while True:  # each step cancelled after a moment, then asked again
            try:
                got.append(await asyncio.wait_for(completed.__anext__(), 0.05))
            except asyncio.TimeoutError:
                continue
            except StopAsyncIteration:
                return got

    got = asyncio.run(asyncio.wait_for(main(), END_S))
    assert sorted(got) == [(0, 0), (1, 1), (2, 2), (3, 3)], got
    wait_until(lambda: not _waiting_threads(), PROMPT_S, lambda: _waiting_threads())


def test_a_task_lost_with_its_worker_comes_as_a_task_error_that_says_why(
    ew_home: Path, tmp_path: Path
) -> None:
    job = ew.submit(nap, [60, 0.1], [str(tmp_path)] * 2, range(2), on=ew.local(cores=2), retries=0)
    completed = job.as_completed(timeout=END_S)
    wait_until(lambda: pid_of(tmp_path, 0), START_S, job.check)
    end_running_task(job, 0, pid_of(tmp_path, 0))  # SIGKILL, as the out-of-memory killer would
    got = dict(completed)
    assert got[1] == 1
    lost = got[0]
    assert isinstance(lost, ew.TaskError) and lost.reason == "lost" and lost.message.strip(), repr(
        lost
    )
    assert job.results() == [lost, 1]


def test_a_result_found_for_a_cancelled_awaiter_is_put_back_not_lost() -> None:
    from elsewhere.api.completion import in_thread

    go = threading.Event()
    kept: list[object] = []
    saw_stop: list[bool] = []

    def step(stop: threading.Event) -> tuple[int, str, bool]:
        go.wait(PROMPT_S)  # the awaiter is cancelled meanwhile
        saw_stop.append(stop.is_set())
        return (7, "seven", False)

    async def main() -> None:
        task = asyncio.ensure_future(in_thread(step, put_back=kept.append))
        await asyncio.sleep(0)  # it starts its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go.set()
        for _ in range(PROMPT_S * 100):  # the loop hears of the value soon
            if kept:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert saw_stop == [True]  # the thread was told to stop
    assert kept == [(7, "seven", False)]  # and what it found anyway is kept for the next step


def test_as_completed_is_refused_before_submit_and_for_bad_arguments(ew_home: Path) -> None:
    job = ew.create_job(on=ew.local(cores=1))
    job.add_task(abs, -1)
    with pytest.raises(ew.JobError, match="not submitted"):
        job.as_completed()
    job.submit()
    with pytest.raises(ew.ConfigError, match="errors"):
        job.as_completed(errors="ignore")
    with pytest.raises(ew.ConfigError, match="timeout"):
        job.as_completed(timeout=-1)
    assert list(job.as_completed(timeout=END_S)) == [(0, 1)]
