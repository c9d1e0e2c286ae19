"""LSF commands and parsers, on output written from the LSF 10.1 documentation."""

from __future__ import annotations

import pytest

from elsewhere.schedulers import LSFSyntax, ScriptContext
from elsewhere.schedulers.lsf import _unwrap
from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState as T

S = LSFSyntax()


def test_submit_reads_the_script_on_stdin():
    cmd = S.build_submit("/j/s.sh", ["-q", "long"])
    assert cmd == ["sh", "-c", 'exec bsub "$@" < "$0"', "/j/s.sh", "-q", "long"]


def test_parse_submit(captured):
    assert S.parse_submit(captured("lsf/bsub_queue.txt")) == "4711"
    assert S.parse_submit(captured("lsf/bsub_default_queue.txt")) == "4712"
    with pytest.raises(SchedulerError):
        S.parse_submit("Bad job array index list. Job not submitted.\n")


def test_status_command():
    cmd = S.build_status(["4711", "4712"])
    assert cmd[:4] == ["bjobs", "-a", "-noheader", "-o"]
    assert cmd[4] == "jobid jobindex stat exit_code exit_reason pend_reason delimiter='|'"
    assert cmd[5:] == ["4711", "4712"]


def test_bjobs(captured):
    st = S.parse_status(captured("lsf/bjobs_o_array.txt"))
    assert (st["4711[1]"].state, st["4711[1]"].exit_code) == (T.FINISHED, 0)
    assert (st["4711[2]"].state, st["4711[2]"].exit_code) == (T.FAILED, 3)
    assert st["4711[3]"].state is T.RUNNING
    assert st["4711[4]"].state is T.QUEUED and "limit" in st["4711[4]"].reason
    assert (st["4711[4]"].job_id, st["4711[4]"].array_index) == ("4711", 4)
    assert st["4712"].state is T.CANCELLED and st["4712"].array_index is None
    assert (st["4713[2]"].state, st["4713[2]"].reason) == (T.FAILED, "TIMEOUT")
    assert (st["4713[3]"].state, st["4713[3]"].reason) == (T.FAILED, "OUT_OF_MEMORY")
    assert st["4714"].state is T.QUEUED
    assert st["4715"].state is T.RUNNING


def test_bjobs_status_ok_and_garbage(captured):
    assert S.status_ok(255, captured("lsf/bjobs_not_found.stderr"))
    assert not S.status_ok(255, "LSF is down. Please wait ...\n")
    with pytest.raises(SchedulerError):
        S.parse_status("JOBID USER STAT\n")


def test_bhist(captured):
    assert S.build_accounting(["4711"]) == ["bhist", "-l", "-a", "4711"]
    st = S.parse_accounting(captured("lsf/bhist_l_array.txt"))
    assert (st["4711[1]"].state, st["4711[1]"].exit_code) == (T.FINISHED, 0)
    assert (st["4711[2]"].state, st["4711[2]"].exit_code) == (T.FAILED, 3)
    assert (st["4711[3]"].state, st["4711[3]"].exit_code) == (T.CANCELLED, 130)
    assert (st["4711[4]"].state, st["4711[4]"].reason) == (T.FAILED, "TIMEOUT")
    assert st["4711[5]"].state is T.CANCELLED  # killed while pending


def test_unwrap_joins_lines_split_at_80_columns():
    text = (
        "Mon Dec  2 13:00:15: Completed <exit>; TERM_RUNLIMIT: job killed after reaching\n"
        + " " * 21
        + " LSF run time limit."
    )
    assert _unwrap(text).endswith("reaching LSF run time limit.")


def test_bhist_of_active_jobs():
    pend = S.parse_accounting(
        "Job <5>, Job Name <x>\nMon Dec  2 12:00:00: Submitted from host <a>;\n"
    )
    assert pend["5"].state is T.QUEUED
    run = S.parse_accounting("Job <5[2]>, Job Name <x>\nMon Dec  2 12:00:00: Starting (Pid 1);\n")
    assert run["5[2]"].state is T.RUNNING


def test_cancel(captured):
    assert S.build_cancel(["4711[3]", "4712"]) == ["bkill", "4711[3]", "4712"]
    assert S.cancel_ok(0, "", captured("lsf/bkill_running.stdout"))
    assert S.cancel_ok(255, captured("lsf/bkill_finished.stderr"))
    assert S.cancel_ok(
        255, captured("lsf/bkill_unknown.stderr"), captured("lsf/bkill_running.stdout")
    )
    assert not S.cancel_ok(255, "Job <4711>: User permission denied\n")


def test_max_array_size_ids_logs_walltime(captured):
    assert S.build_max_array_size() == ["bparams", "-l"]
    assert S.parse_max_array_size(captured("lsf/bparams_l.txt")) == 10000
    assert S.element_id("4711", 3) == "4711[3]"
    assert S.log_file("/l", "fit", "4711", 3) == "/l/fit-4711_3.log"
    ctx = ScriptContext(
        job_name="fit", run_line="r", log_dir="/l", array_first=1, array_size=3, walltime_s=5401
    )
    text = S.render_script(ctx)
    assert "#BSUB -W 1:31" in text and '#BSUB -J "fit[1-3]"' in text and "%J_%I.log" in text
