"""Chaos: workers killed from outside (SIGKILL storms, a worker killed while it starts) and tasks
that crash their worker in every way a task can. Whatever ends a worker, every task ends with
its value, or failed with a reason (lost once its retries are spent): none stays queued or
running for ever, and none is silently dropped."""

from __future__ import annotations

import os
import random
import signal
import stat
import sys
import threading
import time

import pytest

import elsewhere as ew
from chaos.conftest import scaled

pytestmark = pytest.mark.timeout(300)


def _worker_pids(home) -> list[int]:
    """Workers (and their starting wrappers) of this test's home: found by the home's path in
    their command line, or, started as forks, by their name and a file they hold under it."""
    from workerprocs import worker_pids

    return worker_pids(home, also=(b"slow-python",))


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def _check(tally, job, expected, *, lost_ok: bool) -> None:
    """Count a task without its value as lost, unless it failed as "lost" with a reason
    (``lost_ok``: its retries were spent)."""
    if not job.check():  # true once nothing runs or waits
        tally.lose(len(expected), f"job {job.name} still {job.state.value} after its wait")
        return
    res = job.results()
    for i, (got, want) in enumerate(zip(res, expected)):
        if got == want and not isinstance(got, ew.TaskError):
            continue
        if lost_ok and isinstance(got, ew.TaskError) and got.reason == "lost" and got.message:
            continue
        tally.lose(1, f"task {i} of {job.name}: {got!r:.200}")


def _storm(home, rng: random.Random, kills: int, done: threading.Event) -> None:
    """SIGKILL a random worker of ``home`` every 0.1-0.3 s, ``kills`` times or until ``done``."""
    while kills and not done.wait(rng.uniform(0.1, 0.3)):
        pids = _worker_pids(home)
        if pids and _kill(rng.choice(pids)):
            kills -= 1


def _square_slowly(x):
    time.sleep(0.02)
    return x * x


@pytest.mark.parametrize("retries", [0, 6])
def test_sigkill_storm(ew_home, tally, retries):
    """Workers SIGKILLed at random moments while a job runs: without retries, each task ends
    with its value or failed as lost; with more retries than kills, every task has its value."""
    rng = random.Random(retries)
    for trial in range(scaled(1)):
        n, kills = 80, 5
        job = ew.submit(
            _square_slowly, range(n), on=ew.local(cores=2), retries=retries, name=f"storm{trial}"
        )
        done = threading.Event()
        killer = threading.Thread(target=_storm, args=(ew_home, rng, kills, done), daemon=True)
        killer.start()
        try:
            job.wait(timeout=120)
        except ew.TimeoutError as exc:
            tally.hang(str(exc))
        finally:
            done.set()
            killer.join()
        tally.trial(n)
        _check(tally, job, [x * x for x in range(n)], lost_ok=retries == 0)
        job.purge()


def test_worker_killed_while_starting_is_replaced(ew_home, tmp_path, tally):
    """The worker started for a job is killed before it joins (its interpreter here starts
    half a second late, so the kill lands then): the job still ends, with every value, well
    within a wait that the dispatch grace alone would have spent."""
    wrapper = tmp_path / "slow-python"
    wrapper.write_text(f'#!/bin/sh\nsleep 0.5\nexec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    for trial in range(scaled(2)):
        n = 40
        t0 = time.monotonic()
        job = ew.submit(
            abs, range(-n, 0), on=ew.local(cores=2, python=str(wrapper)), name=f"start{trial}"
        )
        killed = 0
        deadline = time.monotonic() + 10
        while not killed and time.monotonic() < deadline:  # the first worker, while it starts
            for pid in _worker_pids(ew_home):
                killed += _kill(pid)
            time.sleep(0.01)
        try:
            job.wait(timeout=60)
        except ew.TimeoutError as exc:
            tally.hang(str(exc))
        tally.trial(n)
        took = time.monotonic() - t0
        print(f"trial {trial}: {killed} worker(s) killed while starting; the job took {took:.1f} s")
        _check(tally, job, [abs(x) for x in range(-n, 0)], lost_ok=False)
        job.purge()
        _stop_workers(ew_home, ew.local(python=str(wrapper)))  # the next trial starts afresh


def _stop_workers(home, cluster) -> None:
    deadline = time.monotonic() + 10
    while _worker_pids(home) and time.monotonic() < deadline:
        cluster.shutdown()
        time.sleep(0.05)


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("this value refuses to be pickled")


def _crash(i, kind):
    """Task ``i`` of the crash job: ``kind`` says how it ends (``ok``: with i * i)."""
    if kind == "exit":
        os._exit(3)
    if kind == "segfault":
        import ctypes

        ctypes.string_at(0)
    if kind == "abort":
        os.abort()
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    if kind in ("memory", "oom"):
        import resource

        was = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, was[1]))
        try:
            return len(bytearray(4 << 30))
        finally:
            if kind == "memory":  # "oom" leaves the worker with its address space capped
                resource.setrlimit(resource.RLIMIT_AS, was)
    if kind == "sys.exit":
        sys.exit(4)
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    if kind == "unpicklable":
        return _Unpicklable()
    return i * i


