"""The batch base end to end through the stateful fakes of LSF, HTCondor and Flux.

No daemon of these can run here, so tests/fakes/<name>/bin stands in (see
tests/fakes/README.md): the fake commands keep a queue in a JSON file under
ELSEWHERE_FAKE_STATE and really run the submitted scripts. Each test puts one fake first
on PATH and gives it a queue of its own, then goes the whole way a user goes:
ew.batch(...) -> submit -> status -> cancel -> accounting -> results.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import elsewhere as ew

FAKES = Path(__file__).resolve().parents[1] / "fakes"
SCHEDULERS = ["lsf", "htcondor", "flux"]
KEEP_S = 2.0  # a finished element stays this long in the fake's queue view

pytestmark = pytest.mark.timeout(90)


class FakeQueue:
    """One fake scheduler's queue, as its JSON file says."""

    def __init__(self, name: str, state: Path) -> None:
        self.name = name
        self.state = state

    def jobs(self) -> dict:
        path = self.state / f"{self.name}.json"
        return json.loads(path.read_text())["jobs"] if path.exists() else {}

    def elements(self) -> list[dict]:
        return [el for job in self.jobs().values() for el in job["elements"].values()]

    def running(self) -> list[dict]:
        return [el for el in self.elements() if el["state"] == "running"]

    def stop_all(self) -> None:
        """Kill what still runs: the runners this test's jobs started, and their elements."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for el in self.running():
                for pid in (el.get("pid"), el.get("child_pid")):
                    if pid:
                        try:
                            os.killpg(pid, sig)
                        except (ProcessLookupError, PermissionError):
                            pass
            time.sleep(0.2)


@pytest.fixture(params=SCHEDULERS)
def fake(request, tmp_path, monkeypatch, ew_home):
    name = request.param
    if not (FAKES / name / "bin").is_dir():
        pytest.skip(f"no fake {name} in {FAKES}")
    state = tmp_path / "fake-state"
    monkeypatch.setenv("ELSEWHERE_FAKE_STATE", str(state))
    monkeypatch.setenv("ELSEWHERE_FAKE_KEEP_S", str(KEEP_S))
    monkeypatch.setenv("ELSEWHERE_FAKE_KILL_WAIT_S", "0.5")
    monkeypatch.setenv("PATH", f"{FAKES / name / 'bin'}{os.pathsep}{os.environ['PATH']}")
    queue = FakeQueue(name, state)
    yield queue
    queue.stop_all()


def square(x):
    print(f"squaring {x}")
    return x * x


def sleepy(x):
    time.sleep(x)
    return x


def cluster(name, **kw):
    kw.setdefault("status_interval_s", 0.5)
    return ew.batch(name, **kw)


def _wait(cond, what, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what()
        time.sleep(0.2)


def _element(cl, job, task):
    """The native id of the element that runs ``task`` (one task per element)."""
    sub = cl.get_job_cluster_data(job)["submissions"][0]
    return cl.syntax.element_id(sub["native_id"], task + cl.syntax.array_index_base)


def test_array_job_results_one_submit_batched_status(fake):
    cl = cluster(fake.name, tasks_per_element=2, max_elements=10**6)
    t0 = time.monotonic()
    job = ew.submit(square, range(7), on=cl)
    job.wait(timeout=60)
    elapsed = time.monotonic() - t0
    assert job.results() == [x * x for x in range(7)]
    assert "squaring 6" in job.log(6)
    subs = cl.get_job_cluster_data(job)["submissions"]
    assert [s["elements"] for s in subs] == [4]
    # one array job with 4 elements (flux submit --cc: 4 jobs from one command)
    assert len(fake.jobs()) == (4 if fake.name == "flux" else 1)
    assert len(fake.elements()) == 4
    script = f"{cl.worker_dir(job)}/submissions/0.sh"
    submit = cl.syntax.build_submit(script, cl.extra_args)
    assert [c for c in cl.commands_run if script in c] == [submit], cl.commands_run
    status = [c for c in cl.commands_run if c[0] == cl.syntax.status_command]
    assert status and len(status) <= 2 * (elapsed / 0.5 + 2), status
    # element logs, named by the template
    logs = sorted((job.path / "logs" / "scheduler").glob("*.log"))
    assert len(logs) == 4 and all("elsewhere worker: host" in p.read_text() for p in logs)


def test_one_status_call_for_all_jobs_of_a_cluster(fake):
    cl = cluster(fake.name, status_interval_s=30)
    jobs = [ew.submit(sleepy, [0.1, 0.1], on=cl) for _ in range(3)]
    before = len(cl.commands_run)
    for job in jobs:
        job.check()
        job.check()
    new = cl.commands_run[before:]
    status = [c for c in new if c[0] == cl.syntax.status_command]
    assert len(status) <= 2, new  # one status (+ one accounting) for the three jobs
    for job in jobs:
        job.wait(timeout=30)
        assert job.results() == [0.1, 0.1]


def test_cancel_running_array(fake):
    cl = cluster(fake.name)
    job = ew.submit(sleepy, [60, 60, 60], on=cl)
    _wait(lambda: job.check().counts["running"] == 3, job.check)
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED
    assert all(el["state"] == "cancelled" for el in fake.elements()), fake.elements()
    # the element processes are gone, not only the queue entries
    pids = [el["pid"] for el in fake.elements() if el["pid"]]
    _wait(
        lambda: not any(os.path.exists(f"/proc/{p}") and "Z" not in _stat(p) for p in pids),
        lambda: pids,
        timeout_s=15,
    )
    assert job.check().state is ew.JobState.CANCELLED


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_element_cancelled_by_the_scheduler_is_lost_with_reason(fake):
    cl = cluster(fake.name)
    job = ew.submit(sleepy, [0, 60, 0], on=cl)
    _wait(lambda: job.tasks[1].state is ew.TaskState.RUNNING, job.check)
    elem = _element(cl, job, 1)
    done = subprocess.run(
        cl.syntax.build_cancel([elem]), capture_output=True, text=True, timeout=30
    )
    assert cl.syntax.cancel_ok(done.returncode, done.stderr, done.stdout), done
    job.wait(timeout=30)
    res = job.results()
    assert res[0] == 0 and res[2] == 0
    assert isinstance(res[1], ew.TaskError) and res[1].reason == "lost"
    assert elem in res[1].message and "without a result" in res[1].message
    assert job.check().state is ew.JobState.FAILED


def test_element_whose_node_died_is_lost_found_in_accounting(fake):
    """The runner is killed from outside (a node failure); nobody polls until the element
    has left the queue view, so only the history command can tell what happened."""
    cl = cluster(fake.name)
    job = ew.submit(sleepy, [0, 60, 0], on=cl, name=f"{fake.name}-node-died")
    _wait(
        lambda: (
            job.tasks[1].state is ew.TaskState.RUNNING
            and len(fake.running()) == 1
            and job.check().counts["finished"] == 2
        ),
        job.check,
    )
    (el,) = fake.running()
    os.killpg(el["pid"], signal.SIGKILL)  # the runner only: the fake reaps the rest
    # a fake notices a vanished runner at its next command; then the element ages out
    native = cl.get_job_cluster_data(job)["submissions"][0]["native_id"]

    def noticed():
        subprocess.run(cl.syntax.build_status([native]), capture_output=True, timeout=30)
        return all(e["state"] != "running" for e in fake.elements())

    _wait(noticed, fake.elements, timeout_s=15)
    assert [e["state"] for e in fake.elements()].count("lost") == 1
    time.sleep(KEEP_S + 0.5)
    fresh = ew.recover(job.name)  # a new cluster object: no cached status
    fresh.wait(timeout=30)
    res = fresh.results()
    assert res[0] == 0 and res[2] == 0
    assert isinstance(res[1], ew.TaskError) and res[1].reason == "lost"
    assert "without a result" in res[1].message and _element(cl, job, 1) in res[1].message
    assert fresh.check().state is ew.JobState.FAILED
    # the queue had forgotten the job: its history told what happened
    assert cl.syntax.build_accounting([native]) in fresh.cluster.commands_run


def test_submit_failure_is_clear(fake):
    bad = {
        "lsf": {"bsub": ["-q"]},
        "htcondor": {"extra_args": ["-no-such-option"]},
        "flux": {"flux": ["--no-such-option"]},
    }[fake.name]
    with pytest.raises(ew.SchedulerError) as info:
        ew.submit(square, [1], on=cluster(fake.name, **bad))
    msg = str(info.value)
    assert "exit code" in msg and "command:" in msg and "stderr:" in msg, msg
