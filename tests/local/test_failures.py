"""Lost workers, crashes, a killed client: nothing finished is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import elsewhere as ew

pytestmark = pytest.mark.timeout(120)


def _abort_on(x, bad):
    if x == bad:
        os.abort()
    return x


def test_segfaulting_task_is_lost_others_kept(ew_home):
    job = ew.submit(_abort_on, range(20), [7] * 20, name="crash", on=ew.local(cores=2))
    job.wait(timeout=60)
    res = job.results()
    assert [r for i, r in enumerate(res) if i != 7] == [i for i in range(20) if i != 7]
    err = res[7]
    assert isinstance(err, ew.TaskError) and err.reason == "lost"
    assert job.tasks[7].state is ew.TaskState.FAILED
    assert job.check().state is ew.JobState.FAILED
    assert "Fatal Python error: Aborted" in job.log(7)  # the crash report is the task's log
    assert "Fatal Python error" in err.message


def _abort_first_time(x, marker_dir):
    marker = os.path.join(marker_dir, f"{x}.tried")
    if x == 4 and not os.path.exists(marker):
        open(marker, "w").close()
        os.abort()
    return x * 10


def test_lost_task_is_retried_with_retries(ew_home, tmp_path):
    job = ew.submit(_abort_first_time, range(8), [str(tmp_path)] * 8, retries=1, on=ew.local(cores=2))
    job.wait(timeout=60)
    assert job.results() == [x * 10 for x in range(8)]


class _KillsWhenPickled:
    """A value whose pickling kills the process (as a value too large for its worker's memory
    would, or a crash in a library's reduce)."""

    def __reduce__(self):
        os._exit(9)


def _result_kills_its_worker(x, bad):
    return _KillsWhenPickled() if x == bad else x


def test_a_result_that_kills_its_worker_fails_its_own_task_alone(ew_home):
    # Its value is pickled with others (a batch of tiny tasks: one body): the death charges
    # none of them; they come back one by one, each written alone, and it is found. Not one
    # worker after another killed for ever, nor another task failed in its place.
    one = ew.local(cores=1)
    assert ew.map(_result_kills_its_worker, [0], [-1], on=one) == [0]  # warm, with this module loaded
    job = ew.submit(_result_kills_its_worker, range(50), [20] * 50, on=one)
    job.wait(timeout=60)
    res = job.results()
    assert isinstance(res[20], ew.TaskError) and res[20].reason == "lost", res[20]
    assert [r for i, r in enumerate(res) if i != 20] == [i for i in range(50) if i != 20]


class _LooksAtItsWorker:
    """A value that, when its worker pickles it, writes down which task the worker's map names
    (the reaper's reading, should the worker die now), and pickles as 0."""

    def __init__(self, out):
        self.out = out

    def __reduce__(self):
        import glob
        import struct

        task = ew.task()
        folder = os.path.join(os.environ["ELSEWHERE_HOME"], "jobs", task.job_id)
        named = []
        for cur in glob.glob(os.path.join(folder, "workers", "*.cur")):
            with open(cur, "rb") as f:
                named.append(struct.unpack("<qdq", f.read(24))[0])
        with open(self.out, "a") as f:
            f.write(f"{task.index} {named}\n")
        return (int, (0,))


def _looks_at_its_worker(x, out):
    return _LooksAtItsWorker(out)


def test_while_a_result_is_pickled_the_worker_map_names_its_task(ew_home, tmp_path):
    one = ew.local(cores=1)
    # a warm worker that has loaded this module: its task takes microseconds, its outcome is
    # written after it, when no task runs
    assert ew.map(_looks_at_its_worker, [0], [str(tmp_path / "warm.txt")], on=one) == [0]
    out = tmp_path / "seen.txt"
    assert ew.map(_looks_at_its_worker, [0], [str(out)], on=one) == [0]
    assert out.read_text().splitlines() == ["0 [0]"]


def _pid_then_sleep(x, d):
    if x == 2:
        with open(os.path.join(d, "pid"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
    return x


def test_sigkilled_worker_detected(ew_home, tmp_path):
    job = ew.submit(_pid_then_sleep, range(6), [str(tmp_path)] * 6, on=ew.local(cores=2))
    pidfile = tmp_path / "pid"
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    job.wait(timeout=60)
    res = job.results()
    assert res[2].reason == "lost" and [r for i, r in enumerate(res) if i != 2] == [0, 1, 3, 4, 5]


CLIENT = textwrap.dedent(
    """
    import sys, time
    import elsewhere as ew

    def slow(x):
        time.sleep(0.3)
        return x * x

    job = ew.submit(slow, range(12), name="detached", on=ew.local(cores=2))
    print("submitted", flush=True)
    time.sleep(60)
    """
)


def test_client_killed_then_recover_gets_every_result(ew_home, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=dict(os.environ))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"submitted"
    time.sleep(0.5)
    proc.kill()  # SIGKILL mid-job
    proc.wait(timeout=10)
    out = subprocess.run(
        [sys.executable, "-c",
         "import elsewhere as ew; j = ew.recover('detached'); j.wait(timeout=60, progress=False); "
         "print(j.results())"],
        capture_output=True, text=True, timeout=90, env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([x * x for x in range(12)])


def test_registry_survives_concurrent_submitters(ew_home, tmp_path):
    code = "import elsewhere as ew\nfor i in range(8):\n    ew.submit(abs, [i], name=f'{NAME}-{i}')\n"
    procs = [
        subprocess.Popen([sys.executable, "-c", code.replace("{NAME}", f"p{k}")], env=dict(os.environ))
        for k in range(3)
    ]
    for p in procs:
        assert p.wait(timeout=90) == 0
    names = {j["name"] for j in ew.jobs()}
    assert names == {f"p{k}-{i}" for k in range(3) for i in range(8)}
    for name in names:
        ew.recover(name).wait(timeout=60)


def _imports_a_missing_module(x):
    import lab_module_nowhere  # noqa: F401  (not installed, not on any path)

    return x


def test_a_missing_module_says_where_it_must_be(ew_home):
    out = ew.map(_imports_a_missing_module, [1], errors="return")
    err = out[0]
    assert isinstance(err, ew.TaskError) and err.type_name == "ModuleNotFoundError"
    assert "No module named 'lab_module_nowhere'" in err.message
    assert "must be importable on" in err.message and "files=" in err.message


def _starts_slowly_then_killed(tmp_path):
    """A python= wrapper whose interpreter waits 3 s before it starts, and writes its pid."""
    wrapper = tmp_path / "slow-python"
    wrapper.write_text(f'#!/bin/sh\necho $$ >> {tmp_path}/pids\nsleep 3\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_workers_that_cannot_start_halt_the_job_with_their_output(ew_home, tmp_path, monkeypatch):
    """An interpreter that exits at once (a broken python=) is not started for ever: after
    ten in a row (three here: the polls of this process decide), the job halts and says why,
    with what they printed."""
    from elsewhere.backends import local

    monkeypatch.setattr(local, "_START_LOSSES", 3)
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'libpython3.11.so: cannot open shared object file' >&2\nexit 127\n")
    broken.chmod(0o755)
    job = ew.submit(abs, [-1, -2], on=ew.local(cores=1, python=str(broken)), name="broken")
    job.wait(timeout=90)
    res = job.results()
    assert all(isinstance(r, ew.TaskError) for r in res), res
    assert "3 workers in a row ended before they joined" in res[0].message
    assert "cannot open shared object file" in res[0].message


def test_workers_killed_while_they_start_are_replaced_not_counted_as_broken(ew_home, tmp_path, monkeypatch):
    """Workers SIGKILLed from outside while their interpreter starts (here: five in a row,
    more than the three that halt a job whose interpreter cannot start, ten unless a test
    says so) are replaced, and the job ends with every value."""
    import threading

    from elsewhere.backends import local

    monkeypatch.setattr(local, "_START_LOSSES", 3)
    wrapper = _starts_slowly_then_killed(tmp_path)
    job = ew.submit(abs, [-1, -2, -3], on=ew.local(cores=1, python=str(wrapper)), name="killed")
    waiter = threading.Thread(target=job.wait, kwargs={"timeout": 150}, daemon=True)
    waiter.start()  # the wait polls the job: it starts the replacements
    pids_file, killed = tmp_path / "pids", set()
    deadline = time.monotonic() + 120
    while len(killed) < 5:
        assert time.monotonic() < deadline, f"only {len(killed)} workers were started to kill"
        for line in pids_file.read_text().split() if pids_file.exists() else []:
            if int(line) not in killed:
                killed.add(int(line))
                os.kill(int(line), signal.SIGKILL)
        time.sleep(0.05)
    waiter.join(150)
    assert job.results() == [1, 2, 3]


def test_a_worker_that_left_without_a_task_is_not_damage_but_one_that_ran_tasks_is(ew_home):
    """A worker that joined, found nothing left to claim and left wrote no journal: that is
    not damage. One that claimed tasks and has no journal is."""
    job = ew.submit(abs, [-1, -2], on=ew.local(cores=1), name="idle-member")
    job.wait(timeout=60)
    with job.handle.store.locked_queue() as q:
        q.join("idle-w", {"pid": 1, "host": "h"})
        q.set_member("idle-w", "left")
    assert "damaged" not in str(job.check()), job.check()
    with job.handle.store.locked_queue() as q:
        q.join("ran-w", {"pid": 1, "host": "h"})
        q.set_member("ran-w", "active", claim=[0, 1])
        q.set_member("ran-w", "left", claim=[])
    assert "journal/ran-w.rec is missing" in str(job.check())
