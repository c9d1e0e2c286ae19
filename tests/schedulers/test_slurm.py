"""SLURM commands and parsers, on output captured from SLURM 22.05 here and its docs."""

from __future__ import annotations

import pytest

from elsewhere.schedulers import SlurmSyntax
from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState as T

S = SlurmSyntax()


def test_submit_command_puts_extra_args_before_the_script():
    assert S.build_submit("/j/s.sh", ["--constraint=x"]) == [
        "sbatch",
        "--parsable",
        "--constraint=x",
        "/j/s.sh",
    ]


def test_parse_submit(captured):
    assert S.parse_submit(captured("slurm/sbatch_parsable.txt")) == "1"
    assert S.parse_submit("1234;cluster2\n") == "1234"
    assert S.parse_submit("Submitted batch job 77\n") == "77"
    with pytest.raises(SchedulerError, match="sbatch output") as info:
        S.parse_submit("sbatch: error: something\n")
    assert "sbatch: error" in info.value.stderr


def test_status_command_is_one_call_for_all_jobs():
    assert S.build_status(["1", "7"]) == [
        "squeue",
        "-h",
        "-t",
        "all",
        "-j",
        "1,7",
        "-o",
        "%i|%T|%r|%F|%K",
    ]


def test_squeue_array_with_collapsed_pending_range(captured):
    st = S.parse_status(captured("slurm/squeue_array_mixed.txt"))
    assert sorted(st) == ["1_0", "1_1", "1_2", "1_3", "1_4", "1_5"]
    assert st["1_1"].state is T.FAILED and st["1_1"].reason == "NonZeroExitCode"
    assert st["1_0"].state is T.RUNNING and st["1_0"].reason == ""
    for i in (3, 4, 5):
        assert st[f"1_{i}"].state is T.QUEUED
        assert st[f"1_{i}"].reason == "JobArrayTaskLimit"
        assert st[f"1_{i}"].native_state == "PENDING"
        assert (st[f"1_{i}"].job_id, st[f"1_{i}"].array_index) == ("1", i)


def test_squeue_single_pending_element_is_not_collapsed(captured):
    st = S.parse_status(captured("slurm/squeue_array_later.txt"))
    assert (st["1_5"].state, st["1_5"].array_index) == (T.QUEUED, 5)
    assert [st[f"1_{i}"].state for i in (0, 2, 3, 4)] == [
        T.FINISHED,
        T.FINISHED,
        T.RUNNING,
        T.RUNNING,
    ]


def test_squeue_after_cancel_and_single_jobs(captured):
    st = S.parse_status(captured("slurm/squeue_after_cancel.txt"))
    assert st["1_4"].state is T.CANCELLED
    assert st["1_0"].state is T.FINISHED
    both = S.parse_status(captured("slurm/squeue_single_and_array.txt"))
    assert (
        both["7"].state is T.RUNNING and both["7"].array_index is None and both["7"].job_id == "7"
    )


def test_squeue_timeout(captured):
    st = S.parse_status(captured("slurm/squeue_timeout.txt"))
    assert {k: (v.state, v.reason) for k, v in st.items()} == {
        "92_0": (T.FAILED, "TimeLimit"),
        "92_1": (T.FAILED, "TimeLimit"),
    }


def test_unknown_state_is_none_not_a_crash():
    st = S.parse_status("5|WEIRD_NEW_STATE|None|5|N/A\n")
    assert st["5"].state is None and st["5"].native_state == "WEIRD_NEW_STATE"


@pytest.mark.parametrize("line", ["garbage", "1|RUNNING|None", "1_x|RUNNING|None|1|[a-b]"])
def test_squeue_garbage_raises_with_the_text(line):
    with pytest.raises(SchedulerError) as info:
        S.parse_status(line + "\n")
    assert line in info.value.stderr


def test_status_ok_when_the_jobs_have_left(captured):
    assert S.status_ok(1, captured("slurm/squeue_invalid_job.stderr"))
    assert not S.status_ok(1, "slurm_load_jobs error: Unable to contact slurm controller")


