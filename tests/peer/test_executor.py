"""``ew.Executor`` on peers: tasks handed to the controller in memory, futures resolved
from the results it receives, the job folder written all the same.

Real worker daemons on loopback (two, one slot each), a real controller in this process.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from peer_procs import Workers, free_port, wait_until

import elsewhere as ew
from conformance.executor_tasks import pid_then_sleep
from elsewhere.backends.peer import PeerCluster
from elsewhere.folder import serial
from elsewhere.peer import batching as peer_batching
from elsewhere.peer.keys import write_key
from elsewhere.util.errors import ElsewhereError
from elsewhere.util.system import process_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, Workers]]:
    tmp = tmp_path_factory.mktemp("lab")
    key = write_key("lab", tmp / "lab.key")
    port = free_port()
    with Workers(tmp, 2, port=port, key=key) as workers:
        yield key, port, workers


@pytest.fixture(scope="module")
def lab_workers(lab: tuple[Path, int, Workers]) -> Workers:
    return lab[2]


@pytest.fixture
def on(lab: tuple[Path, int, Workers], ew_home: Path, tmp_path: Path,
       monkeypatch: pytest.MonkeyPatch) -> PeerCluster:  # fmt: skip
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "config"))
    key, port, _ = lab
    cluster = ew.peers("lab", key=key, port=port, interface="127.0.0.1")
    assert isinstance(cluster, PeerCluster)
    return cluster


def square(x: int) -> int:
    return x * x


def fill(n: int, value: float) -> np.ndarray:
    return np.full(n, value)


def double(a: np.ndarray) -> np.ndarray:
    return a * 2


def fails(x: int) -> int:
    raise KeyError(f"no {x}")


def test_results_come_back_and_are_durable_in_the_job_folder(on: PeerCluster) -> None:
    with ew.Executor(on=on, keep=True) as ex:
        name = ex.job.name
        futs = [ex.submit(square, i) for i in range(40)]
        assert [f.result(timeout=30) for f in futs] == [i * i for i in range(40)]
        assert ex.submit(square, 7).result(timeout=30) == 49  # one at a time, too
    job = ew.recover(name)  # what the folder holds, read by a fresh Job
    assert job.results() == [i * i for i in range(40)] + [49]
    job.purge()


def test_one_task_at_a_time_takes_two_frames(on: PeerCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # the next task's ASK rides inside each TASK and its ACCEPT inside the RESULT ("fold"),
    # for tasks shorter than a round trip: every task counts as short here, however loaded
    # the machine (the controller runs in this process)
    # A stall of the loaded machine between two tasks (an admission unused for 50 ms goes
    # stale at the worker, one for a second is withdrawn) costs folds: rounds go on (five at
    # most) until one folds all but the first few, each round's results checked
    monkeypatch.setattr(peer_batching, "_SHORT_S", 60.0)  # where the controller places
    seen = []
    for _ in range(5):
        with ew.Executor(on=on) as ex:
            assert [ex.submit(square, i).result(timeout=30) for i in range(30)] == [i * i for i in range(30)]
            counters = ex._stream.link.counters()
        seen.append(counters)
        if counters["asks_folded"] >= 25 and counters["accepts_folded"] >= 25:  # all but the first few
            break
    else:
        raise AssertionError(f"no round of 30 tasks folded 25 ASKs and ACCEPTs: {seen}")


def test_the_workers_forget_every_result_once_acknowledged(on: PeerCluster, lab_workers: Workers) -> None:
    # many results made durable together: their ACKs go as one frame (ack-many) per worker
    with ew.Executor(on=on) as ex:
        futs = [ex.submit(square, i) for i in range(200)]
        assert [f.result(timeout=30) for f in futs] == [i * i for i in range(200)]

    def forgotten() -> bool:  # the workers write their counters every second
        stats = [w.stats() for w in lab_workers]
        return sum(st.get("tasks", 0) for st in stats) >= 200 and all(st.get("unacked") == 0 for st in stats)

    wait_until(forgotten, 10, "the workers to count the tasks and forget their results")


def test_large_results_do_not_share_memory_with_later_ones(on: PeerCluster) -> None:
    n = (8 << 20) // 8  # 8 MiB: received into the controller's reusable buffers
    with ew.Executor(on=on) as ex:
        first = ex.submit(fill, n, 1.0).result(timeout=60)
        later = [ex.submit(fill, n, float(v)).result(timeout=60) for v in (2.0, 3.0, 4.0)]
        # the buffer behind `first` is still held: a later result must not land in it
        assert first.min() == first.max() == 1.0
        assert [(a.min(), a.max()) for a in later] == [(2.0, 2.0), (3.0, 3.0), (4.0, 4.0)]
        del first, later
        again = [ex.submit(fill, n, float(v)).result(timeout=60) for v in (5.0, 6.0)]
        assert [(a.min(), a.max()) for a in again] == [(5.0, 5.0), (6.0, 6.0)]


def scaled(factor: float, x: float) -> float:
    return factor * x


def test_a_new_partial_per_task_neither_grows_the_workers_nor_loses_a_function(
        on: PeerCluster, lab_workers: Workers) -> None:  # fmt: skip
    # each task one at a time, each a partial of its own: a function part per task. The
    # workers keep a bounded number (the controller tells them which to drop), and a part
    # used again after its child dropped it is sent to that child again.
    import functools

    from elsewhere.peer.encoder import MAX_SENT_PARTS

    parts = [functools.partial(scaled, float(k)) for k in range(2 * MAX_SENT_PARTS + 40)]
    done_before = sum(w.stats().get("tasks", 0) for w in lab_workers)
    with ew.Executor(on=on) as ex:
        got = [ex.submit(p, 2.0).result(timeout=30) for p in parts]
        assert got == [2.0 * k for k in range(len(parts))]
        again = [ex.submit(parts[k], 3.0).result(timeout=30) for k in (0, 1, 2, len(parts) - 1)]
        assert again == [0.0, 3.0, 6.0, 3.0 * (len(parts) - 1)]
        total = done_before + len(parts) + 4
        wait_until(lambda: sum(w.stats().get("tasks", 0) for w in lab_workers) >= total, 10,
                   "the workers' counters")  # fmt: skip
        held = [w.stats().get("function_parts", 0) for w in lab_workers]
        assert sum(held) >= MAX_SENT_PARTS, held  # they do keep parts (the counter is live)
    assert max(held) <= 2 * MAX_SENT_PARTS, held  # (per connection: the controller's own, and its lane's)


def with_table(factor: float, x: float) -> float:
    return factor * x + len(ew.task().job_data)


def test_job_data_crosses_once_per_worker_whatever_the_functions(on: PeerCluster) -> None:
    # a new partial per task is a new function part each; the job data (2 MB) travels in
    # a part of its own, once per connection, not inside every function part
    import functools

    table = bytes(2 << 20)
    with ew.Executor(on=on, job_data=table) as ex:
        got = [ex.submit(functools.partial(with_table, float(k)), 1.0).result(timeout=30) for k in range(30)]
        sent = ex._stream.link.counters()["bytes_sent"]
    assert got == [float(k) + len(table) for k in range(30)]
    assert sent < 5 * len(table), sent  # two workers, two connections each (its own, its lane): not thirty times


def test_workers_without_job_parts_get_the_job_data_in_the_function_part() -> None:
    from elsewhere.peer.encoder import TaskEncoder

    class Payload:  # the job's own function and job data, as the payload holds them
        def common(self) -> tuple[object, object]:
            return None, {"table": 7}

        def close(self) -> None:
            pass

    enc = TaskEncoder(Payload(), {"id": "j"}, "always", 0.0)  # type: ignore[arg-type]
    prepared = enc.prepare((square, (3,), {}))
    new: dict[str, None] = {}  # what each worker has: one understands job parts,
    old: dict[str, None] = {}  # one does not
    info, bufs = enc.encode([0], [0], prepared, {}, new, job_part=True)
    n, nfn = info["ntask"], info["nfn"]
    fn, data = serial.loads(bufs[n], bufs[n + 1 : n + nfn])
    assert fn(3) == 9 and data is None  # the function alone
    assert info["njpart"] and serial.loads(bufs[n + nfn], bufs[n + nfn + 1 :]) == ({"table": 7}, None)
    info, bufs = enc.encode([0], [0], prepared, {}, old, job_part=False)
    n, nfn = info["ntask"], info["nfn"]
    fn, data = serial.loads(bufs[n], bufs[n + 1 :])
    assert "jpart" not in info and fn(3) == 9 and data == {"table": 7}
    info, bufs = enc.encode([1], [0], enc.prepare((square, (4,), {})), {}, new, job_part=True)
    assert info["nfn"] == info["njpart"] == 0 and len(bufs) == info["ntask"]  # both held there


def touch_and_sleep(path: str, seconds: float) -> None:
    import time

    open(path, "w").close()
    time.sleep(seconds)


def test_a_future_is_running_while_its_task_is_on_a_worker_and_kill_stops_it(
        on: PeerCluster, lab_workers: Workers, tmp_path: Path) -> None:  # fmt: skip
    import time

    marker = tmp_path / "started"
    with ew.Executor(on=on) as ex:
        fut = ex.submit(touch_and_sleep, str(marker), 30)
        wait_until(fut.running, 30, "the future to be running")
        wait_until(marker.exists, 30, "the task to start on its worker")
        time.sleep(1.2)  # the workers' counters are written every second
        started = sum(w.stats().get("children_started", 0) for w in lab_workers)
        assert fut.running() and not fut.done()
        assert not fut.cancel() and fut.running()  # the standard: a running call runs on
        assert ex.kill(fut)  # the explicit way to stop it
        with pytest.raises(ew.TaskError, match="killed"):
            fut.result(timeout=10)
        # the worker killed the task's child (and started a fresh one)
        wait_until(lambda: sum(w.stats().get("children_started", 0) for w in lab_workers) > started, 15,
                   "the running task to be stopped on its worker")  # fmt: skip
        quick = ex.submit(square, 5)
        assert quick.result(timeout=30) == 25 and not quick.running()


def test_a_task_whose_send_failed_carries_its_function_when_sent_again(
        on: PeerCluster, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from elsewhere.peer import wire
    from elsewhere.peer.messages import Task
    from elsewhere.util.errors import PeerError

    real_send = wire.Connection.send
    failed: list[str] = []

    def send_failing_once(self: wire.Connection, message: object, buffers: object = ()) -> None:
        if isinstance(message, Task) and message.info.get("nfn") and not failed:
            failed.append(message.task_id)
            raise PeerError("refused here once, as a frame over a cap would be")
        real_send(self, message, buffers)  # type: ignore[arg-type]

    monkeypatch.setattr(wire.Connection, "send", send_failing_once)
    with ew.Executor(on=on) as ex:  # the worker that missed it gets tasks of it later
        futs = [ex.submit(touch_and_sleep, "/dev/null", 0.05) for k in range(40)]
        assert [f.result(timeout=30) for f in futs] == [None] * 40
        counters = ex._stream.link.counters()
    assert failed  # the first TASK did fail; the worker it was for took tasks of that function
    assert counters.get("disconnections", 0) == 0, counters  # again, the function sent with them


def test_a_large_argument_goes_and_comes_back(on: PeerCluster) -> None:
    a = np.random.default_rng(3).random((16 << 20) // 8)
    with ew.Executor(on=on) as ex:
        b = ex.submit(double, a).result(timeout=60)
    assert b.shape == a.shape and np.array_equal(b, a * 2)


def test_tasks_of_a_module_sent_by_value_are_written_to_the_payload(
        on: PeerCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import importlib.util
    import sys

    from elsewhere.folder.payload import PayloadReader

    src = tmp_path / "hidden_mod_for_payload.py"
    src.write_text("def triple(x):\n    return 3 * x\n")
    spec = importlib.util.spec_from_file_location("hidden_mod_for_payload", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "hidden_mod_for_payload", mod)  # not findable on sys.path
    with ew.Executor(on=on, keep=True) as ex:
        name = ex.job.name
        futs = [ex.submit(mod.triple, i) for i in range(30)]  # written together, by value
        assert [f.result(timeout=30) for f in futs] == [3 * i for i in range(30)]
    job = ew.recover(name)
    monkeypatch.delitem(sys.modules, "hidden_mod_for_payload")  # read back without the module
    reader = PayloadReader(job.store.path / "payload.log")
    try:
        entries = [reader.task(i) for i in range(30)]
    finally:
        reader.close()
    assert [fn(*args, **kwargs) for fn, args, kwargs in entries] == [3 * i for i in range(30)]
    job.purge()


def test_errors_raise_as_their_own_type(on: PeerCluster) -> None:
    with ew.Executor(on=on) as ex:
        fut = ex.submit(fails, 3)
        with pytest.raises(KeyError, match="no 3"):
            fut.result(timeout=30)
        assert ex.submit(square, 3).result(timeout=30) == 9  # the executor carries on


def test_what_cannot_be_sent_fails_at_submit(on: PeerCluster) -> None:
    with ew.Executor(on=on) as ex:
        with pytest.raises(ElsewhereError, match="lock"):
            ex.submit(square, threading.Lock())
        assert ex.submit(square, 4).result(timeout=30) == 16  # nothing else is affected


def test_as_completed_and_map_work_across_threads(on: PeerCluster) -> None:
    with ew.Executor(on=on) as ex:
        futs: list[cf.Future] = []

        def submit_some(start: int) -> None:
            futs.extend(ex.submit(square, i) for i in range(start, start + 25))

        threads = [threading.Thread(target=submit_some, args=(s,)) for s in (0, 25)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        got = sorted(f.result() for f in cf.as_completed(futs, timeout=60))
        assert got == sorted(i * i for i in range(50))
        assert list(ex.map(square, range(5))) == [0, 1, 4, 9, 16]


def test_killed_and_cancelled_calls_and_the_executor_carries_on(on: PeerCluster) -> None:
    import time

    with ew.Executor(2, on=on) as ex:
        slow = [ex.submit(time.sleep, 30) for _ in range(2)]  # both workers busy
        waiting = ex.submit(time.sleep, 30)  # held back by max_workers=2
        wait_until(lambda: all(f.running() for f in slow), 30, "both calls to run")
        assert waiting.cancel() and waiting.cancelled()  # not taken by a worker: cancelled
        for f in slow:
            assert not f.cancel() and ex.kill(f)
        assert all(isinstance(f.exception(timeout=10), ew.TaskError) for f in slow)
        # the workers are free again: without the cancel this would wait 30 s (the timeout)
        assert [ex.submit(square, i).result(timeout=20) for i in range(3)] == [0, 1, 4]


def test_an_executor_with_no_peer_logs_why_its_futures_wait(ew_home: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    # no progress bar shows an Executor's wait: a lasting note is logged instead
    from elsewhere.backends.peer import peers
    from elsewhere.util import progress

    monkeypatch.setattr(progress, "NOTE_AFTER_S", 0.5)
    key = write_key("empty", tmp_path / "empty.key")
    on = peers("empty", key=key, port=free_port(), interface="127.0.0.1")
    with caplog.at_level("WARNING", logger="elsewhere"), ew.Executor(on=on) as ex:
        fut = ex.submit(pow, 2, 3)
        wait_until(lambda: any("waiting for peers" in r.getMessage() for r in caplog.records), 20,
                   "a warning that no peer was seen")  # fmt: skip
        assert not fut.done()
        fut.cancel()
        ex.shutdown(wait=False, cancel_futures=True)
    said = [r.getMessage() for r in caplog.records if "waiting for peers" in r.getMessage()]
    assert len(said) == 1 and "elsewhere peer worker" in said[0] and "group 'empty'" in said[0]


def note_daemon_and_sleep(path: str, seconds: float) -> int:
    import os
    import time

    with open(path, "a") as f:
        f.write(f"{os.getppid()}\n")  # the worker daemon running it
    time.sleep(seconds)
    return os.getppid()


def test_a_future_whose_worker_is_killed_gets_its_result_from_another(
        ew_home: Path, tmp_path: Path) -> None:  # fmt: skip
    import signal

    from elsewhere.backends.peer import peers

    key = write_key("kill", tmp_path / "kill.key")
    port = free_port()
    with Workers(tmp_path, 2, port=port, key=key) as workers:
        on = peers("kill", key=key, port=port, interface="127.0.0.1")
        with ew.Executor(on=on) as ex:
            assert ex.submit(square, 3).result(timeout=30) == 9  # both connect meanwhile
            marker = tmp_path / "ran-on"
            fut = ex.submit(note_daemon_and_sleep, str(marker), 2.0)
            # a whole line: the file exists a moment before the task's write lands in it
            wait_until(lambda: marker.exists() and marker.read_text().endswith("\n"), 30, "the task to start")
            first = int(marker.read_text().split()[0])
            assert first in {w.pid for w in workers}
            os.kill(first, signal.SIGKILL)
            other = fut.result(timeout=60)  # run again on the other worker
            assert other != first and other in {w.pid for w in workers}
            assert [int(p) for p in marker.read_text().split()] == [first, other]


def test_a_result_that_times_out_says_what_holds_the_task_back(lab: tuple[Path, int, Workers],
                                                               ew_home: Path) -> None:  # fmt: skip
    key, port, _ = lab
    ex = ew.Executor(on=ew.peers("lab", key=key, port=port, interface="127.0.0.1", memory="100T"))
    try:
        fut = ex.submit(square, 3)
        wait_until(lambda: "memory" in ex.job.check().note, 30, "the controller's note")
        with pytest.raises(cf.TimeoutError) as caught:
            fut.result(timeout=0.2)
        text = str(caught.value)
        assert f"task 0 of job {ex.job.name!r} did not finish within 0.2 s (not started" in text
        assert "the tasks need 100.0 TiB" in text
        with pytest.raises(cf.TimeoutError, match=r"did not finish within 0\.1 s"):
            fut.exception(timeout=0.1)
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def test_a_callable_dropped_by_the_caller_is_freed(on: PeerCluster) -> None:
    # the controller keeps each function's pickled part while the function lives, not longer:
    # a partial (or bound method, closure) and what it holds are freed once dropped
    import functools
    import gc
    import weakref

    with ew.Executor(on=on) as ex:
        fn = functools.partial(pow, 2)
        ref = weakref.ref(fn)
        assert ex.submit(fn, 10).result(timeout=30) == 1024
        assert ex.submit(fn, 3).result(timeout=30) == 8  # the part is used again while it lives
        del fn

        def freed() -> bool:
            gc.collect()
            return ref() is None

        wait_until(freed, 15, "the dropped partial to be freed")
        assert ex.submit(square, 6).result(timeout=30) == 36


# ---------------------------------------------------------------- lanes


def _lane_tasks(workers: Workers) -> int:
    return sum(w.stats().get("lane_tasks", 0) for w in workers)


def _settled_lane_tasks(workers: Workers) -> int:
    """The workers' count of lane tasks once it stays put for longer than a lane waits to tell
    it and a daemon to write it down."""
    counts = [_lane_tasks(workers)]

    def settled() -> bool:
        # (a lane tells its tasks every 0.5 s at most, and at its end; a daemon writes its
        # counters every second: two readings 0.7 s apart could read the same file, which
        # failed once in the full suite, an earlier test's lane telling 137 tasks later)
        time.sleep(1.6)
        counts.append(_lane_tasks(workers))
        return counts[-1] == counts[-2]

    wait_until(settled, 20, "the lanes' task counts to settle")
    return counts[-1]


def test_an_executors_tasks_go_on_lanes_to_the_task_processes(on: PeerCluster, lab_workers: Workers) -> None:
    # an open Executor's tasks, one at a time: once a worker's lane is open they go to its
    # task process directly (the daemon counts them when the lane tells it), the results
    # the same
    before = _lane_tasks(lab_workers)
    with ew.Executor(on=on) as ex:
        got = [ex.submit(square, k).result(timeout=30) for k in range(300)]
        counters = ex._stream.link.counters()
    assert got == [k * k for k in range(300)]
    assert counters.get("lanes_opened", 0) >= 1, counters
    wait_until(lambda: _lane_tasks(lab_workers) > before + 100, 10, "tasks run on lanes")


def test_without_lanes_every_task_goes_through_the_worker_daemon(
        on: PeerCluster, lab_workers: Workers, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("ELSEWHERE_PEER_LANES", "0")
    before = _settled_lane_tasks(lab_workers)  # (an earlier test's lanes told all they ran)
    with ew.Executor(on=on) as ex:
        assert [ex.submit(square, k).result(timeout=30) for k in range(100)] == [k * k for k in range(100)]
        assert ex._stream.link.counters().get("lanes_opened", 0) == 0
    assert _lane_tasks(lab_workers) == before


def exits_on(k: int, bad: int) -> int:
    if k == bad:
        os._exit(3)
    return k


def test_a_task_that_kills_its_lanes_process_is_lost_alone(on: PeerCluster, lab_workers: Workers) -> None:
    # the lane breaks with its process: the controller places the task again through the
    # worker daemon (no lane to that worker for a while), where its death is told as lost
    with ew.Executor(on=on) as ex:
        assert [ex.submit(exits_on, k, -1).result(timeout=30) for k in range(200)] == list(range(200))
        assert ex._stream.link.counters().get("lanes_opened", 0) >= 1
        bad = ex.submit(exits_on, 7, 7)
        with pytest.raises(ew.TaskError) as err:
            bad.result(timeout=60)
        assert err.value.reason == "lost"
        assert "exit code 3" in str(err.value) or "exited" in str(err.value), err.value  # the daemon's account
        assert [ex.submit(exits_on, k, -1).result(timeout=30) for k in range(50)] == list(range(50))
        assert ex._stream.link.counters().get("lanes_broken", 0) == 1  # (not the other worker's lane too)


def test_a_task_killed_on_a_lane_is_stopped_by_its_worker(
        on: PeerCluster, lab_workers: Workers, tmp_path: Path) -> None:  # fmt: skip
    # Executor.kill of a task on a lane: its task process reads the lane's CANCEL only after
    # the task, so the controller tells the lane's worker daemon on its own connection, and
    # the daemon stops the process. The lane ended as asked (not broken) and the next tasks
    # go on; before, the task ran on (its core and slot held) and the next task waited
    # behind it on the lane until a timer moved it
    marker = tmp_path / "pid"
    with ew.Executor(on=on) as ex:
        link = ex._stream.link

        first: dict[str, str] = {}  # each lane's first batch (its ASK for the lane)

        def next_on_a_lane() -> bool:  # (lanes open once tasks were measured short)
            assert ex.submit(square, 3).result(timeout=30) == 9
            with link._state:
                for b in link.batches.values():
                    if b.standing and b.worker.lane_of is not None:
                        # a later batch: the worker daemon knows the first one's id (as the
                        # lane's), and would stop it on the lane's CANCEL alone
                        return first.setdefault(b.worker.key, b.bid) != b.bid
            return False

        wait_until(next_on_a_lane, 30, "the tasks to go on a lane")
        slow = ex.submit(pid_then_sleep, str(marker), 120)
        wait_until(marker.exists, 30, "the task to start")
        pid = int(marker.read_text())
        with link._state:
            (bid,) = link.inflight[slow._ew_index]
            assert link.batches[bid].worker.lane_of is not None
        assert ex.kill(slow)
        with pytest.raises(ew.TaskError, match="killed"):
            slow.result(timeout=10)
        wait_until(lambda: not process_alive(pid), 15, "the lane's task process to be stopped")
        assert [ex.submit(square, k).result(timeout=30) for k in range(50)] == [k * k for k in range(50)]
        counters = link.counters()
        assert counters.get("lanes_ended", 0) >= 1 and counters.get("lanes_broken", 0) == 0, counters
    wait_until(lambda: sum(w.stats().get("lanes_killed", 0) for w in lab_workers) >= 1, 15,
               "the worker to count the lane it stopped")  # fmt: skip


def test_an_idle_executor_gives_its_lanes_slots_back_and_takes_lanes_again_when_tasks_come(
        on: PeerCluster, lab_workers: Workers, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # a notebook's Executor left open: its lanes held their workers' slots (busy to every
    # other controller's eyes) for as long as it lived; now they close once no task came
    # for a while, and open again with the next tasks
    from elsewhere.peer import links

    monkeypatch.setattr(links, "LANE_IDLE_S", 0.5)
    with ew.Executor(on=on) as ex:
        link = ex._stream.link

        def lanes() -> int:
            with link._state:
                return sum(1 for w in link.workers.values() if w.lane_of is not None)

        def busy() -> bool:  # keeps tasks coming until the lanes are open
            assert ex.submit(square, 2).result(timeout=30) == 4
            return lanes() == len(lab_workers)

        wait_until(busy, 30, "lanes to every worker")
        opened = link.counters().get("lanes_opened", 0)
        wait_until(lambda: lanes() == 0, 15, "the idle Executor's lanes to close")
        wait_until(lambda: all(w.stats().get("running", 1) == 0 for w in lab_workers), 15,
                   "the workers to count their slots free")  # fmt: skip
        wait_until(busy, 30, "lanes again once tasks come")
        assert link.counters().get("lanes_opened", 0) > opened
        assert link.counters().get("lanes_broken", 0) == 0


# ---------------------------------------------------------------- a waiting caller reads


def test_a_caller_waiting_for_a_short_task_reads_its_result_itself(
        on: PeerCluster, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # result() on a short task polls the task's connection in the caller's thread and reads
    # the RESULT there (the loop's thread is not woken for it); a generous poll here, so
    # that a loaded machine still answers within it
    from elsewhere.peer import controller

    # (the loop reads a result whose caller was not waiting yet: on a machine loaded by the
    # rest of the suite, 95 of 200 once; rounds go on, five at most, until one reads half)
    monkeypatch.setattr(controller, "_SPIN_LEAST_S", 0.05)
    seen = []
    for _ in range(5):
        with ew.Executor(on=on) as ex:
            got = [ex.submit(square, k).result(timeout=30) for k in range(200)]
            reads = ex._stream.link.counters().get("caller_reads", 0)
        assert got == [k * k for k in range(200)]
        seen.append(reads)
        if reads >= 100:
            break
    else:
        raise AssertionError(f"no round of 200 calls had half its results read by their callers: {seen}")


def test_with_no_spin_the_loop_reads_every_result(on: PeerCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELSEWHERE_PEER_SPIN_MS", "0")
    with ew.Executor(on=on) as ex:
        assert [ex.submit(square, k).result(timeout=30) for k in range(100)] == [k * k for k in range(100)]
        assert ex._stream.link.counters().get("caller_reads", 0) == 0


def test_callers_in_several_threads_each_get_their_own_results(
        on: PeerCluster, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # one connection, four waiting threads: one reads it at a time, the others wait as
    # usual, and each result reaches its own future whoever read it
    from elsewhere.peer import controller

    monkeypatch.setattr(controller, "_SPIN_LEAST_S", 0.05)
    with ew.Executor(on=on) as ex:
        # (a caller reads only when it finds its call sent and the loop idle: on a loaded
        # machine a round may have the loop read every result, so rounds go on until one
        # caller has read, a few at most)
        for _ in range(5):
            got: dict[int, list[int]] = {}

            def run(t: int, got: dict[int, list[int]] = got) -> None:
                got[t] = [ex.submit(square, 1000 * t + k).result(timeout=30) for k in range(60)]

            threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert got == {t: [(1000 * t + k) ** 2 for k in range(60)] for t in range(4)}
            reads = ex._stream.link.counters().get("caller_reads", 0)
            if reads:
                break
    assert reads > 0


def test_a_timeout_holds_while_the_caller_polls(on: PeerCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # the tasks so far were short, so the caller polls for the next; a task that is not
    # short still times out when asked to (and runs on)
    from elsewhere.peer import controller

    monkeypatch.setattr(controller, "_SPIN_LEAST_S", 10.0)
    monkeypatch.setenv("ELSEWHERE_PEER_SPIN_MS", "1000")  # (a poll as long as the timeout allows)
    with ew.Executor(on=on) as ex:
        assert [ex.submit(square, k).result(timeout=30) for k in range(50)] == [k * k for k in range(50)]
        slow = ex.submit(time.sleep, 5)
        t0 = time.monotonic()
        with pytest.raises(cf.TimeoutError, match=r"did not finish within 0\.1 s"):
            slow.result(timeout=0.1)
        assert time.monotonic() - t0 < 0.9  # not the whole second of polling
        assert not slow.done()
        assert ex.kill(slow)
        assert ex.submit(square, 3).result(timeout=30) == 9


def test_a_bad_spin_setting_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from elsewhere.peer.controlstate import _spin_s

    monkeypatch.setenv("ELSEWHERE_PEER_SPIN_MS", "fast")
    with pytest.raises(ElsewhereError, match="ELSEWHERE_PEER_SPIN_MS must be 0 to 1000"):
        _spin_s()
    monkeypatch.setenv("ELSEWHERE_PEER_SPIN_MS", "0.5")
    assert _spin_s() == 0.0005
