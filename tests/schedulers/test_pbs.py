"""PBS (OpenPBS, Torque, the SLURM wrappers): commands and parsers."""

from __future__ import annotations

import pytest

from elsewhere.schedulers import PBSSyntax, ScriptContext
from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState as T

OPEN = PBSSyntax("openpbs")
TORQUE = PBSSyntax("torque")
WRAP = PBSSyntax("slurm-torque")


def test_variants_differ_in_index_variable_and_status_command():
    assert (OPEN.array_index_var, TORQUE.array_index_var, WRAP.array_index_var) == (
        "PBS_ARRAY_INDEX",
        "PBS_ARRAYID",
        "PBS_ARRAYID",
    )
    assert OPEN.build_status(["1[].s"]) == ["qstat", "-f", "-F", "json", "-x", "-t", "1[].s"]
    assert TORQUE.build_status(["1[].s"]) == ["qstat", "-f", "-t", "1[].s"]
    assert WRAP.build_status(["19", "23"]) == ["qstat", "-f", "19", "23"]
    assert OPEN.build_submit("/s.sh", ["-l", "place=scatter"]) == [
        "qsub",
        "-l",
        "place=scatter",
        "/s.sh",
    ]


def test_parse_submit(captured):
    assert OPEN.parse_submit(captured("pbs/openpbs_qsub_array.txt")) == "1234[].pbs-head"
    assert OPEN.parse_submit(captured("pbs/openpbs_qsub_single.txt")) == "1240.pbs-head"
    assert (
        TORQUE.parse_submit(captured("pbs/torque_qsub_array.txt"))
        == "1234[].torque-head.cluster.org"
    )
    assert WRAP.parse_submit(captured("pbs/slurm_torque_qsub.txt")) == "19"
    with pytest.raises(SchedulerError):
        OPEN.parse_submit("qsub: Unknown queue\n")


def test_openpbs_json_array(captured):
    st = OPEN.parse_status(captured("pbs/openpbs_qstat_f_json_array.txt"))
    assert st["1234[0].pbs-head"].state is T.FINISHED
    one = st["1234[1].pbs-head"]
    assert (one.state, one.exit_code, one.job_id, one.array_index) == (
        T.FAILED,
        3,
        "1234[].pbs-head",
        1,
    )
    assert st["1234[2].pbs-head"].state is T.RUNNING
    assert st["1234[3].pbs-head"].state is T.QUEUED
    assert st["1234[3].pbs-head"].reason.startswith("Not Running: Insufficient amount of resource")
    assert st["1234[].pbs-head"].state is T.RUNNING and st["1234[].pbs-head"].array_index is None


def test_openpbs_json_finished(captured):
    st = OPEN.parse_status(captured("pbs/openpbs_qstat_f_json_finished.txt"))
    killed = st["1235[0].pbs-head"]
    assert (killed.state, killed.exit_code, killed.reason) == (
        T.CANCELLED,
        143,
        "killed by SIGTERM (signal 15: qdel, or a limit)",
    )
    assert (st["1235[1].pbs-head"].state, st["1235[1].pbs-head"].reason) == (T.FAILED, "TIMEOUT")
    assert st["1240.pbs-head"].state is T.FINISHED and st["1240.pbs-head"].array_index is None
    assert (st["1241.pbs-head"].state, st["1241.pbs-head"].reason) == (T.QUEUED, "held")
    assert OPEN.build_accounting(["1235[].pbs-head"]) == OPEN.build_status(["1235[].pbs-head"])


def test_torque_text(captured):
    st = TORQUE.parse_status(captured("pbs/torque_qstat_ft.txt"))
    base = "torque-head.cluster.org"
    assert st[f"1234[0].{base}"].state is T.FINISHED
    assert (st[f"1234[1].{base}"].state, st[f"1234[1].{base}"].exit_code) == (T.FAILED, 3)
    assert st[f"1234[2].{base}"].state is T.RUNNING
    assert st[f"1234[3].{base}"].state is T.CANCELLED
    assert (st[f"1234[4].{base}"].state, st[f"1234[4].{base}"].reason) == (T.FAILED, "TIMEOUT")
    assert st[f"1250.{base}"].state is T.QUEUED
    assert st[f"1234[1].{base}"].job_id == f"1234[].{base}"
    assert TORQUE.build_accounting(["1"]) is None


