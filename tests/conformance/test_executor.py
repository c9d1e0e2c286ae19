"""``ew.Executor``'s contract, the standard library's ``concurrent.futures`` one, on every
backend that runs an Executor (the capability "stream"); the others refuse it with a
ConfigError that says so.

Read beside the standard library's own executor tests (``test_concurrent_futures``): the
constructor's arguments, the cancel contract (a call a worker has taken runs on), exceptions
as the task raised them, no hang whatever a call does, nothing leaked by an executor that is
dropped, and the interpreter's exit waiting for pending calls. Where elsewhere differs by
design (a worker that dies fails one call, no BrokenProcessPool), the test says so.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import elsewhere as ew
from conformance import executor_tasks as et
from conformance.contract import Backend, lacks, wait_until
from elsewhere.util.system import process_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WAIT_S = 60  # how long any call of these tests may take to come back


@pytest.fixture
def cluster(backend: Backend) -> ew.Cluster:
    c = backend()
    if lacks(c, "stream"):
        with pytest.raises(ew.ConfigError, match="stream"):
            ew.Executor(on=c)
        pytest.skip(
            f"{backend.name} runs no Executor (no 'stream' capability): refused as it should be"
        )
    return c


def test_max_workers_bounds_the_calls_at_once_and_initializer_runs_once_per_process(
    cluster: ew.Cluster,
) -> None:
    tag = f"t{os.getpid()}{int(time.time() * 1000) % 100000}"
    with ew.Executor(1, on=cluster, initializer=et.init, initargs=(tag,)) as ex:
        spans = list(ex.map(et.span, [0.2] * 4, timeout=WAIT_S))
        seen = list(ex.map(et.seen_init, [tag] * 6, timeout=WAIT_S))
    spans.sort()
    assert all(a[1] <= b[0] + 0.01 for a, b in zip(spans, spans[1:])), f"calls overlapped: {spans}"
    assert all(n == 1 for _, n in seen), f"the initializer ran other than once per process: {seen}"


def test_constructor_arguments_of_process_pool_executor(cluster: ew.Cluster) -> None:
    import multiprocessing as mp

    with pytest.raises(ValueError):
        ew.Executor(0, on=cluster)
    with pytest.raises(ew.ConfigError, match="fork"):
        ew.Executor(on=cluster, mp_context=mp.get_context("fork"))
    with pytest.raises(ew.ConfigError, match="max_tasks_per_child"):
        ew.Executor(on=cluster, max_tasks_per_child=3)
    with pytest.raises(ew.ConfigError, match="initializer"):
        ew.Executor(on=cluster, initializer=42)
    with pytest.raises(ew.ConfigError, match="unknown option"):
        ew.Executor(on=cluster, max_worker=2)  # a misspelling is not passed on as a job option
    from elsewhere.api import executor

    job_options = [p for p in inspect.signature(ew.create_job).parameters if p not in ("on", "name")]
    assert [p for p in job_options if not p.startswith("_")] == list(executor._JOB_OPTIONS)
    with ew.Executor(2, mp.get_context("spawn"), on=cluster) as ex:
        assert ex.submit(pow, 2, 5).result(timeout=WAIT_S) == 32
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(pow, 2, 5)


def test_exceptions_come_back_as_the_task_raised_them(cluster: ew.Cluster) -> None:
    with ew.Executor(on=cluster) as ex:
        futs = {k: ex.submit(et.raise_, k) for k in ("runtime", "notfound", "key", "mine")}
        runtime = futs["runtime"].exception(timeout=WAIT_S)
        assert type(runtime) is RuntimeError and runtime.args == (123,)
        assert "raise_" in str(runtime.__cause__)  # the remote traceback
        nf = futs["notfound"].exception(timeout=WAIT_S)
        assert type(nf) is FileNotFoundError and (nf.errno, nf.filename) == (2, "/nowhere/x.txt")
        key = futs["key"].exception(timeout=WAIT_S)
        assert type(key) is KeyError and key.args == ("k",)
        with pytest.raises(et.MyError) as caught:
            futs["mine"].result(timeout=WAIT_S)
        assert (caught.value.code, caught.value.where) == (7, "the pump")


def test_what_cannot_come_back_raises_and_the_executor_lives_on(cluster: ew.Cluster) -> None:
    with ew.Executor(on=cluster) as ex:
        unloadable = ex.submit(et.loads_badly, "import")
        with pytest.raises(Exception, match=r"cannot be loaded here|cannot be read"):
            unloadable.result(timeout=WAIT_S)
        exiting = ex.submit(et.loads_badly, "exit")  # SystemExit while the caller unpickles it
        assert isinstance(exiting.exception(timeout=WAIT_S), BaseException)
        pickled_exit = ex.submit(et.exits_when_pickled)  # sys.exit while the worker pickles it
        assert pickled_exit.exception(timeout=WAIT_S) is not None
        assert ex.submit(pow, 3, 3).result(timeout=WAIT_S) == 27  # nothing else is affected


def test_a_worker_that_dies_at_any_point_of_a_call_fails_that_call_only(
    cluster: ew.Cluster,
) -> None:
    # Where elsewhere differs from ProcessPoolExecutor by design: no BrokenProcessPool, one
    # call fails as lost (or runs again with retries=), the executor lives on.
    with ew.Executor(on=cluster) as ex:
        for fut in (
            ex.submit(et.identity, et.DiesWhenLoaded()),  # dies unpickling its call
            ex.submit(os._exit, 9),  # dies running it
            ex.submit(et.dies_when_pickled),
        ):  # dies pickling its result
            err = fut.exception(timeout=WAIT_S)
            assert isinstance(err, ew.TaskError) and err.reason == "lost", repr(err)
        assert ex.submit(pow, 2, 3).result(timeout=WAIT_S) == 8


def test_cancel_follows_the_standard_and_kill_stops_a_running_call(
    cluster: ew.Cluster, tmp_path: Path
) -> None:
    with ew.Executor(1, on=cluster) as ex:
        running = ex.submit(et.span, 1.5)
        held = [ex.submit(et.span, 0.1) for _ in range(3)]
        wait_until(running.running, WAIT_S, "the first call to run")
        assert not running.cancel() and running.running()  # a running call cannot be cancelled
        assert held[0].cancel() and held[0].cancelled() and not held[0].running()
        t0, t1 = running.result(timeout=WAIT_S)  # and it ran to its end
        assert t1 - t0 >= 1.4
        assert [f.result(timeout=WAIT_S) for f in held[1:]]
    with ew.Executor(1, on=cluster) as ex:
        marker = tmp_path / "pid"
        long = ex.submit(et.pid_then_sleep, str(marker), 120)
        wait_until(long.running, WAIT_S, "the long call to run")
        wait_until(marker.exists, WAIT_S, "the long call to start")
        assert ex.kill(long)
        with pytest.raises(ew.TaskError, match="killed"):
            long.result(timeout=WAIT_S)
        assert ex.submit(pow, 2, 2).result(timeout=WAIT_S) == 4
        # stopped where it ran, not only given up on (its process does not run on)
        pid = int(marker.read_text())
        wait_until(lambda: not process_alive(pid), WAIT_S, "the killed call's process to stop")
    ex = ew.Executor(1, on=cluster)
    first = ex.submit(et.span, 0.5)
    rest = [ex.submit(et.span, 0.1) for _ in range(3)]
    wait_until(first.running, WAIT_S, "the first call to run")
    ex.shutdown(wait=True, cancel_futures=True)  # only what no worker has taken
    assert first.done() and not first.cancelled() and first.result()[1] > 0
    assert all(f.cancelled() for f in rest)


def test_a_dropped_executor_ends_its_threads_and_purges_its_job_after_the_last_result(
    cluster: ew.Cluster,
) -> None:
    before = {t.ident for t in threading.enumerate()}
    ex = ew.Executor(on=cluster)
    name = ex.job.name
    fut = ex.submit(et.span, 0.3)
    del ex
    gc.collect()
    assert fut.result(timeout=WAIT_S)[1] > 0  # its calls still complete
    wait_until(lambda: not [t for t in threading.enumerate() if t.ident not in before
                            and t.name.startswith("elsewhere-executor")], WAIT_S,
               "the dropped executor's threads to end")  # fmt: skip
    wait_until(lambda: name not in [j["name"] for j in ew.jobs()], WAIT_S, "its job to be purged")
    ex = ew.Executor(on=cluster)  # shutdown(wait=False): purged once the last result is in
    name = ex.job.name
    fut = ex.submit(et.span, 0.3)
    ex.shutdown(wait=False)
    assert fut.result(timeout=WAIT_S)[1] > 0
    wait_until(lambda: name not in [j["name"] for j in ew.jobs()], WAIT_S, "its job to be purged")


def test_memory_is_bounded_by_what_the_caller_holds(cluster: ew.Cluster) -> None:
    import resource

    with ew.Executor(on=cluster) as ex:
        for f in [ex.submit(et.megabyte, i) for i in range(20)]:
            assert len(f.result(timeout=WAIT_S)) == 1 << 20
        gc.collect()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for start in range(0, 400, 20):  # 400 MB of results, 20 held at a time
            for f in [ex.submit(et.megabyte, i) for i in range(start, start + 20)]:
                assert f.result(timeout=WAIT_S)[0] == f.result()[-1]
        grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    assert grew_mb < 150, (
        f"the caller's peak memory grew by {grew_mb:.0f} MB for 20 MB held at a time"
    )


def test_the_records_of_finished_calls_are_not_kept(cluster: ew.Cluster) -> None:
    """A stream of a million calls must not hold a million journal records: once a future is
    done, its call's record is dropped (only that it ended, and the counts, are kept)."""
    with ew.Executor(on=cluster) as ex:
        assert list(ex.map(abs, range(-300, 0), timeout=WAIT_S)) == list(range(300, 0, -1))
        final = ex.job.handle.reader.final  # (on peers the journal is read a little later)
        wait_until(lambda: len(final) >= 300 and len(final._single) < 30, WAIT_S,
                   lambda: f"{len(final._single)} records of {len(final)} done calls held")  # fmt: skip
        # retired (only that they ended), or in range records (one for many tiny calls)
        assert len(final._retired) + sum(end - first for first, end, _ in final._ranges) > 270
        assert len(final._single) + len(final._ranges) < 60
        assert ex.job.check().counts.get("finished", 0) >= 300


