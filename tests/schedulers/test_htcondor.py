"""HTCondor commands and parsers, on output written from the HTCondor documentation."""

from __future__ import annotations

import pytest

from elsewhere.schedulers import HTCondorSyntax, ScriptContext
from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState as T

S = HTCondorSyntax()
ATTRS = [
    "ClusterId",
    "ProcId",
    "JobStatus",
    "ExitCode",
    "ExitBySignal",
    "ExitSignal",
    "ElsewhereIndex",
    "HoldReason",
    "RemoveReason",
]


def test_submit_runs_the_self_submitting_script():
    assert S.build_submit("/j/s.sh", ["-a", "request_memory = 8000"]) == [
        "bash",
        "/j/s.sh",
        "--elsewhere-submit",
        "-a",
        "request_memory = 8000",
    ]


def test_parse_submit_keeps_a_first_index_other_than_zero(captured):
    assert S.parse_submit(captured("htcondor/condor_submit.txt")) == "812"
    assert S.parse_submit(captured("htcondor/condor_submit_elsewhere_first5.txt")) == "813@5"
    with pytest.raises(SchedulerError):
        S.parse_submit("ERROR: Executable file /x does not exist\n")


def test_element_ids_count_procs_from_zero():
    assert S.element_id("812", 3) == "812.3"
    assert S.element_id("813@5", 7) == "813.2"
    assert S.log_file("/l", "fit", "813@5", 7) == "/l/fit-813_2.log"


def test_status_and_accounting_commands():
    assert S.build_status(["812", "813@5"]) == ["condor_q", "812", "813", "-af:t", *ATTRS]
    assert S.build_accounting(["812", "813@5"]) == [
        "condor_history",
        "-constraint",
        "ClusterId == 812 || ClusterId == 813",
        "-af:t",
        *ATTRS,
    ]


def test_condor_q(captured):
    st = S.parse_status(captured("htcondor/condor_q_af_t.txt"))
    assert (st["812.0"].state, st["812.0"].exit_code, st["812.0"].native_state) == (
        T.FINISHED,
        0,
        "Completed",
    )
    assert (st["812.1"].state, st["812.1"].exit_code) == (T.FAILED, 3)
    assert st["812.2"].state is T.RUNNING
    assert st["812.3"].state is T.QUEUED and "Permission denied" in st["812.3"].reason
    assert st["812.4"].state is T.QUEUED
    assert (st["813.0"].state, st["813.0"].array_index, st["813.0"].job_id) == (T.RUNNING, 5, "813")


def test_condor_history(captured):
    st = S.parse_accounting(captured("htcondor/condor_history_af_t.txt"))
    assert (st["812.4"].state, st["812.4"].exit_code, st["812.4"].reason) == (
        T.FAILED,
        137,
        "signal 9",
    )
    assert st["812.3"].state is T.CANCELLED and "condor_rm" in st["812.3"].reason
    assert (st["812.2"].state, st["812.2"].reason) == (T.FAILED, "TIMEOUT")
    assert (st["812.1"].state, st["812.0"].state) == (T.FAILED, T.FINISHED)


def test_history_first_line_wins():
    text = "5\t0\t4\t0\tfalse\tundefined\t0\tundefined\tundefined\n5\t0\t3\tundefined\tundefined\tundefined\t0\tundefined\tx\n"
    assert S.parse_accounting(text)["5.0"].state is T.FINISHED


def test_garbage_and_unknown_status():
    with pytest.raises(SchedulerError):
        S.parse_status("-- Schedd: fake : <127.0.0.1>\n")
    assert S.parse_status("5\t0\t9\tundefined\tundefined\tundefined\t0\n")["5.0"].state is None


def test_cancel(captured):
    assert S.build_cancel(["812", "813.2", "814@5"]) == ["condor_rm", "812", "813.2", "814"]
    assert S.cancel_ok(0, "", captured("htcondor/condor_rm_cluster.stdout"))
    assert S.cancel_ok(1, captured("htcondor/condor_rm_unknown.stderr"))
    assert S.cancel_ok(
        1,
        captured("htcondor/condor_rm_proc_unknown.stderr"),
        captured("htcondor/condor_rm_proc.stdout"),
    )
    assert not S.cancel_ok(1, "ERROR: Can't find address of local schedd\n")


def test_max_array_size(captured):
    assert S.build_max_array_size() == ["condor_config_val", "MAX_JOBS_PER_SUBMISSION"]
    assert S.parse_max_array_size(captured("htcondor/condor_config_val.txt")) == 20000
    assert S.parse_max_array_size("") is None


def test_template_submit_description():
    ctx = ScriptContext(
        job_name="fit",
        run_line="r",
        log_dir="/l",
        array_size=3,
        array_first=4,
        max_running=2,
        mem_per_core_mb=1000,
        cores_per_task=2,
        walltime_s=600,
        account="grp",
    )
    text = S.render_script(ctx)
    for line in (
        "queue 3",
        "+ElsewhereIndex = $(Process) + 4",
        "request_cpus = 2",
        "request_memory = 2000",
        "max_materialize = 2",
        "accounting_group = grp",
        "output = /l/fit-$(Cluster)_$(Process).log",
        "EnteredCurrentStatus > 600",
        "export ELSEWHERE_ARRAY_INDEX=$(( ${2:-0} + 4 ))",
    ):
        assert line in text, line