def test_sacct(captured):
    assert S.build_accounting(["1234", "1240"]) == [
        "sacct",
        "-X",
        "-P",
        "-n",
        "-j",
        "1234,1240",
        "-o",
        "JobID,State,ExitCode,Reason",
    ]
    st = S.parse_accounting(captured("slurm/sacct_array.txt"))
    assert (st["1234_0"].state, st["1234_0"].exit_code) == (T.FINISHED, 0)
    assert (st["1234_1"].state, st["1234_1"].exit_code) == (T.FAILED, 3)
    assert st["1234_2"].state is T.CANCELLED and st["1234_2"].reason == "cancelled by 1000"
    assert st["1234_2"].exit_code == 128 + 15
    assert (st["1234_3"].state, st["1234_3"].reason) == (T.FAILED, "TimeLimit")
    assert (st["1234_4"].state, st["1234_4"].reason) == (T.FAILED, "OutOfMemory")
    assert [st[f"1234_{i}"].state for i in range(5, 10)] == [T.QUEUED] * 5
    assert (st["1240"].state, st["1240"].reason, st["1240"].exit_code) == (T.FAILED, "NodeDown", 1)


def test_sacct_real(captured):
    done = S.parse_accounting(captured("slurm/sacct_real_finished.txt"))
    assert done["111_0"].state is T.CANCELLED and done["111_0"].reason == "cancelled by 0"
    assert (done["120_1"].state, done["120_1"].exit_code) == (T.FAILED, 3)
    assert (done["120_2"].state, done["120_2"].reason) == (T.FINISHED, "")  # stale reason dropped
    assert done["128"].state is T.FINISHED and done["128"].array_index is None
    pending = S.parse_accounting(captured("slurm/sacct_real_pending.txt"))
    assert [pending[f"129_{i}"].state for i in range(4)] == [
        T.RUNNING,
        T.QUEUED,
        T.QUEUED,
        T.QUEUED,
    ]
    cancelled = S.parse_accounting(captured("slurm/sacct_real_cancelled.txt"))
    assert {cancelled[f"129_{i}"].state for i in range(4)} == {T.CANCELLED}


def test_sacct_steps_are_skipped_and_reason_defaults_to_the_state():
    st = S.parse_accounting("9_1|OUT_OF_MEMORY|0:125|None\n9_1.batch|OUT_OF_MEMORY|0:125|\n")
    assert list(st) == ["9_1"] and st["9_1"].reason == "OUT_OF_MEMORY"


def test_jobcomp_accounting(captured):
    syntax = SlurmSyntax(accounting="jobcomp", jobcomp_file="/var/log/slurm/jobcomp.log")
    cmd = syntax.build_accounting(["1", "7"])
    assert cmd == [
        "grep",
        "-h",
        "-E",
        "(^| )(JobId|ArrayJobId)=(1|7) ",
        "/var/log/slurm/jobcomp.log",
    ]
    assert syntax.accounting_ok(1, "") and not syntax.accounting_ok(2, "grep: no such file")
    st = syntax.parse_accounting(captured("slurm/jobcomp_grep.txt"))
    assert (st["1_1"].state, st["1_1"].exit_code) == (T.FAILED, 3)
    assert st["1_4"].state is T.CANCELLED
    assert [st[f"1_{i}"].state for i in (0, 2, 3, 5)] == [T.FINISHED] * 4
    assert (st["7"].state, st["7"].reason, st["7"].array_index) == (T.FAILED, "TIMEOUT", None)
    timeout = syntax.parse_accounting(captured("slurm/jobcomp_timeout.txt"))
    assert {k: v.state for k, v in timeout.items()} == {"92_0": T.FAILED, "92_1": T.FAILED}
    assert SlurmSyntax(accounting="none").build_accounting(["1"]) is None


def test_cancel(captured):
    assert S.build_cancel(["1", "2_3"]) == ["scancel", "1", "2_3"]
    assert S.cancel_ok(0, "")
    assert S.cancel_ok(1, captured("slurm/scancel_invalid.stderr"))
    assert S.cancel_ok(1, captured("slurm/scancel_completed.stderr"))
    assert not S.cancel_ok(
        1, "scancel: error: Unable to contact slurm controller (connect failure)\n"
    )
    assert not S.cancel_ok(1, "")


def test_max_array_size(captured):
    assert S.build_max_array_size() == ["scontrol", "show", "config"]
    assert S.parse_max_array_size(captured("slurm/scontrol_show_config.txt")) == 1001
    assert S.parse_max_array_size("nothing here") is None


def test_ids_and_logs():
    assert S.element_id("123", 4) == "123_4"
    assert S.log_file("/l", "fit", "123", 4) == "/l/fit-123_4.log"
    assert S.log_file("/l", "fit", "123", None) == "/l/fit-123.log"
