"""The batch base against a real SLURM (single node, started by ci/services/slurm.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import elsewhere as ew

pytestmark = pytest.mark.timeout(240)


def square(x):
    print(f"squaring {x}")
    return x * x


def sleepy(x):
    time.sleep(x)
    return x


def cluster(**kw):
    kw.setdefault("partition", "debug")
    kw.setdefault("status_interval_s", 0.5)
    return ew.slurm(**kw)


def _squeue(job_id):
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True)
    return out.stdout.split("\n") if out.stdout.strip() else []


def test_map_one_array_job(ew_home, slurm_info):
    cl = cluster()
    assert ew.map(square, range(12), on=cl) == [x * x for x in range(12)]
    sbatch = [c for c in cl.commands_run if c[0] == "sbatch"]
    assert len(sbatch) == 1
    status = [c for c in cl.commands_run if c[0] == "squeue"]
    assert all(",".join(c).count("squeue") == 1 for c in status)


def test_array_split_and_chunks(ew_home, slurm_info):
    cl = cluster(tasks_per_element=2, max_elements=10**6)
    job = ew.submit(square, range(7), on=cl)
    job.wait(timeout=120)
    assert job.results() == [x * x for x in range(7)]
    data = cl.get_job_cluster_data(job)
    assert [s["elements"] for s in data["submissions"]] == [4]
    # more elements than one array may hold: split, with an offset
    cl2 = cluster(max_elements=3)
    job2 = ew.submit(square, range(7), on=cl2)
    job2.wait(timeout=120)
    assert job2.results() == [x * x for x in range(7)]
    subs = cl2.get_job_cluster_data(job2)["submissions"]
    assert len(subs) >= 1 and sum(s["tasks"] for s in subs) == 7


def crash_on_three(x):
    if x == 3:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does (a segfault would leave a core)
    return x


def test_a_task_that_kills_its_element_worker_is_lost_alone_the_others_of_the_element_run(ew_home, slurm_info):
    # an element given 8 tasks: the task that kills the worker costs itself, not the 4 after it
    cl = cluster(tasks_per_element=8, max_elements=10**6)
    job = ew.submit(crash_on_three, range(8), on=cl)
    job.wait(timeout=120)
    res = job.results()
    assert isinstance(res[3], ew.TaskError) and res[3].reason == "lost", repr(res[3])
    assert "without a result" in res[3].message, res[3].message  # the scheduler's words
    assert [r for i, r in enumerate(res) if i != 3] == [0, 1, 2, 4, 5, 6, 7]
    assert [s["elements"] for s in cl.get_job_cluster_data(job)["submissions"]] == [1]


def test_log_header_and_task_log(ew_home, slurm_info):
    job = ew.submit(square, [3], on=cluster(), name="hdr")
    job.wait(timeout=120)
    assert "squaring 3" in job.log(0)
    logs = list((job.path / "logs" / "scheduler").glob("*.log"))
    text = logs[0].read_text()
    assert "elsewhere worker: host" in text and "SLURM_ARRAY_JOB_ID=" in text and "python" in text


def test_cancel_running_array(ew_home, slurm_info):
    cl = cluster()
    job = ew.submit(sleepy, [120] * 3, on=cl)
    deadline = time.monotonic() + 60
    while job.check().counts["running"] < 1:
        assert time.monotonic() < deadline, job.check()
        time.sleep(0.3)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED
    deadline = time.monotonic() + 30
    while any("RUNNING" in line or "PENDING" in line for line in _squeue(native)):
        assert time.monotonic() < deadline, _squeue(native)
        time.sleep(0.3)


def test_element_killed_by_scheduler_is_failed_with_reason_then_retried(ew_home, slurm_info):
    cl = cluster()
    job = ew.submit(sleepy, [0, 120, 0], on=cl)
    deadline = time.monotonic() + 60
    while job.tasks[1].state is not ew.TaskState.RUNNING:
        assert time.monotonic() < deadline, job.check()
        time.sleep(0.3)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    subprocess.run(["scancel", f"{native}_1"], check=True)
    job.wait(timeout=120)
    res = job.results()
    assert res[0] == 0 and res[2] == 0
    assert isinstance(res[1], ew.TaskError) and res[1].reason == "lost"
    assert "CANCELLED" in res[1].message
    assert job.check().state is ew.JobState.FAILED
    # retry only the failed task, with more resources
    job.retry(mem="200M", walltime="00:05:00")
    subs = cl.get_job_cluster_data(job)["submissions"]
    assert len(subs) == 2 and subs[1]["tasks"] == 1
    script = (job.path / "submissions" / "1.sh").read_text()
    assert "--mem-per-cpu=200M" in script and "--time=00:05:00" in script


def test_pending_reason_shown(ew_home, slurm_info):
    cl = cluster(sbatch=["--hold"])
    job = ew.submit(square, [1, 2], on=cl)
    deadline = time.monotonic() + 30
    st = job.check()
    while "pending" not in st.note:
        assert time.monotonic() < deadline, st
        time.sleep(0.3)
        st = job.check()
    assert "JobHeldUser" in st.note or "Held" in st.note
    job.cancel()


def test_inherited_slurm_variables_do_not_leak(ew_home, slurm_info, monkeypatch):
    monkeypatch.setenv("SBATCH_PARTITION", "no-such-partition")
    monkeypatch.setenv("SLURM_JOB_ID", "999999")
    assert ew.map(square, [4], on=cluster(partition=None)) == [16]


def test_submit_failure_is_clear(ew_home, slurm_info):
    with pytest.raises(ew.SchedulerError) as info:
        ew.submit(square, [1], on=cluster(partition="no-such-partition"))
    msg = str(info.value)
    assert "sbatch" in msg and "exit code" in msg and "partition" in msg.lower()


def test_template_errors_name_the_field(ew_home, slurm_info):
    with pytest.raises(ew.ConfigError, match="no_such_field"):
        cluster(template="#!/bin/bash\n#SBATCH --x={{ no_such_field }}\nexec {{ run_line }}\n")
    with pytest.raises(ew.ConfigError, match="no job-script template"):
        cluster(template="not-a-template")


def test_user_template_by_name(ew_home, slurm_info, tmp_path, monkeypatch):
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "cfg"))
    from elsewhere.schedulers import jobscripts

    path = jobscripts.install("mine", source="slurm")
    path.write_text(path.read_text().replace("exec ", "echo MY-TEMPLATE-WAS-USED\nexec "))
    cl = cluster(template="mine")
    job = ew.submit(square, [2], on=cl)
    assert "MY-TEMPLATE-WAS-USED" in cl.job_script(job)
    job.wait(timeout=120)
    assert job.results() == [4]


def test_profile(ew_home, slurm_info, tmp_path, monkeypatch):
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "cfg"))
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.toml").write_text(textwrap.dedent("""
        [profiles.helix]
        scheduler = "slurm"
        partition = "debug"
        status_interval_s = 0.5
        [profiles.helix.additional_properties]
        note = "from the profile"
    """))
    assert ew.map(square, [5], on="helix") == [25]
    assert ew.cluster("helix").additional_properties == {"note": "from the profile"}
    with pytest.raises(ew.ConfigError, match="no profile 'nope'"):
        ew.map(square, [5], on="nope")


CLIENT = """
import elsewhere as ew, time
def slow(x):
    time.sleep(1)
    return -x