EXIT = """
import sys
import elsewhere as ew
sys.path.insert(0, {tests!r})
from conformance import executor_tasks as et

ex = ew.Executor(on={on}{detach})
print(ex.job.name, flush=True)
ex.submit(et.touch_later, {marker!r}, 1.0)
import atexit

def late():
    try:
        ex.submit(pow, 2, 2)
    except RuntimeError as e:
        print("refused:", e, flush=True)
atexit.register(late)
"""


@pytest.mark.parametrize("detach", [False, True])
def test_interpreter_exit_waits_for_pending_calls_unless_detached(backend: Backend, cluster: ew.Cluster,
                                                                  tmp_path: Path, detach: bool) -> None:  # fmt: skip
    marker = tmp_path / "marker"
    tests = str(Path(__file__).resolve().parents[1])
    code = EXIT.format(tests=tests, on=backend.source(), marker=str(marker),
                       detach=", detach=True" if detach else "")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=WAIT_S, env=os.environ.copy())  # fmt: skip
    assert p.returncode == 0, p.stderr
    name = p.stdout.split()[0]
    assert "refused: cannot schedule new futures" in p.stdout, p.stdout  # a submit during exit
    if not detach:
        assert marker.exists(), "the program ended before its pending call ran"
        assert name not in [j["name"] for j in ew.jobs()]  # and its job was purged
    else:
        job = ew.recover(name)  # the job runs on, recoverable by name
        job.wait(timeout=WAIT_S)
        assert job.results() == [str(marker)] and marker.exists()
        job.purge()


def test_an_idle_worker_holds_nothing_of_the_calls_it_ran(cluster: ew.Cluster, tmp_path: Path) -> None:
    marker = tmp_path / "freed"
    with ew.Executor(on=cluster) as ex:
        arg = et.Marker(str(marker))
        assert ex.submit(et.size_of, arg).result(timeout=WAIT_S) == len(str(marker))
        arg.path = str(tmp_path / "ours")  # this process's copy frees elsewhere
        del arg
        wait_until(marker.exists, 30, "the worker to free the argument of its last call")


def test_a_result_never_waits_for_the_call_after_it(cluster: ew.Cluster) -> None:
    # quick calls, then one of 5 s; the quick ones are back while it runs (a worker claims
    # many together, the slow one among them, and groups their results to write them at once)
    with ew.Executor(on=cluster) as ex:
        ex.submit(pow, 1, 1).result(timeout=WAIT_S)  # the worker is up
        quick = [ex.submit(time.sleep, 0) for _ in range(50)]
        slow = ex.submit(time.sleep, 5)
        done, _ = cf.wait(quick, timeout=WAIT_S)
        assert len(done) == 50
        assert not slow.done(), "the quick calls' results waited for the slow call after them"
        slow.result(timeout=WAIT_S)