def test_torque_continuation_lines_are_joined():
    from elsewhere.schedulers.pbs import _parse_text

    jobs = _parse_text("Job Id: 1.s\n    Output_Path = host:/a/b\n\t-0\n    job_state = R\n")
    assert jobs["1.s"]["Output_Path"] == "host:/a/b-0"


def test_slurm_torque_wrapper_output(captured):
    running = WRAP.parse_status(captured("pbs/slurm_torque_qstat_f_running.txt"))
    assert list(running) == ["19"] and running["19"].state is T.RUNNING
    started = WRAP.parse_status(captured("pbs/slurm_torque_qstat_f_all.txt"))
    assert sorted(started) == ["19", "20", "21", "22"]  # array 19: elements under raw SLURM ids
    assert {s.state for s in started.values()} == {T.RUNNING}
    assert {s.array_index for s in started.values()} == {None}
    # after qdel 19: the wrappers show C (no exit status), so cancelled reads as finished
    done = WRAP.parse_status(captured("pbs/slurm_torque_qstat_f_after_qdel.txt"))
    assert {s.state for s in done.values()} == {T.FINISHED} and len(done) == 4


def test_status_ok():
    assert OPEN.status_ok(153, "qstat: Unknown Job Id 1200.pbs-head\n")
    assert WRAP.status_ok(153, "")
    assert not OPEN.status_ok(1, "qstat: cannot connect to server pbs-head (errno=111)\n")


def test_pbs_garbage():
    with pytest.raises(SchedulerError, match="json"):
        OPEN.parse_status("{not json")
    with pytest.raises(SchedulerError, match="Job Id"):
        TORQUE.parse_status("    job_state = R\n")
    assert OPEN.parse_status("") == {}


def test_cancel(captured):
    assert OPEN.build_cancel(["1234[2].pbs-head"]) == ["qdel", "1234[2].pbs-head"]
    assert OPEN.cancel_ok(153, captured("pbs/qdel_unknown.stderr"))
    assert OPEN.cancel_ok(35, captured("pbs/qdel_finished.stderr"))
    assert not OPEN.cancel_ok(1, "qdel: Unauthorized Request  1234.pbs-head\n")
    assert WRAP.cancel_ok(1, "") and not OPEN.cancel_ok(1, "")
    assert not WRAP.cancel_ok(
        1, "", "qdel: Kill job error on job id 19: Access/permission denied\n"
    )


def test_wrapper_cannot_cancel_single_elements():
    assert not WRAP.can_cancel_elements and OPEN.can_cancel_elements
    assert WRAP.build_cancel(["19"]) == ["qdel", "19"]
    with pytest.raises(SchedulerError, match="whole array"):
        WRAP.build_cancel([WRAP.element_id("19", 2)])


def test_max_array_size(captured):
    assert OPEN.parse_max_array_size(captured("pbs/openpbs_qstat_Bf.txt")) == 10000
    assert TORQUE.parse_max_array_size(captured("pbs/torque_qstat_Bf.txt")) == 1000
    assert WRAP.build_max_array_size() is None


def test_element_ids_and_logs():
    assert OPEN.element_id("1234[].pbs-head", 4) == "1234[4].pbs-head"
    assert OPEN.element_id("1240.pbs-head", 0) == "1240.pbs-head"
    assert TORQUE.element_id("7[]", 2) == "7[2]"
    assert WRAP.element_id("19", 2) == "19[2]"
    assert OPEN.log_file("/l", "fit", "1234[].pbs-head", 4) == "/l/fit-1234_4.log"


def test_openpbs_single_element_is_no_array_but_keeps_its_index():
    ctx = ScriptContext(job_name="one", run_line="run", log_dir="/l", array_size=1, array_first=7)
    text = OPEN.render_script(ctx)
    assert "#PBS -J" not in text and "ew_index=${PBS_ARRAY_INDEX:-7}" in text
    assert "#PBS -t 7-7" in TORQUE.render_script(ctx)
