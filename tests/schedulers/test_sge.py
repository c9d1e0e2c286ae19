"""Grid Engine commands and parsers, on output captured from SGE 8.1.9 here."""

from __future__ import annotations

import re

import pytest

from elsewhere.schedulers import SGESyntax
from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState as T

S = SGESyntax()


def test_submit(captured):
    assert S.build_submit("/j/s.sh", ["-l", "h=node1"]) == [
        "qsub",
        "-terse",
        "-l",
        "h=node1",
        "/j/s.sh",
    ]
    assert S.parse_submit(captured("sge/qsub_terse_array.txt")) == "3"
    assert S.parse_submit("5\n") == "5"
    assert S.parse_submit(captured("sge/qsub_plain.txt")) == "6"
    assert S.parse_submit(captured("sge/qsub_plain_array.txt")) == "7"
    with pytest.raises(SchedulerError):
        S.parse_submit("Unable to run job: denied: host is no submit host.\n")


def test_qstat_xml_running_tasks_and_pending_range(captured):
    assert S.build_status(["3"]) == ["qstat", "-xml"]
    st = S.parse_status(captured("sge/qstat_xml_array.txt"))
    assert sorted(st) == ["3.1", "3.3", "3.4", "3.5", "3.6"]
    assert st["3.1"].state is T.RUNNING and st["3.3"].state is T.RUNNING
    assert [st[f"3.{i}"].state for i in (4, 5, 6)] == [T.QUEUED] * 3
    assert (st["3.4"].job_id, st["3.4"].array_index, st["3.4"].native_state) == ("3", 4, "qw")


def test_qstat_xml_after_qdel(captured):
    st = S.parse_status(captured("sge/qstat_xml_after_qdel.txt"))
    assert sorted(st) == ["3.4", "3.6"] and {s.state for s in st.values()} == {T.RUNNING}


def test_qstat_xml_hold_and_error(captured):
    st = S.parse_status(captured("sge/qstat_xml_hold_error.txt"))
    assert (
        st["5"].state is T.FAILED
        and st["5"].reason == "error state Eqw"
        and st["5"].array_index is None
    )
    assert [st[f"4.{i}"].state for i in (1, 2, 3)] == [T.QUEUED] * 3
    assert st["4.1"].reason == "held"


@pytest.mark.parametrize(
    "letters, state",
    [
        ("dr", T.CANCELLED),
        ("Rr", T.RUNNING),
        ("hRwq", T.QUEUED),
        ("EhRqw", T.FAILED),
        ("dRqw", T.CANCELLED),
        ("tS", T.RUNNING),
        ("Z", None),
    ],
)
def test_state_letters(letters, state):
    assert S.state_of(letters) is state


def test_qstat_garbage(captured):
    assert S.parse_status("") == {}
    with pytest.raises(SchedulerError, match="qstat -xml"):
        S.parse_status("<job_info><unclosed>")
    with pytest.raises(SchedulerError):
        S.parse_status("<job_info><job_list><JB_job_number>x</JB_job_number></job_list></job_info>")


def test_qacct(captured):
    assert S.build_accounting(["3"]) == ["qacct", "-j", "3"]
    loop = S.build_accounting(["6", "999", "7"])
    assert loop[:2] == ["sh", "-c"] and "for j in 6 999 7" in loop[2]
    st = S.parse_accounting(captured("sge/qacct_array.txt"))
    assert sorted(st) == [
        "3.1",
        "3.2",
        "3.3",
        "3.4",
        "3.6",
    ]  # 3.5 was deleted while pending: never ran
    assert (st["3.1"].state, st["3.1"].exit_code) == (T.FINISHED, 0)
    assert (st["3.2"].state, st["3.2"].exit_code) == (T.FAILED, 3)
    assert st["3.3"].state is T.FAILED and st["3.3"].exit_code == 137
    assert st["3.3"].reason == "killed by SIGKILL (signal 9: qdel, or a limit such as h_rt)"
    # a task that crashed its process: no qdel or limit does that
    crashed = re.sub(r"(?m)^exit_status +3 *$", "exit_status  139", captured("sge/qacct_array.txt"), count=1)
    assert S.parse_accounting(crashed)["3.2"].reason == "killed by SIGSEGV (signal 11: a crash)"
    single = S.parse_accounting(captured("sge/qacct_single.txt"))
    assert single["6"].state is T.FINISHED and single["6"].array_index is None
    loop_out = S.parse_accounting(captured("sge/qacct_loop.stdout"))
    assert sorted(loop_out) == ["6", "7.1", "7.2"]
    assert S.accounting_ok(1, captured("sge/qacct_loop.stderr"))
    assert S.status_ok(0, "") and not S.status_ok(1, "error: commlib error: can't connect")


def test_qacct_deleted_by_and_h_rt():
    text = "jobnumber 9\ntaskid 2\nfailed 0\nexit_status 137\ndeleted_by alice@login1\n"
    assert S.parse_accounting(text)["9.2"].state is T.CANCELLED
    limit = "jobnumber 9\ntaskid 3\nfailed 37  : qmaster enforced h_rt, h_cpu, or h_vmem limit\nexit_status 137\n"
    assert S.parse_accounting(limit)["9.3"].reason == "TIMEOUT"


def test_cancel(captured):
    assert S.build_cancel(["3.5", "4"]) == ["qdel", "3.5", "4"]
    assert S.cancel_ok(0, "", captured("sge/qdel_elements.stdout"))
    assert S.cancel_ok(1, "", captured("sge/qdel_unknown.stdout"))
    assert not S.cancel_ok(1, "", 'denied: job "4" is not yours\n')
    assert not S.cancel_ok(1, "error: commlib error: got select error (Connection refused)\n")


def test_max_array_size_and_ids(captured):
    assert S.build_max_array_size() == ["qconf", "-sconf"]
    assert S.parse_max_array_size(captured("sge/qconf_sconf.txt")) == 75000
    assert S.parse_max_array_size("max_aj_tasks 0\n") is None
    assert S.element_id("3", 4) == "3.4"
    assert S.log_file("/l", "fit", "3", 4) == "/l/fit-3.4.log"
