"""The batch base through real PBS/Torque commands: Debian's slurm-wlm-torque wrappers
(qsub, qstat, qdel) over the real SLURM, cluster kind "slurm-torque".

The same contract as tests/batch/test_slurm.py, with what these wrappers cannot do said
plainly: their qstat reports one status per array job (the element whose SLURM id is the
job id), not per element, and their qdel turns any id into a number, so one element is
killed here with SLURM's own scancel, as an administrator or a node failure would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import elsewhere as ew

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import services

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(services.torque() is None, reason=services.why_no_torque() or "no torque"),
]


@pytest.fixture
def torque_info(monkeypatch, tmp_path):
    """The wrappers first on PATH, and a submitting directory of the test's own."""
    info = services.torque()
    if info is None:
        pytest.skip(services.why_no_torque())
    for key, value in info.env.items():
        monkeypatch.setenv(key, value)
    submit_dir = tmp_path / "submit-dir"
    submit_dir.mkdir()
    monkeypatch.chdir(submit_dir)
    return info


def square(x):
    print(f"squaring {x}")
    return x * x


def sleepy(x):
    time.sleep(x)
    return x


def cluster(**kw):
    kw.setdefault("status_interval_s", 0.5)
    return ew.batch("slurm-torque", **kw)


def _commands(cl, name):
    return [c for c in cl.commands_run if c[0] == name]


def _squeue(job_id: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True, timeout=30
    )
    return [line for line in out.stdout.splitlines() if line.strip()]


