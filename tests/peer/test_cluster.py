"""The peer backend end to end: real worker daemons on loopback, real controllers.

Two workers (one slot each) with a fresh group key serve every test of the
module; tests that break workers start their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from peer_procs import Workers, env, free_port, wait_until

import elsewhere as ew
from elsewhere.backends.peer import PeerCluster, peers
from elsewhere.peer.keys import write_key
from elsewhere.util.errors import ConfigError, TaskError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, Workers]]:
    tmp = tmp_path_factory.mktemp("lab")
    key = write_key("lab", tmp / "lab.key")
    port = free_port()
    with Workers(tmp, 2, port=port, key=key) as workers:
        yield key, port, workers


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


def test_map_pow_gives_the_results_in_order(on: PeerCluster) -> None:
    assert ew.map(pow, [1, 2, 3], [2, 2, 2], on=on) == [1, 4, 9]


def square_in_a_while(x: int) -> tuple[int, int]:
    time.sleep(0.005)  # short, but not so short that one worker is done before the other starts
    return x * x, os.getppid()  # and the worker daemon that ran it


def test_many_tiny_tasks_spread_over_both_workers(on: PeerCluster) -> None:
    job = ew.submit(square_in_a_while, range(400), on=on)
    job.wait(timeout=60)
    results = job.results()
    assert [r[0] for r in results] == [x * x for x in range(400)]
    daemons = {r[1] for r in results}
    assert len(daemons) == 2, daemons  # both workers took part
    job.purge()


def draw(_: int) -> float:
    import numpy as np

    return float(np.random.rand())


def test_numpy_random_differs_per_task_and_repeats_with_the_seed(on: PeerCluster) -> None:
    a = ew.map(draw, range(8), on=on, seed=7)
    b = ew.map(draw, range(8), on=on, seed=7)
    assert len(set(a)) == 8  # not the same stream in every task
    assert a == b  # seed + task index, whichever worker ran it


def test_numpy_random_rand_itself_as_the_task_function_is_seeded_per_task(on: PeerCluster) -> None:
    import numpy as np

    got = ew.map(np.random.rand, [2] * 6, on=on, seed=5)
    assert len({tuple(a) for a in got}) == 6  # not one copy of the caller's generator per worker
    assert [a.tolist() for a in got] == [a.tolist() for a in ew.map(np.random.rand, [2] * 6, on=ew.local(cores=2), seed=5)]


def draw_both(_: int) -> tuple[float, float]:
    import random

    import numpy as np

    rand = random.random  # bound for a hot loop: must be seeded, and the C method
    return rand(), float(np.random.rand())


def test_seeds_are_those_of_every_other_backend(on: PeerCluster) -> None:
    import random

    import numpy as np

    got = ew.map(draw_both, range(6), on=on, seed=77)
    assert got == [(random.Random(77 + i).random(),
                    float(np.random.RandomState(np.random.SeedSequence(77, spawn_key=(i,)).generate_state(4)).rand()))
                   for i in range(6)]


def fails_on_two(x: int) -> int:
    if x == 2:
        raise ValueError(f"bad input {x}")
    return x


def test_user_errors_come_back_as_task_errors(on: PeerCluster) -> None:
    out = ew.map(fails_on_two, range(4), on=on, errors="return")
    assert out[:2] == [0, 1] and out[3] == 3
    err = out[2]
    assert isinstance(err, TaskError) and err.type_name == "ValueError"
    assert "bad input 2" in err.message and "fails_on_two" in err.traceback
    with pytest.raises(ValueError, match="bad input 2"):
        ew.map(fails_on_two, range(4), on=on)


def chatty(x: int) -> int:
    import sys
    import warnings

    print(f"out {x}")
    os.write(2, f"fd2 {x}\n".encode())  # below Python: captured at the fd level
    if x == 1:
        warnings.warn(f"careful {x}", stacklevel=1)
    if x == 2:
        sys.stdout.flush()
        raise RuntimeError("boom")
    return x


@pytest.mark.parametrize("diary, logged", [("always", {0, 1, 2}), ("warning", {1, 2}),
                                            ("error", {2}), ("never", set())])  # fmt: skip
def test_output_comes_back_with_the_result(lab: tuple[Path, int, Workers], ew_home: Path,
                                           diary: str, logged: set[int]) -> None:  # fmt: skip
    key, port, _ = lab
    job = ew.submit(chatty, range(3), on=peers("lab", key=key, port=port, interface="127.0.0.1",
                                               diary=diary))  # fmt: skip
    job.wait(timeout=30)
    logs = {i: job.log(i) for i in range(3)}
    assert {i for i, text in logs.items() if text} == logged
    if 1 in logged:
        assert "out 1" in logs[1] and "fd2 1" in logs[1] and "careful 1" in logs[1]
    if 2 in logged:
        assert "out 2" in logs[2]
    job.purge()


def warns(x: int) -> tuple[int, float]:
    import os
    import time
    import warnings

    began = time.time()
    if x == IGNORES:
        warnings.simplefilter("ignore")  # for this task only
    warnings.warn("careful", stacklevel=1)  # one line for all: shown once per task, not once
    return os.getpid(), began


IGNORES = 20  # the task that silences its warnings: mid-batch, with tasks after it


def test_each_task_sees_its_warnings_and_its_filters_are_its_own(
        lab: tuple[Path, int, Workers], ew_home: Path) -> None:  # fmt: skip
    key, port, _ = lab
    followed = False  # a task ran after the one that silenced its warnings, in its process
    for _attempt in range(5):  # (how the tasks fall into batches is the controller's choice)
        job = ew.submit(warns, range(40), on=peers("lab", key=key, port=port, interface="127.0.0.1",
                                                   diary="always"))  # fmt: skip
        job.wait(timeout=30)
        ran = job.results()
        pid, began = ran[IGNORES]
        assert {i for i in range(40) if "careful" in job.log(i)} == set(range(40)) - {IGNORES}
        job.purge()
        followed = any(p == pid and t > began for p, t in ran)
        if followed:
            break
    assert followed


def where(_: int) -> tuple[str, bool]:
    import helper_mod  # only importable from the caller's sys.path

    return os.getcwd(), helper_mod.VALUE == 42


def test_tasks_run_in_the_callers_cwd_with_its_sys_path(on: PeerCluster, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("VALUE = 42\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(lib))
    assert ew.map(where, range(2), on=on) == [(str(work), True)] * 2


def test_executor_submit_and_results(on: PeerCluster) -> None:
    with ew.Executor(on=on) as ex:
        futs = [ex.submit(pow, i, 2) for i in range(20)]
        assert [f.result(timeout=20) for f in futs] == [i * i for i in range(20)]
        bad = ex.submit(fails_on_two, 2)
        with pytest.raises(ValueError, match="bad input 2"):
            bad.result(timeout=20)


def test_job_states_and_task_hosts(on: PeerCluster) -> None:
    job = ew.submit(time.sleep, [0.4, 0.4], on=on)
    wait_until(lambda: job.check().running == 2, 10, "both tasks to run")
    assert all(t.host for t in job.tasks)
    job.wait(timeout=20)
    assert job.state.value == "finished" and job.results() == [None, None]
    job.purge()


def test_cancel_stops_the_running_tasks(on: PeerCluster, tmp_path: Path) -> None:
    job = ew.submit(time.sleep, [30, 30, 30], on=on)
    wait_until(lambda: job.check().running >= 1, 10, "a task to run")
    t0 = time.monotonic()
    job.cancel()
    assert job.state.value == "cancelled"
    # the workers are free again at once: a new job runs
    assert ew.map(square, [3], on=on) == [9]
    assert time.monotonic() - t0 < 10


def test_cancel_reaches_the_workers_when_the_stop_is_seen_first(on: PeerCluster) -> None:
    # job.cancel() asks the controller to cancel, then to stop; a loop turn that began
    # before both (its select had returned) must still tell the workers to drop the tasks
    job = ew.submit(time.sleep, [30, 30], on=on)
    wait_until(lambda: job.check().running == 2, 15, "both tasks to run")
    controller = on.controller(job)
    assert controller is not None
    canceller = threading.Thread(target=job.cancel)
    with controller._state:  # the loop waits here with what its select returned
        time.sleep(0.4)  # longer than the loop's select timeout: it waits on this lock
        canceller.start()
        wait_until(controller._stop.is_set, 10, "cancel() to reach stop()")
    canceller.join(15)
    assert not canceller.is_alive()
    t0 = time.monotonic()
    assert ew.map(square, [3, 4], on=on) == [9, 16]  # both workers are free again
    assert time.monotonic() - t0 < 10  # a worker left running a sleep needs 30 s


def test_memory_nobody_offers_is_explained_not_run(lab: tuple[Path, int, Workers],
                                                   ew_home: Path) -> None:  # fmt: skip
    key, port, _ = lab
    job = ew.submit(square, [1], on=peers("lab", key=key, port=port, interface="127.0.0.1",
                                          memory="100T"))  # fmt: skip
    wait_until(lambda: "memory" in job.check().note, 30, "a note on the job naming memory")
    status = job.check()  # (a Status is true only once the job is done)
    assert "memory" in status.note and status.queued == 1
    job.cancel()
    job.purge()


def nbytes_of(a: object) -> int:
    return int(a.nbytes)  # type: ignore[attr-defined]


def test_a_task_too_large_for_one_message_fails_at_once_and_batches_are_split(
        on: PeerCluster, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import numpy as np

    from elsewhere.peer import wire

    real = wire.Limits
    monkeypatch.setattr(wire, "Limits", lambda: real(max_body_bytes=1 << 20))  # this controller's cap
    small, big = np.ones(40_000), np.ones(300_000)  # 320 kB, 2.4 MB
    job = ew.submit(nbytes_of, [small, big, small], on=on)
    job.wait(timeout=60)
    values = job.results()
    assert values[0] == values[2] == small.nbytes
    assert isinstance(values[1], TaskError) and "over what one message to a worker may carry" in str(values[1])
    # many tasks of 448 kB: batches of three or more would be over 1 MiB; they are split
    mediums = [np.full(56_000, float(i)) for i in range(60)]  # each its own (no shared pickle)
    job = ew.submit(nbytes_of, mediums, on=on)
    job.wait(timeout=120)
    assert job.results() == [56_000 * 8] * 60
    assert on.counters(job).get("batches_split", 0) > 0


def test_a_wait_with_no_peer_says_so_and_how_to_start_one(ew_home: Path, tmp_path: Path) -> None:
    key = write_key("nobody", tmp_path / "nobody.key")
    port = free_port()  # no worker announces here
    with pytest.raises(ew.TimeoutError) as err:
        ew.map(square, [1, 2], on=peers("nobody", key=key, port=port, interface="127.0.0.1"), timeout=3)
    message = str(err.value)
    assert "none seen yet in group 'nobody'" in message
    assert f"elsewhere peer worker --port {port} --group nobody" in message


def test_a_missing_group_key_is_a_clear_error(ew_home: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "cfg"))
    with pytest.raises(ConfigError, match="elsewhere peer keygen nolab"):
        peers("nolab")


def slow_square(x: int) -> int:
    time.sleep(0.6)
    return x * x


def test_a_worker_killed_mid_task_loses_nothing(ew_home: Path, tmp_path: Path) -> None:
    key = write_key("lab", tmp_path / "k.key")
    port = free_port()
    with Workers(tmp_path, 2, port=port, key=key) as workers:
        job = ew.submit(slow_square, range(6), on=peers("lab", key=key, port=port,
                                                        interface="127.0.0.1"))  # fmt: skip
        wait_until(lambda: job.check().running == 2, 15, "tasks on both workers")
        workers[0].kill()  # SIGKILL: daemon and child, mid-task
        job.wait(timeout=30)
        assert job.results() == [x * x for x in range(6)]
        job.purge()


def crash_first_time(x: int) -> int:
    if ew.task().attempt == 0 and x == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return x


def test_a_crashing_task_is_retried_and_the_worker_survives(on: PeerCluster) -> None:
    assert ew.map(crash_first_time, range(3), on=on, retries=1) == [0, 1, 2]
    out = ew.map(crash_first_time, range(3), on=on, retries=0, errors="return")
    assert out[0] == 0 and out[2] == 2
    assert isinstance(out[1], TaskError) and out[1].reason == "lost"
    assert "task 1 was lost: its process was killed by SIGSEGV" in out[1].message
    assert ew.map(square, [5], on=on) == [25]  # the daemons carried on


class _KillsWhenPickled:
    """A value whose pickling kills its task process (as a value too large for its memory
    would, or a crash in a library's reduce)."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        os._exit(9)


def _result_kills_its_process(x: int, bad: int) -> object:
    return _KillsWhenPickled() if x == bad else x


def test_a_result_that_kills_its_task_process_fails_its_own_task_alone(on: PeerCluster) -> None:
    # 50 tiny tasks: a batch's values are pickled together (one group), so the death cannot
    # say whose value did it. Not the first task of the group charged in its place: the tasks
    # come back each in a batch of its own, and the culprit alone is charged.
    assert ew.map(_result_kills_its_process, [0], [-1], on=on) == [0]  # this module loaded
    out = ew.map(_result_kills_its_process, range(50), [20] * 50, on=on, errors="return")
    assert isinstance(out[20], TaskError) and out[20].reason == "lost", out[20]
    assert "task 20 was lost" in out[20].message, out[20].message
    assert [r for i, r in enumerate(out) if i != 20] == [i for i in range(50) if i != 20]
    assert ew.map(square, range(4), on=on) == [0, 1, 4, 9]  # the daemons carried on


class _KillsWhenUnpickled:
    """An input whose unpickling kills a process other than the one that made it (the
    controller, in the caller, reads the inputs again to send them in batches)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_kills_when_loaded, (self.pid,))


def _kills_when_loaded(pid: int) -> _KillsWhenUnpickled:
    if os.getpid() != pid:
        os._exit(9)
    return _KillsWhenUnpickled(pid)


def test_an_input_that_kills_its_task_process_fails_its_own_task_alone(on: PeerCluster) -> None:
    inputs: list[object] = list(range(50))
    inputs[30] = _KillsWhenUnpickled(os.getpid())
    out = ew.map(str, inputs, on=on, errors="return")
    assert isinstance(out[30], TaskError) and out[30].reason == "lost", out[30]
    assert [r for i, r in enumerate(out) if i != 30] == [str(i) for i in range(50) if i != 30]


def test_a_task_past_its_time_is_stopped(lab: tuple[Path, int, Workers], ew_home: Path) -> None:
    key, port, _ = lab
    t0 = time.monotonic()
    out = ew.map(time.sleep, [30], on=peers("lab", key=key, port=port, interface="127.0.0.1",
                                            time="1s"), errors="return")  # fmt: skip
    assert isinstance(out[0], TaskError) and out[0].type_name == "TaskKilled"
    assert "time" in out[0].message
    assert time.monotonic() - t0 < 15


def hog(mb: int) -> int:
    block = bytearray(mb << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(3)
    return len(block)


def test_a_task_past_its_memory_is_stopped(lab: tuple[Path, int, Workers], ew_home: Path) -> None:
    key, port, _ = lab
    out = ew.map(hog, [400], on=peers("lab", key=key, port=port, interface="127.0.0.1",
                                      memory="64M"), errors="return")  # fmt: skip
    assert isinstance(out[0], TaskError) and out[0].type_name == "TaskKilled"
    assert "MiB" in out[0].message


def test_a_task_that_declared_no_memory_is_held_to_what_the_worker_offers(ew_home: Path, tmp_path: Path) -> None:
    key = write_key("lab", tmp_path / "k.key")
    port = free_port()
    with Workers(tmp_path, 1, port=port, key=key, args=["--memavail", "200M"]) as workers:
        out = ew.map(hog, [10, 400], on=peers("lab", key=key, port=port, interface="127.0.0.1"),
                     errors="return")  # fmt: skip
        assert out[0] == 10 << 20
        assert isinstance(out[1], TaskError) and out[1].type_name == "TaskKilled"
        assert "200 MiB this worker offers" in out[1].message and "ew.peers(memory=" in out[1].message
        wait_until(lambda: workers[0].stats().get("memory_kills") == 1, 10, "the kill counted")


HELPER_TASK = """
import os

def value(_):
    import lab_helper  # the user's own module, imported by the task
    return lab_helper.VALUE, os.getpid(), os.environ.get("ROUND", "")
"""


def test_children_that_imported_user_modules_serve_later_jobs_of_the_same_folder_until_a_file_changes(
        ew_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    project = tmp_path / "project"
    project.mkdir()
    (project / "lab_tasks.py").write_text(HELPER_TASK)
    helper = project / "lab_helper.py"
    helper.write_text("VALUE = 1\n")
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    import lab_tasks  # type: ignore[import-not-found]

    key = write_key("lab", tmp_path / "k.key")
    port = free_port()
    with Workers(tmp_path, 1, port=port, key=key, slots=2) as workers:
        on = peers("lab", key=key, port=port, interface="127.0.0.1")

        def stats() -> dict[str, Any]:
            time.sleep(1.2)  # the stats are written every second
            return workers[0].stats()

        first = ew.map(lab_tasks.value, range(6), on=on)
        assert {v for v, _, _ in first} == {1}
        there = set(stats()["children"])  # those that ran it, and a clean spare
        assert {p for _, p, _ in first} <= there
        # a later job (each ew.map is one) of the same folder: in the processes there were
        again = ew.map(lab_tasks.value, range(6), on=on)
        assert {v for v, _, _ in again} == {1}
        assert {p for _, p, _ in again} <= there
        assert {p for _, p, _ in again} & {p for _, p, _ in first}
        # the module edited (a notebook's user changes it and maps again): fresh processes
        # that import the new version
        helper.write_text("VALUE = 22\n")
        edited = ew.map(lab_tasks.value, range(6), on=on)
        assert {v for v, _, _ in edited} == {22}
        assert not {p for _, p, _ in edited} & {p for _, p, _ in first + again}
        before = stats()["children_started"]
        # another environment is another context: fresh processes again
        other = ew.map(lab_tasks.value, range(6), on=on, env={"ROUND": "2"})
        assert {(v, r) for v, _, r in other} == {(22, "2")}
        assert not {p for _, p, _ in other} & {p for _, p, _ in edited}
        assert stats()["children_started"] > before


RECOVER_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import elsewhere as ew
    from elsewhere.backends.peer import peers
    job = ew.submit(time.sleep, [0.3] * 6, name="recover-me",
                    on=peers("lab", key=sys.argv[1], port=int(sys.argv[2]), interface="127.0.0.1"))
    while job.check().finished < 1:
        time.sleep(0.02)
    os._exit(0)  # the controller dies with this process, mid-job
""")