ew.submit(slow, range(4), name="slurm-detached", on=ew.slurm(partition="debug", status_interval_s=0.5))
print("ok", flush=True)
"""


def test_recover_running_job_from_new_process(ew_home, slurm_info, tmp_path):
    script = tmp_path / "c.py"
    script.write_text(CLIENT)
    subprocess.run([sys.executable, str(script)], check=True, timeout=60, env=dict(os.environ))
    out = subprocess.run(
        [sys.executable, "-c", "import elsewhere as ew; j = ew.recover('slurm-detached'); "
         "j.wait(timeout=120, progress=False); print(j.results())"],
        capture_output=True, text=True, timeout=150, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, -1, -2, -3]"


def blas_threads(_):
    from blas_probe import blas_threads as pools

    return os.environ.get("OMP_NUM_THREADS"), pools(), ew.task().cores


def test_an_elements_blas_has_as_many_threads_as_its_cores(ew_home, slurm_info, monkeypatch):
    from blas_probe import blas_threads as pools
    from blas_probe import no_thread_vars

    no_thread_vars(monkeypatch)  # sbatch exports the submitter's environment
    if not pools():
        pytest.skip("NumPy's BLAS is not one threadpoolctl knows")
    assert ew.map(blas_threads, range(1), on=cluster()) == [("1", [1], 1)]
    assert ew.map(blas_threads, range(1), on=cluster(cores_per_task=2)) == [("2", [2], 2)]
