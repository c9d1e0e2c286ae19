"""The public API against real, detached local worker processes."""

from __future__ import annotations

import concurrent.futures as cf
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

import elsewhere as ew
from elsewhere.util.errors import RemoteTraceback

pytestmark = pytest.mark.timeout(120)


def test_map_pow(ew_home):
    assert ew.map(pow, [1, 2, 3], [2, 2, 2]) == [1, 4, 9]


def test_map_non_uniform_numpy_outputs(ew_home):
    np = pytest.importorskip("numpy")
    out = ew.map(lambda n: np.random.rand(n, n), [1, 2, 3])
    assert [a.shape for a in out] == [(1, 1), (2, 2), (3, 3)]


def test_empty_inputs(ew_home):
    # map as the built-in one: nothing in, nothing out, at once (a job without tasks
    # would wait for ever); submit and a created job say there is nothing to run
    assert ew.map(abs, []) == []
    assert ew.map(pow, iter([]), []) == []
    with pytest.raises(ew.ConfigError, match="nothing to run"):
        ew.submit(abs, [])
    job = ew.create_job(name="empty")
    with pytest.raises(ew.ConfigError, match="no tasks"):
        job.submit()
    job.add_task(abs, -3)
    assert job.submit().wait(timeout=60).results() == [3]
    assert [r["name"] for r in ew.jobs()] == ["empty"]


def test_inputs_of_different_lengths(ew_home):
    import itertools

    # lists that do not match would lose tasks without a word (as zip does): refused
    with pytest.raises(ew.ConfigError, match=r"different lengths \(3, 2\)"):
        ew.map(pow, [1, 2, 3], [2, 2])
    # an unsized input (a generator, itertools.repeat) zips to the others, as in map()
    assert ew.map(pow, [1, 2, 3], itertools.repeat(2)) == [1, 4, 9]


def test_ten_thousand_tasks(ew_home):
    out = ew.map(lambda x: x * 2, range(10_000))
    assert out == [x * 2 for x in range(10_000)]


def _boom(x):
    if x == 3:
        raise ValueError(f"bad input {x}")
    return x


def test_map_raises_first_task_error_with_remote_traceback(ew_home):
    with pytest.raises(ew.TaskError) as info:
        ew.map(_boom, range(6))
    err = info.value
    assert isinstance(err, ValueError)  # the original type, where it can be rebuilt
    assert err.index == 3 and err.type_name == "ValueError" and "bad input 3" in str(err)
    assert "task 3" in str(err)
    assert isinstance(err.__cause__, RemoteTraceback)
    assert "_boom" in err.__cause__.tb and "raise ValueError" in err.traceback
    assert err.host and err.seed is not None


def test_map_errors_return(ew_home):
    out = ew.map(_boom, range(6), errors="return")
    assert out[:3] == [0, 1, 2] and out[4:] == [4, 5]
    assert isinstance(out[3], ew.TaskError) and out[3].type_name == "ValueError"
    assert "bad input 3" in out[3].message


def _returns_an_error_value(x):
    return ew.TaskError(f"a value, not a failure ({x})", type_name="Note") if x == 1 else x


def test_a_task_error_returned_as_a_value_is_a_value(ew_home):
    # only failed tasks raise: a task may return a TaskError (say, from an inner map)
    out = ew.map(_returns_an_error_value, range(3))
    assert out[0] == 0 and out[2] == 2
    assert isinstance(out[1], ew.TaskError) and "a value, not a failure (1)" in out[1].message
    assert ew.submit(_returns_an_error_value, range(3)).wait(timeout=60).get()[1].type_name == "Note"


def test_wait_ends_when_another_process_cancels(ew_home):
    # Job.wait reads only the journals while tasks are unfinished; a cancel written to
    # the queue by someone else must still end the wait.
    job = ew.submit(time.sleep, [30] * 4, name="cancelled-elsewhere", on=ew.local(cores=2))
    timer = threading.Timer(0.5, lambda: ew.recover("cancelled-elsewhere").cancel())
    timer.start()
    t0 = time.monotonic()
    try:
        job.wait(timeout=20)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 20
    assert job.state is ew.JobState.CANCELLED