def test_a_recovered_job_continues_in_a_new_process(lab: tuple[Path, int, Workers], ew_home: Path,
                                                    tmp_path: Path) -> None:  # fmt: skip
    key, port, _ = lab
    script = tmp_path / "submit.py"
    script.write_text(RECOVER_SCRIPT)
    subprocess.run([sys.executable, str(script), str(key), str(port)], check=True, timeout=30,
                   env=env({"ELSEWHERE_HOME": str(ew_home)}))  # fmt: skip
    job = ew.recover("recover-me")
    assert not job.state.done
    ran_by = job.cluster.get_job_cluster_data(job)["controller"]
    # a look from the shell says who carries it on, and starts no controller of its own
    # (it would end with the command, its tasks half sent)
    shown = subprocess.run([sys.executable, "-m", "elsewhere", "status", "recover-me"], capture_output=True,
                           text=True, timeout=30, env=env({"ELSEWHERE_HOME": str(ew_home)}))  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "no controller runs it now" in shown.stdout and "elsewhere wait recover-me" in shown.stdout
    assert job.cluster.get_job_cluster_data(job)["controller"] == ran_by
    job.wait(timeout=30)
    assert job.results() == [None] * 6
    job.purge()


OWN_MODULE_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import elsewhere as ew
    from elsewhere.backends.peer import peers
    import labcode  # the user's own module, in the folder the script runs in
    job = ew.submit(labcode.slow_cube, range(6), name="own-module",
                    on=peers("lab", key=sys.argv[1], port=int(sys.argv[2]), interface="127.0.0.1"))
    while job.check().finished < 1:
        time.sleep(0.05)
    os._exit(0)  # the controller dies with this process, mid-job
