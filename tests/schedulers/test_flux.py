"""Flux commands and parsers, on output written from the flux-core documentation."""

from __future__ import annotations

import pytest

from elsewhere.schedulers import FluxSyntax, ScriptContext
from elsewhere.schedulers.flux import JOBS_FORMAT, decode_f58, encode_f58
from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState as T

S = FluxSyntax()


def test_f58_round_trip():
    for value in (0, 1, 57, 58, 123456789, 2**63):
        assert decode_f58(encode_f58(value)) == value
        assert decode_f58(encode_f58(value, prefix="f")) == value
    assert decode_f58("1234") == 1234 and decode_f58("0x10") == 16
    for bad in ("ƒ0OIl", "x12", ""):
        with pytest.raises(ValueError):
            decode_f58(bad)


def test_parse_submit_orders_ids_and_keeps_the_first_index(captured):
    job = S.parse_submit(captured("flux/submit_cc.txt"))
    assert job == "ƒ2Fq9dKH9b,ƒ2Fq9dKH9c,ƒ2Fq9dKH9d,ƒ2Fq9dKH9e"
    assert S.element_id(job, 2) == "ƒ2Fq9dKH9d"
    shuffled = S.parse_submit(captured("flux/submit_cc_ascii_first5.txt"))
    assert shuffled == "f2Fq9dNqj1,f2Fq9dNqj2,f2Fq9dNqj3@5"
    assert S.element_id(shuffled, 5) == "f2Fq9dNqj1" and S.element_id(shuffled, 7) == "f2Fq9dNqj3"
    with pytest.raises(IndexError):
        S.element_id(shuffled, 8)
    assert S.parse_submit(captured("flux/batch.txt")) == "ƒ2Fq9eZS7K"


def test_parse_submit_refuses_garbage_and_short_counts():
    with pytest.raises(SchedulerError):
        S.parse_submit("flux-submit: ERROR: Unable to connect to Flux\n")
    with pytest.raises(SchedulerError, match="3 job ids for 4 copies"):
        S.parse_submit("elsewhere-array: 0-3\nƒ2\nƒ3\nƒ4\n")


def test_status_command_lists_every_element():
    cmd = S.build_status(["ƒa,ƒb@3", "ƒc"])
    assert cmd == ["flux", "jobs", "-a", "-n", "-o", JOBS_FORMAT, "ƒa", "ƒb", "ƒc"]
    assert S.build_accounting(["ƒa"]) == S.build_status(["ƒa"])
    assert S.build_cancel(["ƒa,ƒb", "ƒc"]) == ["flux", "cancel", "ƒa", "ƒb", "ƒc"]


def test_flux_jobs(captured):
    st = S.parse_status(captured("flux/jobs_format.txt"))
    assert (st["ƒ2Fq9dKH9b"].state, st["ƒ2Fq9dKH9b"].exit_code) == (T.FINISHED, 0)
    assert (st["ƒ2Fq9dKH9c"].state, st["ƒ2Fq9dKH9c"].exit_code) == (T.FAILED, 3)
    assert st["ƒ2Fq9dKH9d"].state is T.RUNNING and st["ƒ2Fq9dKH9e"].state is T.QUEUED
    cancelled = st["ƒ2Fq9eZS7K"]
    assert (cancelled.state, cancelled.exit_code, cancelled.reason) == (
        T.CANCELLED,
        -128,
        "cancel: canceled by alice",
    )
    assert (st["ƒ2Fq9eZS7L"].state, st["ƒ2Fq9eZS7L"].reason) == (T.FAILED, "TIMEOUT")
    assert st["ƒ2Fq9eZS7M"].state is T.QUEUED
    old = S.parse_status(captured("flux/jobs_format_old_status.txt"))
    assert [s.state for s in old.values()] == [T.FINISHED, T.RUNNING, T.QUEUED]


def test_status_ok_cancel_ok_and_garbage(captured):
    assert S.status_ok(1, captured("flux/jobs_unknown.stderr"))
    assert not S.status_ok(
        1, "flux-jobs: ERROR: Unable to connect to Flux: broker socket /run/flux/local\n"
    )
    assert S.cancel_ok(1, captured("flux/cancel_inactive.stderr"))
    assert not S.cancel_ok(1, "flux-cancel: ERROR: Operation not permitted\n")
    with pytest.raises(SchedulerError):
        S.parse_status("JOBID USER NAME\n")
    with pytest.raises(SchedulerError):
        S.parse_status("notanid|RUN|||\n")


def test_logs_use_decimal_ids():
    job = "ƒ2Fq9dKH9b,ƒ2Fq9dKH9c"
    assert S.log_file("/l", "fit", job, 1) == f"/l/fit-{decode_f58('ƒ2Fq9dKH9c')}_1.log"
    ctx = ScriptContext(job_name="fit", run_line="r", log_dir="/l", array_size=2)
    assert "--output='/l/fit-{{id.dec}}_{cc}.log'" in S.render_script(ctx)
