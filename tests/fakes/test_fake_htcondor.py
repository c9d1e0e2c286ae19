"""The fake HTCondor runs the real submit -> status -> cancel -> accounting path."""

from __future__ import annotations

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

from elsewhere.schedulers import HTCondorSyntax
from elsewhere.util.states import TaskState as T

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
S = HTCondorSyntax()


def test_array_runs_every_element_then_leaves_for_history(htcondor):
    ctx = index_writer_context(S, htcondor.work, fail=3)
    job = submit(S, ctx, htcondor.work, htcondor.run)
    idx = list(range(5))
    states = wait_for_states(
        S, job, idx, htcondor.run, lambda st: all(s and s.done for s in st.values())
    )
    assert states == {0: T.FINISHED, 1: T.FINISHED, 2: T.FINISHED, 3: T.FAILED, 4: T.FINISHED}
    for i in idx:
        assert (htcondor.work / f"out.{i}").read_text() == f"{i}\n"
        log = (htcondor.work / "logs" / f"ewtest-{job}_{i}.log").read_text()
        assert f"index {i}" in log and f"element {i} done" in log
    wait_until(lambda: not status(S, [job], htcondor.run), timeout=30)
    history = accounting(S, [job], htcondor.run)
    assert element_states(S, job, idx, history)[3] is T.FAILED
    assert history[S.element_id(job, 3)].exit_code == 3


def test_first_index_other_than_zero(htcondor):
    ctx = index_writer_context(S, htcondor.work, size=3, array_first=10)
    job = submit(S, ctx, htcondor.work, htcondor.run)
    assert job.endswith("@10")
    wait_for_states(
        S, job, [10, 11, 12], htcondor.run, lambda st: all(s is T.FINISHED for s in st.values())
    )
    assert sorted(p.name for p in htcondor.work.glob("out.*")) == ["out.10", "out.11", "out.12"]
    found = status(S, [job], htcondor.run)
    assert found[S.element_id(job, 12)].array_index == 12
    assert S.log_file(ctx.log_dir, ctx.job_name, job, 12).endswith("_2.log")


def test_max_running_cancel_and_removed_state(htcondor, monkeypatch):
    # the cancelled elements must still be in the queue view when it is read at the end, however
    # slow the machine: kept there a minute (the fixture's 2 s suits the tests of leaving it)
    monkeypatch.setenv("ELSEWHERE_FAKE_KEEP_S", "60")
    ctx = index_writer_context(S, htcondor.work, max_running=2, sleep=60)
    job = submit(S, ctx, htcondor.work, htcondor.run)
    wait_until(lambda: (htcondor.work / "out.1").exists())
    states = element_states(S, job, range(5), status(S, [job], htcondor.run))
    assert (
        list(states.values()).count(T.RUNNING) == 2 and list(states.values()).count(T.QUEUED) == 3
    )
    one = htcondor.run(S.build_cancel([S.element_id(job, 0)]))
    assert one.returncode == 0 and S.cancel_ok(one.returncode, one.stderr, one.stdout)
    rest = htcondor.run(S.build_cancel([job]))
    assert S.cancel_ok(rest.returncode, rest.stderr, rest.stdout)
    again = htcondor.run(S.build_cancel([job]))
    assert again.returncode == 1 and S.cancel_ok(again.returncode, again.stderr, again.stdout)
    found = status(S, [job], htcondor.run)
    assert {s.state for s in found.values()} == {T.CANCELLED}
    assert "condor_rm" in found[S.element_id(job, 0)].reason


def test_walltime_remove_reads_as_timeout(htcondor):
    ctx = index_writer_context(S, htcondor.work, size=1, sleep=30, walltime_s=1)
    job = submit(S, ctx, htcondor.work, htcondor.run)
    states = wait_for_states(
        S, job, [0], htcondor.run, lambda st: bool(st[0] and st[0].done), timeout=20
    )
    assert states[0] is T.FAILED
    assert status(S, [job], htcondor.run)[S.element_id(job, 0)].reason == "TIMEOUT"


def test_submit_errors_and_limits(htcondor):
    bad = htcondor.run(["condor_submit"], stdin="executable = /no/such/file\nqueue 1\n")
    assert bad.returncode == 1 and "does not exist" in bad.stderr
    assert S.parse_max_array_size(htcondor.run(S.build_max_array_size()).stdout) == 20000
    assert htcondor.run(["condor_q"]).returncode == 0