""")


def test_a_job_of_the_users_own_module_is_carried_on_from_another_folder(
        lab: tuple[Path, int, Workers], ew_home: Path, tmp_path: Path) -> None:  # fmt: skip
    key, port, _ = lab
    project = tmp_path / "project"
    project.mkdir()
    (project / "labcode.py").write_text("import time\ndef slow_cube(x):\n    time.sleep(0.3)\n    return x ** 3\n")
    (project / "submit.py").write_text(OWN_MODULE_SCRIPT)
    run_env = env({"ELSEWHERE_HOME": str(ew_home)})
    subprocess.run([sys.executable, "submit.py", str(key), str(port)], check=True, timeout=30, cwd=project,
                   env=run_env)  # fmt: skip
    assert not ew.recover("own-module").state.done
    # `elsewhere wait` from a shell elsewhere, where `labcode` cannot be imported: its
    # controller reads the remaining tasks from the payload, which names the module
    elsewhere_ = tmp_path / "elsewhere"
    elsewhere_.mkdir()
    done = subprocess.run([sys.executable, "-m", "elsewhere", "wait", "own-module", "--no-progress"],
                          capture_output=True, text=True, timeout=60, cwd=elsewhere_, env=run_env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    job = ew.recover("own-module")
    assert job.results() == [x**3 for x in range(6)]
    job.purge()


DETACH_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import elsewhere as ew
    from elsewhere.backends.peer import peers
    on = peers("lab", key=sys.argv[1], port=int(sys.argv[2]), interface="127.0.0.1", detach=True)
    job = ew.submit(time.sleep, [float(sys.argv[3])] * 6, name=sys.argv[4], on=on)
    print(os.getpid())  # and ends at once: the job goes on without it
""")