def test_wait_ends_when_another_process_purges_the_job(ew_home):
    job = ew.submit(time.sleep, [30] * 2, name="purged-elsewhere", on=ew.local(cores=2))
    timer = threading.Timer(0.5, lambda: ew.recover("purged-elsewhere").purge())
    timer.start()
    try:
        with pytest.raises(ew.JobError, match="is gone: it was purged"):
            job.wait(timeout=20)  # not a wait for ever on a folder that is gone
    finally:
        timer.cancel()


def test_submit_check_wait_results_get_log(ew_home):
    def fit(x):
        print(f"fitting {x}")
        os.system(f"echo from-a-child-process-{x}")  # output at the file-descriptor level
        return [x, x * x]

    job = ew.submit(fit, range(4), name="fits", seed=7, on=ew.local(cores=2))
    job.wait(timeout=60)
    st = job.check()
    assert st and st.counts["finished"] == 4 and st.state is ew.JobState.FINISHED
    assert job.results() == [[0, 0], [1, 1], [2, 4], [3, 9]]
    assert job.get() == [0, 0, 1, 1, 2, 4, 3, 9]  # lists concatenated
    log = job.log(3)
    assert "fitting 3" in log and "from-a-child-process-3" in log and "fitting 2" not in log
    assert job.tasks[0].state is ew.TaskState.FINISHED and job.tasks[0].host
    assert job.started and job.finished and job.finished >= job.started


def test_task_context(ew_home):
    def ctx(_):
        t = ew.task()
        return (t.index, t.job, t.cores, t.seed)

    out = ew.map(ctx, range(3), name="ctxjob", seed=100, on=ew.local(cores=1, cores_per_task=1))
    assert out == [(0, "ctxjob", 1, 100), (1, "ctxjob", 1, 101), (2, "ctxjob", 1, 102)]
    with pytest.raises(RuntimeError):
        ew.task()


def test_seeds_reproducible(ew_home):
    def draw(_):
        import numpy as np

        return random.random(), float(np.random.rand())

    a = ew.map(draw, range(5), seed=42)
    b = ew.map(draw, range(5), seed=42)
    c = ew.map(draw, range(5), seed=43)
    assert a == b
    assert a != c
    assert len({x for x, _ in a}) == 5  # each task its own stream


def test_numpy_random_rand_itself_as_the_task_function_is_seeded_per_task(ew_home):
    # the classic example (cellfun(@rand, ...)): each task its own numbers, those of its seed
    np = pytest.importorskip("numpy")
    got = ew.map(np.random.rand, [2] * 4, seed=5, on=ew.local(cores=2))
    wrapped = ew.map(lambda n: np.random.rand(n), [2] * 4, seed=5, on=ew.local(cores=2))
    assert len({tuple(a) for a in got}) == 4
    assert [a.tolist() for a in got] == [a.tolist() for a in wrapped]


def test_dataframe_rows_as_keyword_arguments(ew_home):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2, 3], "b": [10, 20, 30]})
    assert ew.map(lambda a, b: a + b, df) == [11, 22, 33]
    job = ew.submit(lambda a, b: pd.DataFrame({"s": [a + b]}), df)
    job.wait(timeout=60)
    combined = job.get()
    assert list(combined["s"]) == [11, 22, 33]


def test_unserialisable_input_names_the_object(ew_home):
    lock = threading.Lock()
    with pytest.raises(ew.SerializationError) as info:
        ew.submit(lambda x: x, [1, lock, 3])
    msg = str(info.value)
    assert "argument 0 of task 1" in msg and "lock" in msg.lower()
    assert ew.jobs() == []  # nothing left behind