def _wait(cond, what, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what()
        time.sleep(0.3)


def test_map_is_one_array_job(ew_home, torque_info):
    cl = cluster()
    assert cl.syntax.submit_command == "qsub"
    assert ew.map(square, range(10), on=cl) == [x * x for x in range(10)]
    qsub = _commands(cl, "qsub")
    assert len(qsub) == 1
    # submitted with the wrappers' qsub; followed with SLURM's own squeue, which knows
    # each element (the wrappers' qstat reports one status per job)
    assert not _commands(cl, "sbatch") and not _commands(cl, "qstat")
    assert all(c[0] == "squeue" for c in _commands(cl, "squeue"))


def test_one_status_call_for_all_jobs_of_a_cluster(ew_home, torque_info):
    cl = cluster(status_interval_s=30)
    jobs = [ew.submit(square, range(2), on=cl) for _ in range(3)]
    ids = [cl.get_job_cluster_data(j)["submissions"][0]["native_id"] for j in jobs]
    before = len(_commands(cl, "squeue"))
    for job in jobs:
        job.check()
        job.check()
    status = _commands(cl, "squeue")[before:]
    assert len(status) == 1 and all(i in ",".join(status[0]) for i in ids)
    for job in jobs:
        job.cancel()


def test_chunks_and_log_header(ew_home, torque_info):
    cl = cluster(tasks_per_element=2, max_elements=10**6)
    job = ew.submit(square, range(5), on=cl, name="tq-hdr")
    assert "#PBS -t 0-2" in cl.job_script(job)
    job.wait(timeout=90)
    assert job.results() == [x * x for x in range(5)]
    assert "squaring 4" in job.log(4)
    logs = sorted((job.path / "logs" / "scheduler").glob("*.log"))
    assert len(logs) == 3, logs
    text = logs[0].read_text()
    assert "elsewhere worker: host" in text and "SLURM_ARRAY_JOB_ID=" in text


def test_scheduler_files_stay_in_the_job_folder(ew_home, torque_info):
    job = ew.submit(square, [1, 2], on=cluster())
    job.wait(timeout=90)
    assert job.results() == [1, 4]
    assert sorted(os.listdir(".")) == []


def test_cancel_running_array(ew_home, torque_info):
    cl = cluster()
    job = ew.submit(sleepy, [100] * 3, on=cl)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    _wait(
        lambda: len([ln for ln in _squeue(native) if "RUNNING" in ln]) == 3, lambda: _squeue(native)
    )
    job.cancel()
    assert _commands(cl, "scancel") == [["scancel", native]]
    assert job.check().state is ew.JobState.CANCELLED
    _wait(
        lambda: not any("RUNNING" in ln or "PENDING" in ln for ln in _squeue(native)),
        lambda: _squeue(native),
        timeout_s=30,
    )


def test_cancel_one_task_cancels_only_its_element(ew_home, torque_info):
    cl = cluster()
    assert cl.syntax.can_cancel_elements is True  # through scancel, not the wrappers' qdel
    assert cl.syntax.build_cancel([cl.syntax.element_id("7", 1)]) == ["scancel", "7_1"]


def _age_submissions(cl, job, seconds):
    """Make the job's submissions look ``seconds`` older (past the base's grace for absence)."""
    data = cl.get_job_cluster_data(job)
    for sub in data["submissions"]:
        sub["submitted"] -= seconds
    cl.set_job_cluster_data(job, data)


def test_element_killed_by_slurm_is_lost_others_kept(ew_home, torque_info):
    cl = cluster()
    job = ew.submit(sleepy, [0, 100, 0], on=cl)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    # the wrappers' qstat does not show elements: look at SLURM itself
    _wait(
        lambda: any(ln == f"{native}_1 RUNNING" for ln in _squeue(native)), lambda: _squeue(native)
    )
    _wait(lambda: job.check().counts["finished"] == 2, job.check)
    subprocess.run(["scancel", f"{native}_1"], check=True, timeout=30)
    _wait(
        lambda: (
            not any(ln.startswith(f"{native}_1 ") and "RUNNING" in ln for ln in _squeue(native))
        ),
        lambda: _squeue(native),
        timeout_s=30,
    )
    # the wrappers cannot name the element: it is found by its absence, after a grace time
    _age_submissions(cl, job, 60)
    job.wait(timeout=30)
    res = job.results()
    assert res[0] == 0 and res[2] == 0
    assert isinstance(res[1], ew.TaskError) and res[1].reason == "lost"
    assert job.check().state is ew.JobState.FAILED


def test_long_running_elements_are_not_written_off(ew_home, torque_info):
    cl = cluster()
    job = ew.submit(sleepy, [8, 8, 8], on=cl)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    _wait(
        lambda: len([ln for ln in _squeue(native) if "RUNNING" in ln]) == 3, lambda: _squeue(native)
    )
    _age_submissions(cl, job, 60)  # as if they had run for a minute already
    st = job.check()
    try:
        assert st.counts["failed"] == 0, st
        job.wait(timeout=60)
        assert job.results() == [8, 8, 8]
    finally:
        job.cancel()


def test_held_job_stays_queued_until_cancelled(ew_home, torque_info):
    cl = cluster(qsub=["-h"])
    job = ew.submit(square, [1, 2], on=cl)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    _wait(lambda: _squeue(native), lambda: "never in squeue", timeout_s=30)
    time.sleep(1.5)
    st = job.check()
    # the wrappers' qstat shows a held job as plain Q, without a reason
    assert st.counts["queued"] == 2 and st.state is ew.JobState.QUEUED, st
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED
    _wait(lambda: not any("PENDING" in ln for ln in _squeue(native)), lambda: _squeue(native), 30)


def test_submit_failure_names_command_and_exit_code(ew_home, torque_info):
    with pytest.raises(ew.SchedulerError) as info:
        ew.submit(square, [1], on=cluster(queue="no-such-queue"))
    msg = str(info.value)
    assert msg.startswith("qsub failed") and info.value.command[0] == "qsub"
    assert re.search(r"exit code:? 1\b", msg), msg


def test_submit_failure_says_why(ew_home, torque_info):
    with pytest.raises(ew.SchedulerError) as info:
        ew.submit(square, [1], on=cluster(queue="no-such-queue"))
    assert "invalid partition" in str(info.value).lower()


CLIENT = """
import elsewhere as ew, time
def slow(x):
    time.sleep(1)
    return -x
ew.submit(slow, range(4), name="torque-detached", on=ew.batch("slurm-torque", status_interval_s=0.5))
print("ok", flush=True)
"""


def test_recover_running_job_from_new_process(ew_home, torque_info, tmp_path):
    script = tmp_path / "c.py"
    script.write_text(CLIENT)
    subprocess.run([sys.executable, str(script)], check=True, timeout=60, env=dict(os.environ))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import elsewhere as ew; j = ew.recover('torque-detached'); "
            "print(j.cluster.kind, flush=True); j.wait(timeout=90, progress=False); print(j.results())",
        ],
        capture_output=True,
        text=True,
        timeout=110,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["slurm-torque", "[0, -1, -2, -3]"]