def _background_controller(job: ew.Job) -> int:
    return int(job.cluster.get_job_cluster_data(job)["controller"]["pid"])


def _ended(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # (its parent is gone)
    except psutil.NoSuchProcess:
        return True


def test_a_detached_job_goes_on_after_the_process_that_submitted_it(lab: tuple[Path, int, Workers],
                                                                    ew_home: Path, tmp_path: Path) -> None:  # fmt: skip
    key, port, _ = lab
    script = tmp_path / "submit.py"
    script.write_text(DETACH_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(key), str(port), "0", "detached"], check=True,
                         timeout=30, capture_output=True, text=True, env=env({"ELSEWHERE_HOME": str(ew_home)}))  # fmt: skip
    submitter = int(out.stdout.split()[-1])
    job = ew.recover("detached")
    runner = _background_controller(job)
    assert runner not in (submitter, os.getpid())
    job.wait(timeout=60)  # no controller here: this process watches the job folder
    assert job.cluster.controller(job) is None
    assert job.results() == [None] * 6
    wait_until(lambda: _ended(runner), 30, "the background controller to end with its job")
    assert "finished" in (job.store.path / "controller.log").read_text()
    job.purge()


def test_a_background_controller_leaves_no_result_unacknowledged(lab: tuple[Path, int, Workers],
                                                                 ew_home: Path) -> None:  # fmt: skip
    key, port, workers = lab
    on = peers("lab", key=key, port=port, interface="127.0.0.1", detach=True)

    def tasks() -> int:
        return sum(int(w.stats().get("tasks", 0)) for w in workers)

    def unacked() -> int:
        return sum(int(w.stats().get("unacked", 0)) for w in workers)

    before = tasks()
    # (the workers serve the module's other tests too: one that cut a controller off leaves
    # results they keep for their grace; this job must add none)
    unacked_before = unacked()
    job = ew.submit(pow, [1, 2, 3], [2, 2, 2], on=on)
    runner = _background_controller(job)
    job.wait(timeout=60)
    assert job.results() == [1, 4, 9]
    wait_until(lambda: _ended(runner), 30, "the background controller to end with its job")
    wait_until(lambda: tasks() >= before + 3, 10, "the workers' counters to show the tasks")
    # it was stopped as its process ended, not cut off: its last results were acknowledged
    # (else the workers keep them for their grace, 10 minutes)
    wait_until(lambda: unacked() <= unacked_before, 10, "no result of this job left unacknowledged")
    job.purge()


