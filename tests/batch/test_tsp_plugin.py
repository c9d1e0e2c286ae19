"""A user's scheduler plugin for Task Spooler: examples/tsp_scheduler.py, on a real tsp.

Every test gets a tsp server of its own (``TS_SOCKET`` under its tmp_path), shut down with
``tsp -K`` and, if it is still there, killed by its pid at the end. The tests skip when the
task spooler is not installed (Debian: ``apt-get install task-spooler``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import elsewhere as ew
from batch import tsp_server

REPO = Path(__file__).resolve().parents[2]
TARGET = "examples.tsp_scheduler:TspCluster"
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(tsp_server.TSP is None, reason=tsp_server.WHY_NO_TSP),
]


@pytest.fixture(autouse=True)
def importable_examples(monkeypatch):
    """``examples`` importable here and in the processes the tests start."""
    monkeypatch.syspath_prepend(str(REPO))
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(REPO) + (os.pathsep + old if old else ""))


@pytest.fixture
def tsp(ew_home, tmp_path, monkeypatch):
    """A private tsp server (4 slots) for this test; ``tsp(*args)`` runs a tsp command on it."""
    server = tsp_server.start(tmp_path, monkeypatch)
    yield server
    server.stop()


def square(x):
    print(f"squaring {x}")
    return x * x


def boom(x):
    if x == 2:
        raise ValueError(f"no twos here: {x}")
    return x


def sleepy(x):
    time.sleep(x)
    return x


def flaky(marker):
    """Fails on its first run, succeeds on the next (the marker file remembers)."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    return "second attempt"


