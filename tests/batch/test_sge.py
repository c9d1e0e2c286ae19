"""The batch base against a real Son of Grid Engine (one host, started by ci/services/sge.sh).

The same contract as tests/batch/test_slurm.py: one ``qsub -t`` per job, results mapped back
in order, one ``qstat -xml`` per status interval for all jobs, cancel, an element killed by
``qdel`` reported failed/"lost" while the others keep their results, recovery from a new
process, pending reasons and clear submit errors. SGE starts a task about a second after
``qsub`` (scheduler interval 1 s), so every task here is short.
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
    pytest.mark.skipif(services.sge() is None, reason=services.why_no_sge() or "no SGE"),
]


@pytest.fixture
def sge_info():
    info = services.sge()
    if info is None:
        pytest.skip(services.why_no_sge())
    return info


def square(x):
    print(f"squaring {x}")
    return x * x


def sleepy(x):
    time.sleep(x)
    return x


def cluster(**kw):
    kw.setdefault("status_interval_s", 0.5)
    return ew.batch("sge", **kw)


def _commands(cl, name):
    return [c for c in cl.commands_run if c[0] == name]


def _in_qstat(job_id: str) -> list[str]:
    """Lines of plain qstat that belong to SGE job ``job_id`` (first column)."""
    out = subprocess.run(["qstat"], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if line.split()[:1] == [job_id]]


def _wait_running(job, index=None, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while True:
        if index is None:
            if job.check().counts["running"] >= 1:
                return
        elif job.tasks[index].state is ew.TaskState.RUNNING:
            return
        assert time.monotonic() < deadline, job.check()
        time.sleep(0.3)


def test_map_is_one_array_job_and_results_in_order(ew_home, sge_info):
    cl = cluster()
    t0 = time.monotonic()
    assert ew.map(square, range(12), on=cl) == [x * x for x in range(12)]
    elapsed = time.monotonic() - t0
    qsub = _commands(cl, "qsub")
    assert len(qsub) == 1
    job = ew.submit(square, range(12), on=cluster())
    # as many elements as the queue has usable slots (qstat -g c), claiming the 12 tasks
    assert f"#$ -t 1-{min(12, cl.free_cpus().usable)}" in job.cluster.job_script(job)
    job.cancel()
    # status: one qstat for all elements, never more often than the interval allows
    status = [c for c in _commands(cl, "qstat") if c != ["qstat", "-g", "c"]]  # (not the slots)
    assert status and all(c == ["qstat", "-xml"] for c in status)
    assert len(status) <= elapsed / 0.5 + 2


def test_one_status_call_for_all_jobs_of_a_cluster(ew_home, sge_info):
    cl = cluster(status_interval_s=30)
    jobs = [ew.submit(square, range(2), on=cl) for _ in range(3)]
    before = len(_commands(cl, "qstat"))
    for job in jobs:
        job.check()
    for job in jobs:
        job.check()
    assert len(_commands(cl, "qstat")) - before <= 1
    for job in jobs:
        job.cancel()


def test_chunks_and_split_arrays(ew_home, sge_info):
    cl = cluster(tasks_per_element=2, max_elements=10**6)
    job = ew.submit(square, range(5), on=cl)
    job.wait(timeout=90)
    assert job.results() == [x * x for x in range(5)]
    assert [s["elements"] for s in cl.get_job_cluster_data(job)["submissions"]] == [3]
    assert "#$ -t 1-3" in cl.job_script(job)


def test_log_header_and_task_log(ew_home, sge_info):
    job = ew.submit(square, [3], on=cluster(), name="hdr")
    job.wait(timeout=90)
    assert "squaring 3" in job.log(0)
    logs = list((job.path / "logs" / "scheduler").glob("*.log"))
    assert len(logs) == 1, logs
    text = logs[0].read_text()
    assert "elsewhere worker: host" in text and "SGE_TASK_ID=1" in text and "JOB_ID=" in text


def cores_seen(_):
    return ew.task().cores, os.environ.get("NSLOTS")


def test_cores_per_task_is_a_parallel_environment(ew_home, sge_info):
    cl = cluster(cores_per_task=2)
    job = ew.submit(cores_seen, [0], on=cl)
    assert "#$ -pe smp 2" in cl.job_script(job)
    job.wait(timeout=90)
    assert job.results() == [(2, "2")]


def stamp(x):
    t0 = time.time()
    time.sleep(0.3)
    return (t0, time.time())


def test_max_running_throttles_the_array(ew_home, sge_info):
    cl = cluster(max_running=1)
    job = ew.submit(stamp, range(3), on=cl)
    assert "#$ -tc 1" in cl.job_script(job)
    job.wait(timeout=90)
    spans = sorted(job.results())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans


def test_cancel_running_array(ew_home, sge_info):
    cl = cluster()
    job = ew.submit(sleepy, [100] * 3, on=cl)
    _wait_running(job)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    assert _in_qstat(native)
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED
    deadline = time.monotonic() + 30
    while _in_qstat(native):
        assert time.monotonic() < deadline, _in_qstat(native)
        time.sleep(0.3)
    assert job.check().state is ew.JobState.CANCELLED


def test_element_killed_by_qdel_is_lost_with_reason_others_kept(ew_home, sge_info):
    cl = cluster()
    job = ew.submit(sleepy, [0, 100, 0], on=cl)
    _wait_running(job, 1)
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]
    subprocess.run(["qdel", f"{native}.2"], check=True, capture_output=True, timeout=30)
    job.wait(timeout=60)
    res = job.results()
    assert res[0] == 0 and res[2] == 0
    assert isinstance(res[1], ew.TaskError) and res[1].reason == "lost"
    assert f"{native}.2" in res[1].message and "without a result" in res[1].message
    why = res[1].message
    assert "deleted by qdel" in why or any(f"(signal {n}: qdel, or a limit" in why for n in (9, 15)), why
    assert job.check().state is ew.JobState.FAILED
    # the element is gone from the queue, not left running
    deadline = time.monotonic() + 30
    while _in_qstat(native):
        assert time.monotonic() < deadline, _in_qstat(native)
        time.sleep(0.3)


def flaky(x):
    if x == 1 and ew.task().attempt == 0:
        raise ValueError("first attempt fails")
    return x * 10


def test_retry_with_more_resources_reruns_only_the_failed_task(ew_home, sge_info):
    cl = cluster()
    job = ew.submit(flaky, range(3), on=cl)
    job.wait(timeout=60)
    assert isinstance(job.results()[1], ew.TaskError)
    job.retry(mem="1G", walltime="00:05:00")
    subs = cl.get_job_cluster_data(job)["submissions"]
    assert len(subs) == 2 and subs[1]["tasks"] == 1
    script = (job.path / "submissions" / "1.sh").read_text()
    assert "h_vmem=1024M" in script and "h_rt=00:05:00" in script
    assert job.check().state is not ew.JobState.FAILED  # the retried task waits again
    job.wait(timeout=60)
    assert job.results() == [0, 10, 20]
    assert job.check().state is ew.JobState.FINISHED


def test_pending_reason_shown(ew_home, sge_info):
    cl = cluster(qsub=["-h"])  # a user hold: SGE shows state hqw
    job = ew.submit(square, [1, 2], on=cl)
    deadline = time.monotonic() + 30
    st = job.check()
    while "pending" not in st.note:
        assert time.monotonic() < deadline, st
        time.sleep(0.3)
        st = job.check()
    assert "held" in st.note
    assert st.reasons == {0: "pending: held", 1: "pending: held"}
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED


def test_submit_failure_is_clear(ew_home, sge_info):
    with pytest.raises(ew.SchedulerError) as info:
        ew.submit(square, [1], on=cluster(queue="no-such-queue"))
    msg = str(info.value)
    assert "qsub" in msg and "no-such-queue" in msg
    assert re.search(r"exit code:? 1\b", msg), msg


CLIENT = """
import elsewhere as ew, time
def slow(x):
    time.sleep(1)
    return -x