def test_map_keeps_its_controller_here_whatever_detach_says(on: PeerCluster) -> None:
    detached = peers(on.group, key=on.key_file, port=on.port, interface="127.0.0.1", detach=True)
    assert ew.map(pow, [2, 3], [2, 2], on=detached, keep=True, name="kept") == [4, 9]  # it waits anyway
    job = ew.recover("kept")
    assert job.cluster.get_job_cluster_data(job)["controller"]["pid"] == os.getpid()
    job.purge()


@pytest.mark.parametrize("how", ["cancel", "purge"])
def test_a_detached_job_can_be_cancelled_from_anywhere(lab: tuple[Path, int, Workers], ew_home: Path,
                                                       tmp_path: Path, how: str) -> None:  # fmt: skip
    key, port, _ = lab
    script = tmp_path / "submit.py"
    script.write_text(DETACH_SCRIPT)
    subprocess.run([sys.executable, str(script), str(key), str(port), "30", "long"], check=True, timeout=30,
                   capture_output=True, env=env({"ELSEWHERE_HOME": str(ew_home)}))  # fmt: skip
    job = ew.recover("long")
    runner = _background_controller(job)
    # what runs is seen from here, though the controller runs in another process
    wait_until(lambda: job.check().running == 2, 30, "two tasks to run")
    if how == "cancel":
        job.cancel()
        wait_until(lambda: _ended(runner), 30, "the background controller to end")
        assert job.state.value == "cancelled"
    else:
        job.purge()  # cancels it first, and waits for its controller to end
        assert _ended(runner)
    # both workers dropped the running sleeps: a new job runs on them at once
    on = peers("lab", key=key, port=port, interface="127.0.0.1")
    assert ew.map(square, [3, 4], on=on, timeout=20) == [9, 16]