#: how each crash ends its task: the worker dies (the task is lost), or the task fails with
#: an error of that type
_CRASHES = {
    "exit": "lost", "segfault": "lost", "abort": "lost", "sigkill": "lost", "sigterm": "lost",
    "memory": "MemoryError", "oom": "MemoryError", "sys.exit": "SystemExit",
    "interrupt": "KeyboardInterrupt", "sigint": "KeyboardInterrupt", "unpicklable": "RuntimeError",
}  # fmt: skip


def test_crashes_inside_tasks(ew_home, tally):
    """Every way a task can end its worker or itself, among tasks that succeed: those end with
    their values, each crash with a TaskError that says what happened."""
    kinds = [k for k in _CRASHES for _ in range(scaled(1))]
    plan: list[str] = []
    for k in kinds:
        plan += ["ok", "ok", k]
    plan += ["ok", "ok"]
    job = ew.submit(_crash, range(len(plan)), plan, on=ew.local(cores=2), name="crashes")
    try:
        job.wait(timeout=120)
    except ew.TimeoutError as exc:
        tally.hang(str(exc))
    tally.trial(len(plan))
    if not job.check():
        tally.lose(len(plan), f"crash job still {job.state.value}")
        return
    for i, (kind, got) in enumerate(zip(plan, job.results())):
        if kind == "ok":
            if got != i * i:
                tally.lose(1, f"task {i} (ok) gave {got!r:.200}")
            continue
        want = _CRASHES[kind]
        if not isinstance(got, ew.TaskError):
            tally.lose(1, f"task {i} ({kind}) gave {got!r:.200}, not a TaskError")
        elif want == "lost" and not got.message:
            tally.lose(1, f"task {i} ({kind}) was lost without a word")
        elif want == "lost" and got.reason != "lost":
            tally.lose(
                1, f"task {i} ({kind}): reason {got.reason!r}, not lost: {got.message[:200]}"
            )
        elif want != "lost" and want not in (got.type_name or "") + got.message:
            tally.lose(1, f"task {i} ({kind}): {got.type_name}: {got.message[:200]}")
    job.purge()


_FLOOD_N, _FLOOD_CULPRIT = 20_000, 12_345


def _segfault_at_culprit(x):
    if x == _FLOOD_CULPRIT:
        import ctypes

        ctypes.string_at(0)
    return x


def test_a_task_that_kills_its_worker_inside_a_flood_is_the_one_charged(ew_home):
    """A flood of tiny tasks runs in one loop in C (seed=False: nothing to seed), whose map
    names no task: a task that kills its worker there costs none of the others. The claim
    goes back whole, its tasks run again each alone, and the culprit, which kills again, is
    the one lost; every other task has its value."""
    job = ew.submit(_segfault_at_culprit, range(_FLOOD_N), on=ew.local(cores=2), seed=False, name="flood-crash")
    try:
        job.wait(timeout=120)
        res = job.results()
        failed = [i for i, v in enumerate(res) if isinstance(v, ew.TaskError)]
        assert failed == [_FLOOD_CULPRIT], failed[:10]
        assert res[_FLOOD_CULPRIT].reason == "lost" and res[_FLOOD_CULPRIT].index == _FLOOD_CULPRIT
        assert all(v == i for i, v in enumerate(res) if i != _FLOOD_CULPRIT)
    finally:
        job.purge()
