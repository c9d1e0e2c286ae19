"""The task runner (elsewhere.run.runner) every worker, MPI rank and peer task process runs
tasks with: a job's surroundings entered once and left as they were, each task with its
context, seed and output range, an exception as the task's error record (elsewhere.folder.errorrecord),
and outcomes in the job folder's formats (elsewhere.run.results)."""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import elsewhere as ew
from elsewhere.folder import records
from elsewhere.folder.errorrecord import MARK, ErrorRecord
from elsewhere.folder.journal import read_body
from elsewhere.folder.store import CUR, SEVERAL, JobStore
from elsewhere.run.results import SYNC_S, ResultWriter, dump_values
from elsewhere.run.runner import JobSetup, TaskRunner, build_sys_path

STORED_KEYS = [MARK, "type", "message", "traceback", "host", "pid", "index", "seed", "exception", "bases"]


@contextlib.contextmanager
def worker_log(tmp_path: Path) -> Iterator[Path]:
    """File descriptors 1 and 2 on a file, as in a worker (its job's log). Inside the test's
    body: pytest puts its own capture back on them at each phase."""
    path = tmp_path / "worker.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield path
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for s in saved:
            os.close(s)


@pytest.fixture
def cur() -> Iterator[mmap.mmap]:
    m = mmap.mmap(-1, CUR.size)
    yield m
    m.close()


@pytest.fixture
def runner(cur: mmap.mmap, tmp_path: Path) -> Iterator[TaskRunner]:
    r = TaskRunner("here")
    yield r
    r.leave()
    if r.seeder is not None:
        r.seeder.disarm()


def enter(r: TaskRunner, cur: mmap.mmap, tmp_path: Path, fn: Any = None, **setup: Any) -> None:
    r.enter(JobSetup(name="job", job_id="id1", **setup), cur=cur, fallback_cwd=lambda: str(tmp_path),
            common=lambda: (fn, {"data": 1}))  # fmt: skip


def entry(*args: Any, fn: Any = None, **kwargs: Any) -> Any:
    return lambda _key: (fn, args, kwargs)


def test_a_job_is_entered_once_and_left_as_the_process_was(runner, cur, tmp_path, monkeypatch) -> None:
    with worker_log(tmp_path):
        here, path, mine = tmp_path / "caller", tmp_path / "lib", tmp_path / "files"
        for d in (here, path, mine):
            d.mkdir()
        monkeypatch.setenv("EW_KEPT", "before")
        monkeypatch.delenv("EW_NEW", raising=False)
        cwd0, path0 = os.getcwd(), list(sys.path)
        runner.enter(JobSetup(cwd=str(here), sys_path=[str(path), str(tmp_path / "gone")],
                              env={"EW_KEPT": "job", "EW_NEW": 3}),
                     cur=cur, fallback_cwd=lambda: str(tmp_path), front=[str(mine)])  # fmt: skip
        assert os.getcwd() == str(here)
        assert sys.path[:2] == [str(mine), str(path)] and str(tmp_path / "gone") not in sys.path
        assert (os.environ["EW_KEPT"], os.environ["EW_NEW"]) == ("job", "3")
        runner.leave()
        assert (os.getcwd(), sys.path) == (cwd0, path0)
        assert os.environ["EW_KEPT"] == "before" and "EW_NEW" not in os.environ


def test_a_working_directory_that_is_not_here_is_the_fallback(runner, cur, tmp_path) -> None:
    with worker_log(tmp_path):
        enter(runner, cur, tmp_path, cwd="/no/such/folder")
        assert os.getcwd() == str(tmp_path)