HAND_OFF_SCRIPT = textwrap.dedent("""
    import sys, time
    import elsewhere as ew
    from elsewhere.backends.peer import peers
    job = ew.submit(time.sleep, [0.3] * 6, name="handed-off",
                    on=peers("lab", key=sys.argv[1], port=int(sys.argv[2]), interface="127.0.0.1"))
    while job.check().finished < 1:
        time.sleep(0.02)
    # and the script ends (a notebook closed): its controller hands the job on
""")


def test_a_process_that_ends_hands_its_unfinished_job_to_a_background_controller(
        lab: tuple[Path, int, Workers], ew_home: Path, tmp_path: Path) -> None:  # fmt: skip
    key, port, _ = lab
    script = tmp_path / "submit.py"
    script.write_text(HAND_OFF_SCRIPT)
    subprocess.run([sys.executable, str(script), str(key), str(port)], check=True, timeout=30,
                   env=env({"ELSEWHERE_HOME": str(ew_home), "ELSEWHERE_PEER_HAND_OFF": "1"}))  # fmt: skip
    job = ew.recover("handed-off")
    runner = _background_controller(job)
    assert runner != os.getpid() and not _ended(runner)  # it runs the job, not this process
    job.wait(timeout=60)
    assert job.cluster.controller(job) is None and job.results() == [None] * 6
    wait_until(lambda: _ended(runner), 30, "the background controller to end with its job")
    job.purge()