def sleepy_once(marker):
    """Sleeps (to be killed) on its first run, returns at once on the next."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(60)
    return "rerun"


def _entries(cl, job):
    return cl.get_job_cluster_data(job.handle)["tsp_jobs"]


def _listed(tsp) -> dict[int, tuple[str, str]]:
    """``{tsp id: (state, rest of the line)}`` from ``tsp -l``."""
    out = tsp("-l").stdout.splitlines()[1:]
    return {int(f[0]): (f[1], f[2]) for f in (line.split(None, 2) for line in out) if len(f) == 3}


def _wait(cond, what, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def test_map_results_in_order_one_tsp_job_per_chunk(tsp):
    cl = ew.batch(TARGET, slots=3)
    assert type(cl).__name__ == "TspCluster" and cl.kind == "tsp"
    job = ew.submit(square, range(10), on=cl)
    job.wait(timeout=60)
    assert job.results() == [x * x for x in range(10)]
    assert "squaring 9" in job.log(9)
    entries = _entries(cl, job)
    assert [e["tasks"] for e in entries] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert cl.get_job_cluster_data(job.handle)["socket"] == tsp.socket
    # the results come before the workers exit: then tsp says each of its jobs finished well
    _wait(
        lambda: all(_listed(tsp)[e["id"]][0] == "finished" for e in entries),
        lambda: tsp("-l").stdout,
    )
    listed = _listed(tsp)
    for e in entries:
        state, rest = listed[e["id"]]
        assert state == "finished" and f"[{e['label']}]" in rest
        assert "died with exit code 0" in tsp("-i", str(e["id"])).stdout
    assert ew.map(square, range(7), on=cl) == [x * x for x in range(7)]
    assert ew.map(square, [3, 4], on=ew.batch(TARGET, tasks_per_job=1)) == [9, 16]


def test_an_error_comes_back_as_a_task_error_with_its_traceback(tsp):
    job = ew.submit(boom, [1, 2, 3], on=ew.batch(TARGET, slots=2))
    job.wait(timeout=60)
    res = job.results()
    assert res[0] == 1 and res[2] == 3
    err = res[1]
    assert isinstance(err, ew.TaskError) and err.reason == "error"
    assert err.type_name == "ValueError" and err.message == "no twos here: 2" and err.index == 1
    assert "in boom" in err.traceback and "raise ValueError" in err.traceback
    assert job.check().state is ew.JobState.FAILED
    with pytest.raises(ValueError, match="no twos here"):
        ew.map(boom, [2], on=ew.batch(TARGET))


def test_tasks_show_running_while_they_run_and_cancel_stops_them(tsp):
    cl = ew.batch(TARGET, slots=2)
    job = ew.submit(sleepy, [60, 60], on=cl)
    _wait(lambda: job.check().counts["running"] == 2, job.check)
    assert [t.state for t in job.tasks] == [ew.TaskState.RUNNING] * 2
    ids = [e["id"] for e in _entries(cl, job)]
    assert [_listed(tsp)[i][0] for i in ids] == ["running", "running"]
    pids = [int(tsp("-p", str(i)).stdout) for i in ids]
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED
    assert [_listed(tsp)[i][0] for i in ids] == ["finished", "finished"]
    assert all(tsp_server.gone(pid) for pid in pids)


def test_queued_tasks_say_so_and_cancel_removes_them_from_the_queue(tsp):
    tsp("-S", "1")
    cl = ew.batch(TARGET, tasks_per_job=1)
    job = ew.submit(sleepy, [60, 0, 0], on=cl)
    _wait(lambda: job.tasks[0].state is ew.TaskState.RUNNING, job.check)
    ids = [e["id"] for e in _entries(cl, job)]
    assert [_listed(tsp)[i][0] for i in ids] == ["running", "queued", "queued"]
    reasons = job.check().reasons  # what the plugin's job_state adds
    assert (
        reasons[1] == f"tsp: queued (tsp job {ids[1]})"
        and reasons[2] == f"tsp: queued (tsp job {ids[2]})"
    )
    assert 0 not in reasons
    shell = subprocess.run([sys.executable, "-m", "elsewhere", "status", job.name], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ))  # fmt: skip
    assert f"tsp: queued (tsp job {ids[1]}): task 1" in shell.stdout, shell.stdout + shell.stderr
    shell = subprocess.run([sys.executable, "-m", "elsewhere", "status", job.name, "--json"], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ))  # fmt: skip
    assert json.loads(shell.stdout)["reasons"]["2"] == f"tsp: queued (tsp job {ids[2]})"
    job.cancel()
    assert job.check().state is ew.JobState.CANCELLED
    assert set(_listed(tsp)) == {ids[0]}  # the queued ones removed, the running one killed
    assert _listed(tsp)[ids[0]][0] == "finished"


def test_cancelling_one_task_leaves_the_others_to_finish(tsp):
    cl = ew.batch(TARGET, slots=4)
    job = ew.submit(sleepy, [0, 60, 0, 0], on=cl)
    _wait(lambda: job.tasks[1].state is ew.TaskState.RUNNING, job.check)
    victim = _entries(cl, job)[1]
    assert victim["tasks"] == [1]
    assert job.tasks[1].cancel() is True
    job.wait(timeout=30)
    assert job.tasks[1].state is ew.TaskState.CANCELLED
    assert job.check().state is ew.JobState.FINISHED
    res = job.results(partial=True)
    assert res[0] == 0 and res[2] == 0 and res[3] == 0
    assert "killed by signal" in tsp("-i", str(victim["id"])).stdout  # tsp -k stopped it
    assert job.tasks[0].cancel() is False  # it has ended: nothing to cancel


def test_cancelling_a_queued_task_removes_its_tsp_job_and_is_not_lost(tsp):
    tsp("-S", "1")
    cl = ew.batch(TARGET, tasks_per_job=1)
    job = ew.submit(sleepy, [1, 0], on=cl)
    ids = [e["id"] for e in _entries(cl, job)]
    assert _listed(tsp)[ids[1]][0] == "queued"
    assert job.tasks[1].cancel() is True
    assert ids[1] not in _listed(tsp)
    job.wait(timeout=30)
    assert job.tasks[1].state is ew.TaskState.CANCELLED
    assert job.check().state is ew.JobState.FINISHED and job.results(partial=True)[0] == 1


def test_a_killed_tsp_job_loses_its_task_with_a_reason(tsp):
    cl = ew.batch(TARGET, slots=3)
    job = ew.submit(sleepy, [0, 60, 0], on=cl)
    victim = _entries(cl, job)[1]
    _wait(
        lambda: job.check().counts["finished"] == 2 and job.tasks[1].state is ew.TaskState.RUNNING,
        job.check,
    )
    tsp("-k", str(victim["id"]))
    job.wait(timeout=30)
    res = job.results()
    assert res[0] == 0 and res[2] == 0
    # found by the plugin's poll (tsp's exit status) or by the library (a worker of this machine)
    assert isinstance(res[1], ew.TaskError) and res[1].reason == "lost"
    assert "without a result" in res[1].message
    assert job.check().state is ew.JobState.FAILED


def test_a_tsp_job_removed_from_the_queue_loses_its_tasks_with_the_plugins_reason(tsp):
    tsp("-S", "1")
    cl = ew.batch(TARGET, tasks_per_job=2)
    job = ew.submit(sleepy, [1, 0, 0], on=cl)
    victim = _entries(cl, job)[1]
    assert victim["tasks"] == [2] and _listed(tsp)[victim["id"]][0] == "queued"
    assert tsp("-r", str(victim["id"])).returncode == 0  # gone before it ran: only poll can tell
    job.wait(timeout=30)
    res = job.results()
    assert res[:2] == [1, 0]
    assert isinstance(res[2], ew.TaskError) and res[2].reason == "lost"
    assert f"tsp job {victim['id']} ({victim['label']}) is gone from tsp's list" in res[2].message


def test_a_lost_task_runs_again_while_retries_last(tsp, tmp_path):
    cl = ew.batch(TARGET, slots=1)
    job = ew.submit(sleepy_once, [str(tmp_path / "m")], on=cl, retries=1)
    _wait(
        lambda: (tmp_path / "m").exists() and job.tasks[0].state is ew.TaskState.RUNNING, job.check
    )
    first = _entries(cl, job)[0]["id"]
    tsp("-k", str(first))
    job.wait(timeout=30)
    assert job.results() == ["rerun"]
    entries = _entries(cl, job)
    assert len(entries) == 2 and entries[1]["tasks"] == [0]  # asked for exactly the lost task
    assert "killed by signal" in tsp("-i", str(first)).stdout
    _wait(lambda: _listed(tsp)[entries[1]["id"]][0] == "finished", lambda: tsp("-l").stdout)
    assert "died with exit code 0" in tsp("-i", str(entries[1]["id"])).stdout


def test_retry_of_a_failed_task_is_a_new_tsp_job(tsp, tmp_path):
    cl = ew.batch(TARGET, slots=2)
    job = ew.submit(flaky, [str(tmp_path / "a"), str(tmp_path / "b")], on=cl)
    job.wait(timeout=30)
    assert job.check().state is ew.JobState.FAILED
    (tmp_path / "b").unlink()  # task 1 would fail again; only task 0 is asked for
    job.retry([0])
    job.wait(timeout=30)
    assert job.results()[0] == "second attempt"
    assert isinstance(job.results()[1], ew.TaskError)
    entries = _entries(cl, job)
    assert len(entries) == 3 and entries[-1]["tasks"] == [0]
    _wait(lambda: _listed(tsp)[entries[-1]["id"]][0] == "finished", lambda: tsp("-l").stdout)
    with pytest.raises(ew.StateError, match="cannot move from finished"):
        job.retry([0])


CLIENT = f"""
import time
import elsewhere as ew
def slow(x):
    time.sleep(0.5)
    return -x