def test_a_foreign_python_leaves_the_callers_installed_packages_out(tmp_path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    code = tmp_path / "code"
    site.mkdir(parents=True)
    code.mkdir()
    job = ["", str(code), str(site)]
    assert build_sys_path([], job, ["/own"]) == ["", str(code), str(site), "/own"]
    assert build_sys_path(["/front"], job, ["/own", str(code)], foreign_python=True) == ["/front", str(code), "/own"]


def test_a_task_runs_with_its_context_and_seed_and_its_output_range(runner, cur, tmp_path) -> None:
    with worker_log(tmp_path) as log:

        def probe(x: int) -> tuple[Any, ...]:
            t = ew.task()
            os.write(1, f"out {x}\n".encode())  # (pytest holds sys.stdout while a test runs)
            return x, t.index, t.seed, t.attempt, t.job, t.cores, t.job_data, CUR.unpack_from(cur)[0]

        enter(runner, cur, tmp_path, fn=probe, seed=100, cores=2)
        first = runner.run(3, 1, entry(7), 3)
        second = runner.run(4, 0, entry(8), 4)
        runner.idle()
        assert first.ok and first.value == (7, 3, 103, 1, "job", 2, {"data": 1}, 3)
        assert (first.index, first.attempt, first.seed) == (3, 1, 103)
        text = log.read_bytes()
        assert text[first.log_off : first.log_off + first.log_len] == b"out 7\n"
        assert second.log_off == first.log_off + first.log_len and second.value[2] == 104
        assert CUR.unpack_from(cur)[0] == -1
        assert first.t_start <= first.t_end <= second.t_start and 0 <= first.busy_s <= first.t_end - first.t_start


def test_seeds_follow_the_job_seed_and_a_job_without_one_is_left_alone(runner, cur, tmp_path) -> None:
    with worker_log(tmp_path):
        enter(runner, cur, tmp_path, fn=random.random, seed=7)
        assert [runner.run(i, 0, entry(), i).value for i in (0, 5)] == [random.Random(7).random(),
                                                                        random.Random(12).random()]  # fmt: skip
        enter(runner, cur, tmp_path, fn=random.random, seed=None)
        random.seed(7)  # what the process set itself stays set: nothing is seeded per task
        assert runner.run(0, 0, entry(), 0).value == random.Random(7).random()


def test_an_exception_is_the_tasks_error_record(runner, cur, tmp_path) -> None:
    with worker_log(tmp_path):

        def fails(x: int) -> None:
            raise ValueError(f"bad {x}")

        enter(runner, cur, tmp_path, fn=fails, seed=10)
        o = runner.run(2, 0, entry(5), 2)
        assert not o.ok and list(o.value) == STORED_KEYS
        v = o.value
        assert (v["type"], v["message"], v["host"], v["pid"], v["index"], v["seed"]) == (
            "ValueError", "bad 5", "here", os.getpid(), 2, 12)
        assert "in fails" in v["traceback"] and pickle.loads(v["exception"]).args == ("bad 5",)
        err = ErrorRecord.from_value(v).task_error("job")
        assert isinstance(err, ew.TaskError) and (err.index, err.seed, err.type_name) == (2, 12, "ValueError")
        assert isinstance(err.as_original_type(), ValueError)


def test_an_error_loading_a_task_is_that_tasks_own(runner, cur, tmp_path) -> None:
    with worker_log(tmp_path):

        def broken(_key: Any) -> Any:
            raise ModuleNotFoundError("No module named 'mine'", name="mine")

        enter(runner, cur, tmp_path, seed=0)
        o = runner.run(1, 0, broken, 1)
        assert not o.ok and o.value["type"] == "ModuleNotFoundError"
        assert "must be importable on here" in o.value["message"]


def test_an_error_record_of_an_earlier_version_still_reads() -> None:
    old = {MARK: 1, "type": "KeyError", "message": "'k'", "traceback": "tb", "host": "h", "index": 4, "seed": 9}
    rec = ErrorRecord.from_value(old)
    assert (rec.type_name, rec.message, rec.pid, rec.exception) == ("KeyError", "'k'", 0, None)
    err = rec.task_error("j", index=4, seed=9)
    assert str(err) == "task 4 of job 'j' raised KeyError on h: 'k'" and err.exception is None
    assert list(rec.to_value()) == STORED_KEYS


def test_a_flood_of_quiet_tasks_runs_in_one_loop_and_stops_at_the_first_error(runner, cur, tmp_path) -> None:
    with worker_log(tmp_path):

        def inv(x: float) -> float:
            return 1 / x

        enter(runner, cur, tmp_path, seed=None)
        values: list[float] = []
        assert runner.run_quiet(inv, [1, 2, 4], True, 10, 10, 13, values.append, 0.0) is None
        assert values == [1.0, 0.5, 0.25] and ew.task().index == 12
        j, err = runner.run_quiet(lambda a, b: a / b, [(1, 1), (1, 0), (2, 1)], False, 0, 0, 3, values.append, 0.0)
        assert (j, err["type"], err["index"]) == (1, "ZeroDivisionError", 1) and values[-1] == 1.0


@pytest.mark.parametrize("loop", ["c", "python"])
def test_tasks_of_a_flood_see_their_own_index_and_seed_and_one_that_loads_random_seeds_the_rest(tmp_path,
                                                                                                loop) -> None:
    # In a process where random is not loaded (a worker that never drew a number), a flood's
    # tasks run in a loop in C (values to a list: the map says SEVERAL, ew.task() counts the
    # values) or in Python (values to a function, as a peer's: each task's index in the map
    # alone); either way ew.task() tells each its index and seed, a task that imports random
    # mid-flood gets its own seed, and so do the tasks after it, seeded one by one.
    script = textwrap.dedent("""
        import mmap, sys
        import elsewhere as ew
        from elsewhere.folder.store import CUR, SEVERAL
        from elsewhere.run.runner import JobSetup, TaskRunner
        assert "random" not in sys.modules
        cur = mmap.mmap(-1, CUR.size)
        r = TaskRunner("here")
        r.enter(JobSetup(name="j", job_id="i", seed=100), cur=cur, fallback_cwd=lambda: "/", common=None)
        in_c = sys.argv[1] == "c"

        def probe(x):
            t = ew.task()
            drew = None
            if x >= 3:
                import random
                drew = random.random()
            return x, t.index, t.seed, CUR.unpack_from(cur)[0], drew

        values = []
        add = values.append if in_c else (lambda v: values.append(v))
        assert r.run_quiet(probe, list(range(6)), True, 10, 10, 16, add, 0.0) is None
        import random
        want = [(x, 10 + x, 110 + x, SEVERAL if in_c and x <= 3 else 10 + x,
                 random.Random(110 + x).random() if x >= 3 else None) for x in range(6)]
        assert values == want, values
        assert (ew.task().index, ew.task().seed) == (15, 115)
        j, err = r.run_quiet(lambda x: 1 / x, [2, 1, 0, 4], True, 0, 0, 4, add, 0.0)
        assert (j, err["index"], err["seed"], ew.task().index) == (2, 2, 102, 2), (j, err)
        print("ok")
    """)
    log = tmp_path / "log"  # (a worker's output goes to a file: its tasks' byte ranges are read)
    with open(log, "w") as f:
        out = subprocess.run([sys.executable, "-c", script, loop], stdout=f, stderr=subprocess.PIPE, text=True,
                             timeout=60)  # fmt: skip
    assert log.read_text().strip() == "ok", out.stderr


def test_a_flood_in_c_counts_its_values_for_the_index_and_cuts_short_at_a_module_loaded(runner, cur,
                                                                                          tmp_path) -> None:
    # With seed=None nothing is seeded: the loop in C runs the whole chunk, after values
    # already in the list (the index counts from those); a task that raises stops it there,
    # the values before it kept; with tuples of arguments, fn(*a).
    with worker_log(tmp_path):
        enter(runner, cur, tmp_path, seed=None)
        values: list[Any] = ["earlier"]
        seen: list[int] = []

        def f(x: int) -> int:
            seen.append(ew.task().index)
            return 10 // x

        assert runner.run_quiet(f, [9, 1, 2, 5], True, 100, 101, 104, values.append, 0.0) is None
        assert values == ["earlier", 10, 5, 2] and seen == [101, 102, 103] and ew.task().index == 103
        assert CUR.unpack_from(cur)[0] == SEVERAL
        j, err = runner.run_quiet(lambda a, b: a // b, [(4, 2), (1, 0), (3, 1)], False, 7, 7, 10, values.append, 0.0)
        assert (j, err["index"], ew.task().index) == (8, 8, 8) and values[-1] == 2 and len(values) == 5


def test_a_job_setup_names_what_it_cannot_use() -> None:
    for bad, word in (({"cores": 0}, "cores"), ({"seed": "7"}, "seed"), ({"env": ["A=1"]}, "env"),
                      ({"sys_path": "/lib"}, "sys_path")):  # fmt: skip
        with pytest.raises(ValueError, match=word):
            JobSetup(name="j", **bad)
    s = JobSetup.from_meta({"name": "n", "id": "i", "cores_per_task": 2, "seed": 3, "cwd": "/x",
                            "sys_path": ["/a", 5], "env": {"A": 1}})  # fmt: skip
    assert (s.name, s.job_id, s.cores, s.seed, s.cwd, s.sys_path, s.env) == ("n", "i", 2, 3, "/x", ("/a",), {"A": "1"})


def test_a_value_that_cannot_be_pickled_becomes_its_tasks_error() -> None:
    values = [1, threading.Lock(), 3]
    data, _bufs, bad = dump_values(values, lambda k, exc: ErrorRecord.of_exception(exc, "h", 10 + k, 0))
    assert bad == [1] and pickle.loads(data)[::2] == [1, 3]
    assert pickle.loads(data)[1]["message"].startswith("the result of task 11 cannot be serialised: ")


def _writer(tmp_path: Path, runner: TaskRunner) -> tuple[JobStore, ResultWriter]:
    store = JobStore(tmp_path / "job")
    for sub in ("journal", "results", "logs"):
        (tmp_path / "job" / sub).mkdir(parents=True)
    return store, ResultWriter(store, "w1", runner.error)


def test_a_result_after_a_pause_is_written_at_once_and_synced_within_SYNC_S(runner, cur, tmp_path) -> None:
    # its client hears of it before any fsync; the fsync is due once it is SYNC_S old
    with worker_log(tmp_path):
        _store, out = _writer(tmp_path, runner)
        enter(runner, cur, tmp_path, fn=lambda x: x)
        out.pending.append(runner.run(0, 0, entry(1), 0))
        now = time.time()
        assert not out.sync_due(now)  # nothing written and unsynced before it
        out.flush(sync=out.sync_due(now))
        assert out.unsynced and not out.sync_due(out.dirty_since + SYNC_S / 2)  # (clock-free)
        assert out.sync_due(out.dirty_since + SYNC_S + 0.001)
        out.flush()  # before the worker waits: synced
        assert not out.unsynced
        out.close()


def test_the_late_writer_writes_and_fsyncs_results_while_a_long_task_runs(runner, cur, tmp_path, monkeypatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    with worker_log(tmp_path):
        _store, out = _writer(tmp_path, runner)
        enter(runner, cur, tmp_path, fn=lambda x: x)
        out.pending.append(runner.run(0, 0, entry(1), 0))
        journal = tmp_path / "job" / "journal" / "w1.rec"
        out.begin_task()  # the next task starts, and runs long
        try:
            deadline = time.monotonic() + 10
            while out.pending:  # written meanwhile (its frame first, then the list is emptied)
                assert time.monotonic() < deadline, "the late writer never wrote the pending outcome"
                time.sleep(0.001)
            assert out.in_task and journal.stat().st_size
            while not {out.res_fd, out.jfd} <= set(synced):  # then fsynced, SYNC_S after it was
                # written, the task still running
                assert time.monotonic() < deadline, "the late writer never fsynced what it wrote"
                time.sleep(0.005)
            assert out.in_task
        finally:
            out.end_task()  # (after the late writer's write under way, if one is)
        assert not out.unsynced
        recs, _ = records.parse_frames(journal.read_bytes())
        assert [r.task for r in recs] == [0]
        out.close()


def test_one_late_writer_thread_serves_a_workers_jobs_one_after_another(runner, cur, tmp_path) -> None:
    # a thread started for every job a warm worker runs cost it a thread start and a switch each
    def late_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "elsewhere-late-writer"]

    with worker_log(tmp_path):
        enter(runner, cur, tmp_path, fn=lambda x: x)
        seen = []
        for job in ("job1", "job2"):
            store = JobStore(tmp_path / job)
            for sub in ("journal", "results", "logs"):
                (tmp_path / job / sub).mkdir(parents=True)
            out = ResultWriter(store, "w1", runner.error)
            out.pending.append(runner.run(0, 0, entry(1), 0))
            out.begin_task()  # a long task: the outcome before it is written meanwhile
            try:
                deadline = time.monotonic() + 10
                while out.pending:
                    assert time.monotonic() < deadline, f"{job}: the late writer never wrote the pending outcome"
                    time.sleep(0.001)
            finally:
                out.end_task()
            seen.append(late_threads())
            out.close()
            recs, _ = records.parse_frames((tmp_path / job / "journal" / "w1.rec").read_bytes())
            assert [r.task for r in recs] == [0]
        assert len(seen[0]) == 1 and seen[1] == seen[0], seen  # the same thread, still alive


def test_a_client_waiting_for_the_end_alone_is_woken_once_for_a_workers_part(runner, cur, tmp_path, monkeypatch) -> None:
    # ew.map's caller waits for the job's end: woken at every group of results, it took the
    # cores of the workers that were still writing theirs
    told: list[str] = []
    with worker_log(tmp_path):
        enter(runner, cur, tmp_path, fn=lambda x: x)
        for job, at_end in (("each", False), ("end", True)):
            store = JobStore(tmp_path / job)
            for sub in ("journal", "results", "logs"):
                (tmp_path / job / sub).mkdir(parents=True)
            monkeypatch.setattr(store, "notify", lambda job=job: told.append(job))
            out = ResultWriter(store, "w1", runner.error, tell_at_end=at_end)
            out.pending.append(runner.run(0, 0, entry(1), 0))
            out.flush(sync=False)
            out.write_range(1, [2, 3], 0.0, 0.0, 0, 0, 1)
            out.flush()
            assert told.count(job) == (2 if job == "each" else 0), told
            out.tell_client()  # its part is written
            out.tell_client()  # (nothing new since)
            assert told.count(job) == (2 if job == "each" else 1), told
            out.close()
            recs, _ = records.parse_frames((tmp_path / job / "journal" / "w1.rec").read_bytes())
            assert [(r.task, r.count) for r in recs] == [(0, 1), (1, 2)]  # written all the same


def test_outcomes_are_journal_records_pointing_into_one_body(runner, cur, tmp_path) -> None:
    with worker_log(tmp_path):
        store = JobStore(tmp_path / "job")
        for sub in ("journal", "results", "logs"):
            (tmp_path / "job" / sub).mkdir(parents=True)
        enter(runner, cur, tmp_path, fn=lambda x: x * 2, seed=5)
        out = ResultWriter(store, "w1", runner.error)
        out.pending.extend(runner.run(i, 0, entry(i), i) for i in range(2))
        out.flush(sync=True)
        out.write_range(2, [40, 60], 1.0, 2.0, 0, 0, 7)
        out.close()
        recs, _ = records.parse_frames((tmp_path / "job" / "journal" / "w1.rec").read_bytes())
        assert [(r.kind, r.task, r.item, r.count, r.seed) for r in recs] == [(1, 0, 0, 1, 5), (1, 1, 1, 1, 6),
                                                                             (1, 2, 0, 2, 7)]  # fmt: skip
        assert recs[0].res_off == recs[1].res_off and recs[2].res_off == recs[0].res_off + recs[0].res_len
        cache: dict[Any, Any] = {}
        assert [read_body(store, "w1", recs[0], cache), read_body(store, "w1", recs[1], cache)] == [0, 2]
        assert read_body(store, "w1", recs[2], cache, task=3) == 60


def test_a_write_torn_by_a_full_disk_leaves_nothing_behind_it(runner, cur, tmp_path, monkeypatch) -> None:
    # A body (then a frame) whose write fails halfway is cut back: once the disk has room, the
    # next body is written where the journal says it is, not after the torn bytes.
    import errno

    from elsewhere.run import results as results_mod

    real = results_mod.writev_all
    torn: list[int] = []

    def full_once(fd: int, parts: list[Any]) -> None:
        if len(torn) < 2 and (fd == out.res_fd) == (not torn):  # the body first, then a frame
            data = b"".join(bytes(p) for p in parts)
            os.write(fd, data[: len(data) // 2])
            torn.append(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, parts)

    with worker_log(tmp_path):
        store = JobStore(tmp_path / "job")
        for sub in ("journal", "results", "logs"):
            (tmp_path / "job" / sub).mkdir(parents=True)
        enter(runner, cur, tmp_path, fn=lambda x: x * 2)
        out = ResultWriter(store, "w1", runner.error)
        out.append_frame([])  # (as a worker's first)
        monkeypatch.setattr(results_mod, "writev_all", full_once)
        out.pending.extend(runner.run(i, 0, entry(i), i) for i in range(2))
        for _ in range(2):  # the body's write fails, then the frame's: the outcomes stay pending
            with pytest.raises(OSError):
                out.flush(sync=False)
            assert len(out.pending) == 2
        out.flush(sync=False)  # room again
        out.write_range(2, [40, 60], 1.0, 2.0, 0, 0, 7)
        out.close()
        assert len(torn) == 2
        data = (tmp_path / "job" / "journal" / "w1.rec").read_bytes()
        recs, used, damaged = records.scan_frames(data)
        assert used == len(data) and not damaged  # no torn frame in the journal (a reader skips one, and says so)
        assert [(r.task, r.count) for r in recs] == [(0, 1), (1, 1), (2, 2)]
        cache: dict[Any, Any] = {}
        assert [read_body(store, "w1", r, cache, task=r.task) for r in recs] == [0, 2, 40]