def test_static_peers_where_multicast_is_not_allowed(ew_home: Path, tmp_path: Path) -> None:
    from peer_procs import WorkerProc

    key = write_key("lab", tmp_path / "k.key")
    mine, theirs = free_port(), free_port()  # one discovery port per peer on one host
    w = WorkerProc(["--key", str(key), "--port", str(theirs), "--interface", "127.0.0.1",
                    "--multicast-group", "none", "--peer", f"127.0.0.1:{mine}"],
                   tmp_path / "static.json")  # fmt: skip
    try:
        w.wait_started()
        on = peers("lab", key=key, port=mine, interface="127.0.0.1", multicast_group=None,
                   peers=[f"127.0.0.1:{theirs}"])  # fmt: skip
        assert ew.map(square, range(5), on=on) == [0, 1, 4, 9, 16]
    finally:
        w.stop()


def test_a_worker_that_refuses_this_user_is_named_with_its_reason(ew_home: Path, tmp_path: Path) -> None:
    import getpass

    from peer_procs import WorkerProc

    key = write_key("lab", tmp_path / "k.key")
    port = free_port()
    w = WorkerProc(["--key", str(key), "--port", str(port), "--interface", "127.0.0.1",
                    "--refuse-user", getpass.getuser()], tmp_path / "refuser.json")  # fmt: skip
    try:
        w.wait_started()
        job = ew.submit(square, [2], on=peers("lab", key=key, port=port, interface="127.0.0.1"))
        wait_until(lambda: "not allowed" in job.check().note, 30, "a note naming the refusal")
        note = job.check().note
        assert f"user '{getpass.getuser()}' is refused" in note and "not_allowed" not in note
        job.cancel()
        job.purge()
    finally:
        w.stop()


