"""The fake LSF runs the real submit -> status -> cancel -> accounting path."""

from __future__ import annotations

import os

import pytest
from scheduler_contract import (
    accounting,
    element_states,
    index_writer_context,
    status,
    submit,
    wait_for_states,
    wait_until,
)

from elsewhere.schedulers import LSFSyntax
from elsewhere.util.states import TaskState as T

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
S = LSFSyntax()
IDX = [1, 2, 3, 4, 5]


def test_array_runs_every_element_and_reports_exit_codes(lsf):
    ctx = index_writer_context(S, lsf.work, fail=2, array_first=1)
    job = submit(S, ctx, lsf.work, lsf.run)
    states = wait_for_states(
        S, job, IDX, lsf.run, lambda st: all(s and s.done for s in st.values())
    )
    assert states == {1: T.FINISHED, 2: T.FAILED, 3: T.FINISHED, 4: T.FINISHED, 5: T.FINISHED}
    for i in IDX:
        assert (lsf.work / f"out.{i}").read_text() == f"{i}\n"
        log = (lsf.work / "logs" / f"ewtest-{job}_{i}.log").read_text()
        assert log == open(S.log_file(ctx.log_dir, ctx.job_name, job, i)).read()
        assert f"elsewhere: job {job} index {i}" in log and f"element {i} done" in log
    final = status(S, [job], lsf.run)
    assert final[S.element_id(job, 2)].exit_code == 3


def test_max_running_holds_the_rest_pending(lsf):
    ctx = index_writer_context(S, lsf.work, array_first=1, max_running=2, sleep=2)
    job = submit(S, ctx, lsf.work, lsf.run)
    states = element_states(S, job, IDX, status(S, [job], lsf.run))
    assert sorted(states.values(), key=str).count(T.RUNNING) <= 2
    assert list(states.values()).count(T.QUEUED) >= 3
    found = status(S, [job], lsf.run)
    assert "limit" in found[S.element_id(job, 5)].reason


def test_cancel_kills_running_elements_and_finished_jobs_move_to_history(lsf):
    ctx = index_writer_context(S, lsf.work, array_first=1, max_running=2, sleep=60)
    job = submit(S, ctx, lsf.work, lsf.run)
    wait_until(lambda: (lsf.work / "out.1").exists() and (lsf.work / "out.2").exists())
    pids = lsf.running_pids()
    assert len(pids) == 2
    one = lsf.run(S.build_cancel([S.element_id(job, 1)]))
    assert S.cancel_ok(one.returncode, one.stderr, one.stdout)
    rest = lsf.run(S.build_cancel([job]))
    assert S.cancel_ok(rest.returncode, rest.stderr, rest.stdout)
    again = lsf.run(S.build_cancel([job]))
    assert again.returncode != 0 and S.cancel_ok(again.returncode, again.stderr, again.stdout)
    states = element_states(S, job, IDX, status(S, [job], lsf.run))
    assert set(states.values()) == {T.CANCELLED}
    wait_until(lambda: not any(_alive(p) for p in pids), timeout=10)
    assert not (lsf.work / "out.5").exists()  # 3 took the slot of 1; 4 and 5 never started
    # after ELSEWHERE_FAKE_KEEP_S the queue view forgets them; bhist still knows
    wait_until(lambda: not status(S, [job], lsf.run), timeout=30)
    history = accounting(S, [job], lsf.run)
    assert element_states(S, job, IDX, history) == dict.fromkeys(IDX, T.CANCELLED)


def test_walltime_ends_in_timeout(lsf):
    ctx = index_writer_context(S, lsf.work, array_first=1, size=1, sleep=30)
    job = submit(S, ctx, lsf.work, lsf.run, extra=["-W", "0:0"])
    states = wait_for_states(S, job, [1], lsf.run, lambda st: bool(st[1] and st[1].done))
    assert states[1] is T.FAILED
    assert status(S, [job], lsf.run)[S.element_id(job, 1)].reason == "TIMEOUT"


def test_unknown_jobs_and_limits(lsf):
    gone = lsf.run(S.build_status(["999"]))
    assert gone.returncode == 255 and S.status_ok(gone.returncode, gone.stderr)
    assert S.parse_status(gone.stdout) == {}
    limit = lsf.run(S.build_max_array_size())
    assert S.parse_max_array_size(limit.stdout) == 1000
    queues = lsf.run(["bqueues"])
    assert queues.returncode == 0 and "normal" in queues.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