ew.submit(slow, range(4), name="tsp-detached", on=ew.batch("{TARGET}", slots=2, socket={{sock!r}}))
print("ok", flush=True)
"""


def test_submit_in_one_process_recover_in_another(tsp, tmp_path):
    script = tmp_path / "c.py"
    script.write_text(CLIENT.format(sock=tsp.socket))
    env = {k: v for k, v in os.environ.items() if k != "TS_SOCKET"}  # the socket is a setting
    subprocess.run([sys.executable, str(script)], check=True, timeout=30, env=env)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import elsewhere as ew; j = ew.recover('tsp-detached'); "
            "print(type(j.cluster).__name__, j.cluster.socket, flush=True); "
            "j.wait(timeout=30, progress=False); print(j.results())",
        ],
        capture_output=True,
        text=True,
        timeout=45,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [f"TspCluster {tsp.socket}", "[0, -1, -2, -3]"]
    assert sum("[ew-" in rest for _, rest in _listed(tsp).values()) == 2


def test_purge_leaves_nothing(tsp):
    cl = ew.batch(TARGET, slots=2)
    done = ew.submit(square, range(4), on=cl, name="tsp-done")
    done.wait(timeout=30)
    outputs = [tsp("-o", str(e["id"])).stdout.strip() for e in _entries(cl, done)]
    assert all(
        os.path.exists(o) and o.startswith(os.environ["TMPDIR"]) for o in outputs
    )  # tsp's own
    tsp("-S", "1")
    busy = ew.submit(sleepy, [60, 60], on=cl, name="tsp-busy")
    _wait(lambda: busy.tasks[0].state is ew.TaskState.RUNNING, busy.check)
    busy_ids = [e["id"] for e in _entries(cl, busy)]
    pid = int(tsp("-p", str(busy_ids[0])).stdout)
    folders = [done.path, busy.path]
    done.purge()
    busy.purge()
    assert not any(f.exists() for f in folders)
    assert _listed(tsp) == {}
    assert not any(os.path.exists(o) for o in outputs)
    assert tsp_server.gone(pid)
    assert not {"tsp-done", "tsp-busy"} & {j.name for j in ew.jobs()}
    with pytest.raises(ew.JobNotFound):
        ew.recover("tsp-done")


def test_settings_and_additional_properties(tsp):
    with pytest.raises(ew.ConfigError, match="slots"):
        ew.batch(TARGET, slots=0)
    with pytest.raises(ew.ConfigError, match=r"unknown additional property 'lable'.*label"):
        ew.batch(TARGET, additional_properties={"lable": "x"})
    with pytest.raises(ew.ConfigError, match="job_slots"):
        ew.batch(TARGET, additional_properties={"job_slots": "2"})
    assert ew.batch(TARGET).additional_properties == {"job_slots": 0, "label": "ew"}
    with pytest.raises(ew.ConfigError, match="no-such-tsp"):
        ew.submit(square, [1], on=ew.batch(TARGET, command="no-such-tsp"))
    cl = ew.batch(TARGET, slots=3, additional_properties={"job_slots": 2, "label": "mine"})
    job = ew.submit(square, range(3), on=cl)
    job.wait(timeout=30)
    assert job.results() == [0, 1, 4]
    assert tsp("-S").stdout.strip() == "3"  # slots= set the server's slots
    entries = _entries(cl, job)
    assert [e["tasks"] for e in entries] == [[0, 1, 2]]  # 3 slots, 2 a tsp job: one at a time
    info = tsp("-i", str(entries[0]["id"])).stdout
    assert "Slots required: 2" in info
    assert _listed(tsp)[entries[0]["id"]][1].count(f"[mine-{job.id}-0]") == 1
    rebuilt = type(cl).from_settings(cl.settings())
    assert rebuilt.settings() == cl.settings()


def test_a_submission_tsp_refuses_half_way_leaves_nothing_queued(tsp, tmp_path):
    fake = tmp_path / "tsp-full"  # queues the first tsp job, refuses the second
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-L" ]; then\n'
        f'  if [ -e {tmp_path}/once ]; then echo "queue full" >&2; exit 2; fi\n'
        f"  touch {tmp_path}/once\n"
        "fi\n"
        f'exec {tsp_server.TSP} "$@"\n'
    )
    fake.chmod(0o755)
    with pytest.raises(ew.SchedulerError, match="did not queue") as err:
        ew.submit(
            sleepy, [60, 60, 60], on=ew.batch(TARGET, slots=2, command=str(fake)), name="tsp-half"
        )
    assert "queue full" in err.value.stderr
    assert (tmp_path / "once").exists()
    # taken back: the one tsp job queued is removed or killed; a loaded machine may take a
    # while to reap it, and a worker that ran on would end otherwise than by a signal
    _wait(lambda: all(state == "finished" for state, _ in _listed(tsp).values()), lambda: _listed(tsp))
    for tsp_id in _listed(tsp):
        assert "Exit status: killed by signal" in tsp("-i", str(tsp_id)).stdout
    assert "tsp-half" not in {j.name for j in ew.jobs()}
    with pytest.raises(ew.ConfigError, match="take 3 slots"):
        ew.submit(square, [1], on=ew.batch(TARGET, slots=2, cores_per_task=3))


def test_an_executor_runs_on_tsp(tsp):
    with ew.Executor(on=ew.batch(TARGET, slots=2)) as ex:
        futures = [ex.submit(square, k) for k in range(6)]
        assert [f.result(timeout=60) for f in futures] == [k * k for k in range(6)]