def from_attached(_: int) -> tuple[str, str, int]:
    import attached_helper  # only in the job's files=

    time.sleep(0.02)  # long enough for both workers to take some
    here = os.path.dirname(attached_helper.__file__)
    with open(os.path.join(here, "tables", "data.txt")) as f:
        return attached_helper.VALUE, f.read(), os.getppid()  # the worker daemon that ran it


def test_files_reach_the_tasks_on_every_worker(on: PeerCluster, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    inputs = tmp_path / "inputs"
    (inputs / "tables").mkdir(parents=True)
    (inputs / "attached_helper.py").write_text("VALUE = 'from the files'\n")
    (inputs / "tables" / "data.txt").write_text("table contents")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # neither the module nor the data is in the caller's directory
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning that files= are not sent
        job = ew.submit(from_attached, range(40), on=on,
                        files=[inputs / "attached_helper.py", inputs / "tables"])  # fmt: skip
    results = job.wait(timeout=60).results()
    assert [r[:2] for r in results] == [("from the files", "table contents")] * 40
    daemons = {r[2] for r in results}  # (a worker's info file is written when it connects:
    assert len(daemons) == 2, daemons  # the daemons that ran tasks say who got the files)
    job.purge()


def test_files_over_the_cap_fail_the_tasks_with_the_reason(on: PeerCluster, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from elsewhere.peer import attached

    monkeypatch.setattr(attached, "MAX_FILES_BYTES", 1000)
    (tmp_path / "big.bin").write_bytes(bytes(5000))
    job = ew.submit(square, [1, 2], on=on, files=[tmp_path / "big.bin"])
    with pytest.raises(TaskError, match="files= weigh"):
        job.wait(timeout=60).get()
    job.purge()


def test_a_cancel_from_the_shell_reaches_the_workers(lab: tuple[Path, int, Workers], on: PeerCluster,
                                                     ew_home: Path) -> None:  # fmt: skip
    # this process runs the controller; `elsewhere cancel` in another process only writes
    # the job folder: the running tasks must still be stopped on the workers
    _, _, workers = lab
    started = sum(w.stats().get("children_started", 0) for w in workers)
    job = ew.submit(time.sleep, [30, 30], on=on, name="cancel-me")
    wait_until(lambda: job.check().running == 2, 30, "both tasks running")
    out = subprocess.run([sys.executable, "-m", "elsewhere", "cancel", "cancel-me"], capture_output=True,
                         text=True, timeout=30, env=env({"ELSEWHERE_HOME": str(ew_home)}))  # fmt: skip
    assert out.returncode == 0, out.stderr
    job.wait(timeout=30)  # it sees the cancel, and has the controller here pass it on
    assert job.state is ew.JobState.CANCELLED
    # each worker killed the child running its task (and started a fresh one)
    wait_until(lambda: sum(w.stats().get("children_started", 0) for w in workers) >= started + 2, 15,
               "the running tasks to be killed")  # fmt: skip
    job.purge()


def blas_threads(_: int) -> tuple[int, str | None, list[int]]:
    """The task process, its OMP_NUM_THREADS and the threads of NumPy's BLAS."""
    from blas_probe import blas_threads as pools

    return os.getpid(), os.environ.get("OMP_NUM_THREADS"), pools()


def test_blas_in_a_task_has_as_many_threads_as_the_task_has_cores(
        ew_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Two tasks of a worker with 2 slots on 2 cores, each with BLAS on 2 threads, run 4
    threads on 2 cores: the tasks get the cores they were admitted with, one each, and a task
    process that already loaded BLAS for one core gets two for a task of two."""
    from blas_probe import no_thread_vars

    no_thread_vars(monkeypatch)  # the worker's environment: nothing set by its user
    key = write_key("lab", tmp_path / "k.key")
    port = free_port()
    with Workers(tmp_path, 1, port=port, key=key, slots=2):
        one = ew.map(blas_threads, range(2), on=peers("lab", key=key, port=port, interface="127.0.0.1"))
        two = ew.map(blas_threads, range(2), on=peers("lab", key=key, port=port, interface="127.0.0.1",
                                                       cores_per_task=2))  # fmt: skip
    assert [o[1:] for o in one] == [("1", [1])] * 2
    assert [o[1:] for o in two] == [("2", [2])] * 2
    assert {o[0] for o in two} & {o[0] for o in one}, "a process of the first job ran the second's"