def test_unserialisable_closure_names_the_variable(ew_home):
    lock = threading.Lock()

    def uses_lock(x):
        with lock:
            return x

    with pytest.raises(ew.SerializationError) as info:
        ew.submit(uses_lock, [1])
    assert "closure variable 'lock'" in str(info.value)


def test_name_in_use_while_running(ew_home):
    job = ew.submit(time.sleep, [1.0], name="unique")
    with pytest.raises(ew.NameInUse) as info:
        ew.submit(time.sleep, [0], name="unique")
    assert "unique" in str(info.value)
    job.wait(timeout=60)
    ew.submit(abs, [1], name="unique").wait(timeout=60)  # free again once the first is done


def test_recover_from_registry(ew_home):
    job = ew.submit(abs, [-1, -2], name="rec")
    job.wait(timeout=60)
    again = ew.recover("rec")
    assert again.id == job.id and again.results() == [1, 2]
    assert ew.recover(job.id).name == "rec"
    listed = {j["name"]: j for j in ew.jobs()}
    assert listed["rec"]["state"] == "finished" and listed["rec"]["counts"] == {"finished": 2}
    with pytest.raises(ew.JobNotFound):
        ew.recover("no-such-job")


def test_cancel_stops_running_tasks(ew_home, worker_pids):
    job = ew.submit(time.sleep, [30] * 6, name="long", on=ew.local(cores=2))
    deadline = time.monotonic() + 30
    while job.check().counts["running"] < 2:
        assert time.monotonic() < deadline, job.check()
        time.sleep(0.05)
    t0 = time.monotonic()
    job.cancel()
    st = job.check()
    assert st.state is ew.JobState.CANCELLED and st.counts["cancelled"] == 6
    job.wait(timeout=10)
    assert time.monotonic() - t0 < 10
    # Killed workers are gone (a process being killed may show as running for a moment);
    # at most idle ones remain.
    def running():
        out = []
        for p in worker_pids(ew_home):
            try:
                with open(f"/proc/{p}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state == "R":
                out.append(p)
        return out

    deadline = time.monotonic() + 10
    while running():
        assert time.monotonic() < deadline, f"workers still running after cancel: {running()}"
        time.sleep(0.05)
    assert isinstance(job.results()[0], ew.TaskError) and job.results()[0].reason == "cancelled"


def test_purge_removes_folder_and_registry_entry(ew_home):
    job = ew.submit(abs, [1], name="gone")
    job.wait(timeout=60)
    path = job.path
    job.purge()
    assert not path.exists()
    with pytest.raises(ew.JobNotFound):
        ew.recover("gone")


def test_a_finished_job_is_read_and_purged_by_the_look_that_saw_it_end(ew_home, monkeypatch):
    # ew.map's results and purge read the job's state again after its wait had read it done: a
    # third of a warm map's reading of the folder
    from elsewhere.folder.handle import JobHandle

    looks = []
    real = JobHandle.snapshot
    monkeypatch.setattr(JobHandle, "snapshot", lambda self: (looks.append(1), real(self))[1])
    job = ew.submit(abs, [-1, -2], name="looked-at")
    job.wait(timeout=60)
    assert looks, "the wait never looked at the job"
    looks.clear()
    path = job.path
    job.purge()
    assert looks == [] and not path.exists()


def test_map_asks_its_workers_to_wake_it_at_their_end_alone_unless_the_job_is_kept(ew_home, monkeypatch):
    # (a kept job may be followed later, as_completed: its results wake its client one by one)
    from elsewhere.api.job import Job

    seen = {}
    real = Job.wait
    monkeypatch.setattr(Job, "wait", lambda self, *a, **k: (seen.setdefault(self.name, self._meta.get("notify")),
                                                             real(self, *a, **k))[1])  # fmt: skip
    assert ew.map(abs, [-1, -2], name="purged-after") == [1, 2]
    assert ew.map(abs, [-3], name="kept", keep=True) == [3]
    job = ew.submit(abs, [-4], name="submitted")
    job.wait(timeout=60)
    assert seen == {"purged-after": "end", "kept": None, "submitted": None}


def test_map_leaves_no_job_behind_even_when_its_process_ends_right_after(ew_home):
    # ew.map on local workers purges its job once it has returned the values: in the
    # background, at the process's exit at the latest; ew.jobs() in the process waits for it
    assert ew.map(abs, [-1, -2]) == [1, 2]
    assert not ew.jobs()
    code = "import elsewhere as ew; assert ew.map(abs, [-3, -4]) == [3, 4]"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    left = [p.name for p in (ew_home / "jobs").iterdir() if not p.name.startswith(".")]
    assert left == [] and not ew.jobs()


def test_a_short_map_does_no_registry_work_and_a_long_one_is_listed_while_it_runs(ew_home, monkeypatch):
    from elsewhere.folder import housekeeping
    from elsewhere.folder.registry import Registry

    calls = []
    for op in ("add", "remove"):
        real = getattr(Registry, op)
        monkeypatch.setattr(Registry, op, lambda self, *a, _op=op, _real=real, **k: (calls.append(_op),
                                                                                     _real(self, *a, **k))[1])
    assert ew.map(abs, [-3]) == [3]  # a warm worker: the map below takes milliseconds, not a second
    housekeeping.drain()
    time.sleep(housekeeping.SYNC_DELAY_S + 0.2)
    calls.clear()
    assert ew.map(abs, [-1, -2]) == [1, 2]
    housekeeping.drain()  # its purge, which forgets its registration, not made yet
    time.sleep(housekeeping.SYNC_DELAY_S + 0.2)
    assert calls == []
    # one that runs longer than a second is listed meanwhile, and forgotten at its purge
    out = []
    mapper = threading.Thread(target=lambda: out.append(ew.map(time.sleep, [3.0])))
    mapper.start()
    deadline = time.monotonic() + 20
    while not [j for j in ew.jobs() if j["name"].startswith("sleep-")]:
        assert time.monotonic() < deadline, "the map's job was never listed"
        time.sleep(0.1)
    mapper.join(timeout=60)
    assert out == [[None]]
    deadline = time.monotonic() + 10  # (purged in the background: ew.jobs() here waits for a purge not begun)
    while ew.jobs() or calls != ["add", "remove"]:
        assert time.monotonic() < deadline, (ew.jobs(), calls)
        time.sleep(0.05)


def test_a_named_map_is_registered_at_once(ew_home):
    running = ew.submit(time.sleep, [2.0], name="taken")
    with pytest.raises(ew.NameInUse):
        ew.map(abs, [-1], name="taken")
    running.wait(timeout=60)


def test_a_map_whose_client_is_killed_in_its_first_second_is_listed_by_the_next_sweep(ew_home):
    from elsewhere.core.submit import sweep_unsubmitted

    code = textwrap.dedent("""
        import os, signal, time
        import elsewhere as ew
        import elsewhere.core.submit as S
        real = S.hand_over
        def hand_over(cluster, handle, **kw):
            real(cluster, handle, **kw)
            print(handle.id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # handed over, not registered yet
        S.hand_over = hand_over
        ew.map(time.sleep, [0.5, 0.5])
    """)
    assert not ew.jobs()  # (the registry made: a missing one is made anew from the job folders)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    job_id = proc.stdout.strip()
    assert not ew.jobs()
    sweep_unsubmitted(ew_home / "jobs", grace_s=0.0)
    job = ew.recover(job_id)  # listed: recovered, waited for, purged like any job
    job.wait(timeout=60)
    assert job.results() == [None, None]
    job.purge()


def test_wait_timeout(ew_home):
    job = ew.submit(time.sleep, [5], name="slow")
    with pytest.raises(ew.TimeoutError):
        job.wait(timeout=0.3)
    with pytest.raises(TimeoutError):  # also the builtin
        job.wait(timeout=0.1)
    with pytest.raises(ew.TimeoutError, match=r"did not reach finished .*1 (running|queued)"):
        job.wait(timeout=0.01)  # before the first full look at the job: the message still has its state
    job.cancel()


def test_create_job_step_by_step(ew_home, tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text("SCALE = 3\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("5")
    elsewhere_dir = tmp_path / "elsewhere_cwd"
    elsewhere_dir.mkdir()
    monkeypatch.chdir(elsewhere_dir)

    def simulate(p, steps=1):
        import model  # travels with files=

        x = int(open(os.path.join(os.path.dirname(model.__file__), "data", "x.txt")).read())
        return p * model.SCALE * steps + x + ew.task().job_data["offset"]

    job = ew.create_job(on=ew.local(), name="sweep", tag="plant30",
                        files=[tmp_path / "model.py", tmp_path / "data"], job_data={"offset": 1000})
    for p in (1, 2, 3):
        job.add_task(simulate, p, steps=10)
    assert job.state is ew.JobState.PENDING and len(job.tasks) == 3
    job.submit()
    job.wait(state="finished", timeout=60)
    assert job.results() == [1035, 1065, 1095]
    assert job.tag == "plant30" and job.user and job.created <= job.submitted
    assert job.tasks[0].state is ew.TaskState.FINISHED and job.tasks[0].host
    with pytest.raises(ew.JobError):
        job.add_task(simulate, 4)


def test_executor_as_completed_and_wait(ew_home):
    with ew.Executor(on=ew.local()) as ex:
        fut = ex.submit(pow, 2, 10)
        assert isinstance(fut, cf.Future)
        assert fut.result(timeout=60) == 1024
        futs = [ex.submit(pow, 3, i) for i in range(50)]
        got = {f.result() for f in cf.as_completed(futs, timeout=60)}
        assert got == {3**i for i in range(50)}
        done, not_done = cf.wait([ex.submit(abs, -5)], timeout=60)
        assert not not_done and done.pop().result() == 5
        bad = ex.submit(int, "x")
        with pytest.raises(ValueError):
            bad.result(timeout=60)
        assert list(ex.map(abs, [-1, -2, -3])) == [1, 2, 3]


def test_executor_burst_is_counted_in_the_queue_before_the_job_closes(ew_home, monkeypatch):
    # submits while others are pending are left to the executor's counter thread (one queue
    # update for many); shutting down right after a burst must still run every task
    ex = ew.Executor(on=ew.local(cores=2))
    futs = [ex.submit(pow, i, 2) for i in range(500)]
    ex.shutdown(wait=True)
    assert [f.result(timeout=0) for f in futs] == [i * i for i in range(500)]
    # even when the counter thread has not come round to it (here: never does)
    from elsewhere.api.streaming import Stream

    monkeypatch.setattr(Stream, "_count_tasks", lambda self: None)
    ex = ew.Executor(on=ew.local(cores=2))
    futs = [ex.submit(pow, i, 3) for i in range(200)]
    assert ex.job.store.queue().n < 200  # only the first (a lone task) is counted yet
    ex.shutdown(wait=True)
    assert [f.result(timeout=0) for f in futs] == [i**3 for i in range(200)]
    monkeypatch.undo()
    lone = ew.Executor(on=ew.local(cores=1))
    assert lone.submit(pow, 3, 2).result(timeout=60) == 9  # a lone task, counted at once
    lone.shutdown()


def test_get_combines_lists(ew_home):
    job = ew.submit(lambda x: [x, -x], [1, 2])
    job.wait(timeout=60)
    assert job.get() == [1, -1, 2, -2]
    assert job.results() == [[1, -1], [2, -2]]


def test_cores_limit_one_at_a_time(ew_home):
    def span(_):
        t0 = time.time()
        time.sleep(0.2)
        return (t0, time.time())

    spans = sorted(ew.map(span, range(4), on=ew.local(cores=1)))
    for (a0, a1), (b0, _) in zip(spans, spans[1:]):
        assert b0 >= a1 - 0.01  # never overlapping


def test_seeds_match_eager_seeding_on_every_path(ew_home):
    # 300 quiet microsecond tasks: the first run one by one, the rest on the fast
    # path (one loop per chunk); each must see random and NumPy seeded for it.
    import numpy as np

    def draw(_):
        return random.random(), float(np.random.rand())

    got = ew.map(draw, range(300), seed=1000, on=ew.local(cores=2))
    want = [(random.Random(1000 + i).random(),
             float(np.random.RandomState(np.random.SeedSequence(1000, spawn_key=(i,)).generate_state(4)).rand()))
            for i in range(300)]
    assert got == want
    # without seeds, the real functions run: no two tasks of a worker share a stream start
    unseeded = ew.map(lambda _: random.random(), range(50), seed=False, on=ew.local(cores=1))
    assert len(set(unseeded)) == 50


def test_a_module_first_loaded_inside_the_fast_loop_is_seeded_for_its_task(ew_home):
    # A worker that has neither random nor NumPy loaded runs tiny tasks on the fast path
    # telling the seeder only the task index; task 200 imports both: it must draw what
    # eager seeding gives task 200, and every task after it its own numbers.
    np = pytest.importorskip("numpy")

    def late(i):
        if i < 200:
            return i
        import sys

        fresh = i == 200 and "numpy" not in sys.modules and "random" not in sys.modules
        import random as r

        import numpy

        return fresh, r.random(), float(numpy.random.rand())

    got = ew.map(late, range(400), seed=31, on=ew.local(cores=1))
    assert got[:200] == list(range(200))
    assert got[200][0], "the worker had random or NumPy loaded already: the test proves nothing"
    want = [(random.Random(31 + i).random(),
             float(np.random.RandomState(np.random.SeedSequence(31, spawn_key=(i,)).generate_state(4)).rand()))
            for i in range(200, 400)]
    assert [g[1:] for g in got[200:]] == want


@pytest.mark.filterwarnings("ignore:local cluster asked for")
def test_new_workers_each_lead_their_own_session(ew_home):
    # A cold pool starts one interpreter that forks the other workers: each
    # must still be a session leader (cancel kills a worker's process group).
    def where(_):
        time.sleep(0.05)
        return os.getpid(), os.getsid(0)

    out = set(ew.map(where, range(30), on=ew.local(cores=3)))
    pids = {pid for pid, _ in out}
    assert len(pids) == 3
    assert all(pid == sid for pid, sid in out)


def test_workers_that_ended_are_not_left_as_zombies(ew_home):
    # The client starts workers as its own children; once they end (idle timeout),
    # it collects them, so a long-lived notebook does not pile up zombies.
    from elsewhere.backends import localworkers as local_backend  # the processes it started

    earlier = set(local_backend._spawned)  # (workers of earlier tests in this process, not yet reaped)
    cluster = ew.local(cores=2, idle_timeout_s=0.2)
    assert ew.map(abs, [-1, -2], on=cluster) == [1, 2]
    pids = [p for p in local_backend._spawned if p not in earlier]
    assert pids

    def state(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"

    deadline = time.monotonic() + 30
    while not all(state(p) in ("Z", "gone") for p in pids):  # they time out and exit
        assert time.monotonic() < deadline, [state(p) for p in pids]
        time.sleep(0.05)
    # any dispatch, poll or shutdown collects them: at once, but for a process whose last
    # threads are still going (its leader shows Z before they have: it cannot be collected yet;
    # once in the full suite), then at the next one
    deadline = time.monotonic() + 30
    while True:
        cluster.shutdown()
        if [state(p) for p in pids] == ["gone"] * len(pids):
            break
        assert time.monotonic() < deadline, [state(p) for p in pids]
        time.sleep(0.05)


def test_workers_start_where_posix_spawn_cannot_make_a_session(ew_home, monkeypatch):
    def refuse(*args, **kwargs):
        raise NotImplementedError("setsid is not supported by posix_spawn here")

    monkeypatch.setattr(os, "posix_spawn", refuse)

    def where(_):
        time.sleep(0.05)
        return os.getpid(), os.getsid(0)

    out = set(ew.map(where, range(10), on=ew.local(cores=2)))
    assert out and all(pid == sid for pid, sid in out)


def test_warm_workers_are_reused(ew_home):
    def pid(_):
        time.sleep(0.05)  # long enough that both workers take tasks
        return os.getpid()

    pids1 = set(ew.map(pid, range(20), on=ew.local(cores=2)))
    idle = ew.local().pool_dir() / "idle"
    deadline = time.monotonic() + 30
    while len(os.listdir(idle)) < len(pids1):  # workers go idle right after the job
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pids2 = set(ew.map(pid, range(20), on=ew.local(cores=2)))
    assert pids2 <= pids1


def test_bad_arguments_are_clear(ew_home):
    with pytest.raises(ew.ConfigError, match="iterable"):
        ew.submit(abs, 5)
    with pytest.raises(ew.ConfigError, match="cores"):
        ew.local(cores=0)
    with pytest.raises(ew.ConfigError, match="errors"):
        ew.map(abs, [1], errors="ignore")
    with pytest.raises(ew.ConfigError, match="seed"):
        ew.submit(abs, [1], seed=-1)
    # a keyword meant for the function is not taken for an option, nor lost
    with pytest.raises(ew.ConfigError, match=r"unknown option 'b'.*functools\.partial"):
        ew.map(pow, [1, 2], b=[3, 4])
    assert not list(ew.jobs())  # refused before a job was made


def test_warm_worker_sees_edited_user_module(ew_home, tmp_path, monkeypatch):
    (tmp_path / "usermod_ew.py").write_text("VALUE = 1\n\ndef get(_):\n    return VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import usermod_ew

    assert ew.map(usermod_ew.get, [0], on=ew.local(cores=1)) == [1]
    time.sleep(0.05)
    (tmp_path / "usermod_ew.py").write_text("VALUE = 2\n\ndef get(_):\n    return VALUE\n")
    import importlib

    importlib.reload(usermod_ew)
    assert ew.map(usermod_ew.get, [0], on=ew.local(cores=1)) == [2]


def _draw(i, bad):
    if i == bad:
        raise KeyError(i)
    return random.random()


@pytest.mark.parametrize(("n", "bad", "cores"), [(3000, 1500, 2), (20000, 9000, 1)])
def test_fast_batches_keep_seeds_errors_and_order(ew_home, n, bad, cores):
    # thousands of microsecond tasks run in fast batches (range records, which
    # run on across chunks of the payload while within 10 ms): the values, the
    # per-task seeds and an error in the middle must be as one by one
    job = ew.submit(_draw, range(n), [bad] * n, seed=11, on=ew.local(cores=cores))
    job.wait(timeout=60)
    out = job.results()
    assert any(rec.count > 1 for _, rec in job._reader.final.values())  # the fast path ran
    expected = []
    for i in range(n):
        random.seed(11 + i)
        expected.append(random.random())
    assert isinstance(out[bad], ew.TaskError) and out[bad].type_name == "KeyError"
    assert out[:bad] == expected[:bad] and out[bad + 1:] == expected[bad + 1:]


def test_a_warm_worker_notices_elsewhere_itself_reinstalled(tmp_path, monkeypatch):
    # Installed modules are not watched, except elsewhere's own: reinstalled in
    # place (same version, same pool), a warm worker must not run its old code.
    from elsewhere.folder import serial
    from elsewhere.run.worker import Worker

    site = tmp_path / "site-packages"
    site.mkdir()
    for name in ("elsewhere_probe_ew", "otherlib_probe_ew"):
        (site / f"{name}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(site))
    import elsewhere_probe_ew
    import otherlib_probe_ew

    w = Worker("probe")
    monkeypatch.setattr(serial, "_SYSTEM_PATHS", (str(site) + os.sep,))
    w._started_at = time.time()
    assert not w._user_code_changed()
    later = time.time() + 5
    os.utime(otherlib_probe_ew.__file__, (later, later))
    assert not w._user_code_changed()  # an installed library: not watched
    os.utime(elsewhere_probe_ew.__file__, (later, later))
    assert w._user_code_changed()


SCRIPT_WITH_ITS_OWN_ERROR = """
import elsewhere as ew

class FitFailed(Exception):
    pass

def fit(i):
    if i == 1:
        raise FitFailed(f"no convergence for {i}")
    return i

try:
    ew.map(fit, range(3), on=ew.local(cores=2))
except FitFailed as exc:
    print("caught FitFailed:", exc)
"""


def test_an_error_class_of_the_callers_script_is_raised_as_itself(ew_home, tmp_path):
    # the class travels by value to the worker; the error it raises travels back by value
    # and is the caller's own class again, so `except FitFailed` catches it
    import subprocess
    import sys

    script = tmp_path / "fit.py"
    script.write_text(SCRIPT_WITH_ITS_OWN_ERROR)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90,
                         env=dict(os.environ), cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "caught FitFailed: task 1 of job" in out.stdout and "no convergence for 1" in out.stdout


def test_a_cluster_that_does_not_send_files_says_so(ew_home, tmp_path, monkeypatch):
    from elsewhere.backends.local import LocalCluster

    class NoFiles(LocalCluster):  # a plug-in scheduler whose workers get no job files
        def sends_files(self) -> bool:
            return False

    (tmp_path / "data.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="does not send files= to its workers"):
        job = ew.create_job(on=NoFiles(cores=1), files=["data.txt"])
    job.purge()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the backends that send them: no warning
        ew.create_job(on=ew.local(cores=1), files=["data.txt"]).purge()


def test_one_large_object_in_every_task_is_pointed_out(ew_home, monkeypatch):
    """[a] * n stores a once per task: the user is told, at their own line, how to store it once."""
    from elsewhere.api import functions as api

    monkeypatch.setattr(api, "_REPEATED_WASTE_BYTES", 2 << 20)
    big = bytes(1 << 20)
    with pytest.warns(UserWarning, match=r"argument 2 of every task is the same 1\.0 MiB object.*3 times") as seen:
        assert ew.map(lambda i, b: len(b) + i, range(3), [big] * 3) == [1 << 20, (1 << 20) + 1, (1 << 20) + 2]
    assert seen[0].filename == __file__
    with pytest.warns(UserWarning, match="the input of every task is the same") as seen:
        ew.submit(len, [big] * 3).wait(timeout=60)
    assert seen[0].filename == __file__
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*every task is the same")  # different or small objects: no word
        assert ew.map(len, [bytes(1 << 20) for _ in range(3)]) == [1 << 20] * 3
        assert ew.map(lambda i, k: i + k, range(3), [7] * 3) == [7, 8, 9]


def test_jobs_and_executors_leave_no_descriptor_open(ew_home):
    # a registry connection per short-lived thread (an executor's) kept descriptors open: a
    # long session (a test run, a notebook) ran out of them
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    ew.map(abs, [-1])
    with ew.Executor(on=ew.local(cores=2)) as ex:
        ex.submit(abs, -1).result(timeout=60)
    before = open_fds()
    for _ in range(10):
        ew.map(abs, [-1, -2])
        with ew.Executor(on=ew.local(cores=2)) as ex:
            assert ex.submit(abs, -3).result(timeout=60) == 3
    assert open_fds() <= before + 4, sorted(os.listdir("/proc/self/fd"))