ew.submit(slow, range(4), name="sge-detached", on=ew.batch("sge", status_interval_s=0.5))
print("ok", flush=True)
"""


def test_recover_running_job_from_new_process(ew_home, sge_info, tmp_path):
    script = tmp_path / "c.py"
    script.write_text(CLIENT)
    subprocess.run([sys.executable, str(script)], check=True, timeout=60, env=dict(os.environ))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import elsewhere as ew; j = ew.recover('sge-detached'); "
            "print(j.cluster.kind, flush=True); j.wait(timeout=90, progress=False); print(j.results())",
        ],
        capture_output=True,
        text=True,
        timeout=110,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["sge", "[0, -1, -2, -3]"]


PACKED_AFTER = """
import sys
import elsewhere as ew
sys.path.insert(0, {tests!r})
from batch.test_sge import fails, touch
cl = ew.batch("sge", status_interval_s=0.5, max_elements=1)
bad = ew.submit(fails, range(2), on=cl, name="sge-bad")
after = ew.submit(touch, {marks!r}, on=cl, after=bad, name="sge-after")
ids = [cl.get_job_cluster_data(j)["submissions"][0]["native_id"] for j in (bad, after)]
print(*ids, cl.get_job_cluster_data(after)["submissions"][0]["elements"], flush=True)
"""


def fails(x):
    raise RuntimeError(f"task {x} fails")


def touch(path):
    Path(path).touch()
    return path


def test_packed_elements_after_a_failed_job_run_nothing(ew_home, sge_info, tmp_path):
    # Grid Engine's -hold_jid waits for the jobs to end, however they end: the workers of the
    # job check that they finished well, unwatched by any client. Elements that claim their
    # tasks (packed: fewer elements than tasks) check too, before their first claim.
    marks = [str(tmp_path / f"ran-{i}") for i in range(3)]
    code = PACKED_AFTER.format(tests=str(Path(__file__).resolve().parents[1]), marks=marks)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ), check=True).stdout.split()  # fmt: skip
    assert out[2] == "1", out  # one element, claiming the three tasks
    deadline = time.monotonic() + 90
    while _in_qstat(out[0]) or _in_qstat(out[1]):  # both ran (or were dropped) unwatched
        assert time.monotonic() < deadline, (_in_qstat(out[0]), _in_qstat(out[1]))
        time.sleep(0.3)
    assert not any(os.path.exists(m) for m in marks)
    bad, after = ew.recover("sge-bad"), ew.recover("sge-after")
    assert bad.state is ew.JobState.FAILED
    assert after.state is ew.JobState.CANCELLED, after.check()
    assert f"job {bad.name!r}, which it waits for, failed" in after.check().note
