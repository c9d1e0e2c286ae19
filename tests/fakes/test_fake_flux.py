"""The fake Flux runs the real submit -> status -> cancel -> accounting path."""

from __future__ import annotations

import os
import signal

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

from elsewhere.schedulers import FluxSyntax, ScriptContext
from elsewhere.schedulers.flux import decode_f58
from elsewhere.util.states import TaskState as T

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
S = FluxSyntax()


def test_cc_copies_run_every_element(flux):
    ctx = index_writer_context(S, flux.work, fail=4)
    job = submit(S, ctx, flux.work, flux.run)
    assert len(job.split(",")) == 5
    idx = list(range(5))
    states = wait_for_states(
        S, job, idx, flux.run, lambda st: all(s and s.done for s in st.values())
    )
    assert states == {0: T.FINISHED, 1: T.FINISHED, 2: T.FINISHED, 3: T.FINISHED, 4: T.FAILED}
    for i in idx:
        assert (flux.work / f"out.{i}").read_text() == f"{i}\n"
        log = open(S.log_file(ctx.log_dir, ctx.job_name, job, i)).read()
        assert f"index {i} on" in log and f"element {i} done" in log
    history = accounting(S, [job], flux.run)
    assert history[S.element_id(job, 4)].exit_code == 3


def test_first_index_and_cancel(flux):
    ctx = index_writer_context(S, flux.work, size=3, array_first=7, sleep=60)
    job = submit(S, ctx, flux.work, flux.run)
    assert job.endswith("@7")
    wait_until(lambda: all((flux.work / f"out.{i}").exists() for i in (7, 8, 9)))
    one = flux.run(S.build_cancel([S.element_id(job, 8)]))
    assert one.returncode == 0
    states = element_states(S, job, [7, 8, 9], status(S, [job], flux.run))
    assert states == {7: T.RUNNING, 8: T.CANCELLED, 9: T.RUNNING}
    rest = flux.run(S.build_cancel([job]))
    assert rest.returncode == 1 and S.cancel_ok(
        rest.returncode, rest.stderr, rest.stdout
    )  # 8 is inactive
    states = element_states(S, job, [7, 8, 9], status(S, [job], flux.run))
    assert set(states.values()) == {T.CANCELLED}


def test_timeout_and_unknown_ids(flux):
    ctx = index_writer_context(S, flux.work, size=1, sleep=30, walltime_s=1)
    job = submit(S, ctx, flux.work, flux.run)
    wait_for_states(S, job, [0], flux.run, lambda st: st[0] is T.FAILED, timeout=20)
    assert status(S, [job], flux.run)[job].reason == "TIMEOUT"
    gone = flux.run(S.build_status(["ƒ2Fq9aaaaa"]))
    assert gone.returncode == 1 and S.status_ok(gone.returncode, gone.stderr)


def test_communicating_job_goes_through_flux_batch_and_run(flux):
    ctx = ScriptContext(
        job_name="mpi",
        run_line=f"sh -c 'echo ranks > {flux.work}/mpi.out'",
        log_dir=str(flux.work / "logs"),
        communicating=True,
        ranks=2,
    )
    job = submit(S, ctx, flux.work, flux.run)
    assert "," not in job
    wait_for_states(S, job, [0], flux.run, lambda st: st[0] is T.FINISHED)
    assert (flux.work / "mpi.out").read_text() == "ranks\n"
    assert (flux.work / "logs" / f"mpi-{decode_f58(job)}.log").exists()


def test_a_vanished_runner_is_lost(flux):
    ctx = index_writer_context(S, flux.work, size=1, sleep=60)
    job = submit(S, ctx, flux.work, flux.run)
    key = str(decode_f58(job))
    wait_until(lambda: flux.queue()["jobs"][key]["elements"]["0"].get("child_pid"))
    (pid,) = flux.running_pids()
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: status(S, [job], flux.run)[job].state is T.FAILED, timeout=10)
    assert "lost" in status(S, [job], flux.run)[job].reason
    child = flux.queue()["jobs"][key]["elements"]["0"]["child_pid"]
    wait_until(
        lambda: not os.path.exists(f"/proc/{child}"), timeout=5
    )  # the fake node took it along
