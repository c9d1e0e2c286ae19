"""The watcher of a worker given its tasks (run/supervise.py), driven with stand-in workers
on a real job folder: what runs again after a worker died, how the watcher ends, and that it
is not started again for ever when no task of its own killed it. It writes nothing to the
job folder: the task that killed its worker is reported lost by what reports the end of the
element (its backend, or the library), as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from elsewhere.folder.lifecycle import create_store
from elsewhere.folder.store import CUR, JobStore
from elsewhere.run.supervise import supervise


def _store(tmp_path: Path, n: int) -> JobStore:
    store = create_store(tmp_path, {"id": "j", "name": "j", "n_tasks": n}, retries=0, stream=False, n_tasks=n)
    (store.path / "workers").mkdir(exist_ok=True)
    return store


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _worker(store: JobStore, log: Path, *, crash_in: int | None):
    """A stand-in worker: notes its call; the first one dies in task ``crash_in`` (its map
    names it: -1 for none) with exit code 9, the next ones end well."""

    def run(name: str, tasks: list[int], alone: bool) -> int:
        first = not log.exists()
        with open(log, "a") as f:
            f.write(json.dumps({"name": name, "tasks": tasks, "alone": alone}) + "\n")
        if first and crash_in is not None:
            with open(store.path / "workers" / f"{name}.cur", "wb") as f:
                f.write(CUR.pack(crash_in, time.time(), 0))
            os._exit(9)
        return 0

    return run


def test_the_others_of_a_dead_worker_run_each_written_alone_and_the_watcher_ends_as_it(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 4), tmp_path / "calls"
    journals = sorted(os.listdir(store.path / "journal")) if (store.path / "journal").exists() else []
    assert supervise(str(store.path), "w", [0, 1, 2, 3], _worker(store, log, crash_in=1)) == 9
    assert _calls(log) == [{"name": "w", "tasks": [0, 1, 2, 3], "alone": False},
                           {"name": "w.1", "tasks": [0, 2, 3], "alone": True}]  # fmt: skip
    # nothing written: task 1 is for the backend (or the library) to report lost, once
    assert CUR.unpack((store.path / "workers" / "w.cur").read_bytes())[0] == 1
    assert (sorted(os.listdir(store.path / "journal")) if (store.path / "journal").exists() else []) == journals
    assert store.queue().lost_reason(1) is None and store.queue().attempt(1) == 0


def test_a_cancelled_task_is_not_run_again(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 4), tmp_path / "calls"
    with store.locked_queue() as q:
        q.d["cancelled_tasks"] = [3]
    supervise(str(store.path), "w", [0, 1, 2, 3], _worker(store, log, crash_in=1))
    assert _calls(log)[1]["tasks"] == [0, 2]


def test_a_worker_that_dies_before_any_task_of_its_own_is_not_started_again(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 3), tmp_path / "calls"
    assert supervise(str(store.path), "w", [0, 1, 2], _worker(store, log, crash_in=-1)) == 9
    assert len(_calls(log)) == 1  # its tasks are reported as for any element that failed


_SCRIPT = """
import json, os, signal, time
from elsewhere.run.supervise import supervise

def run(name, tasks, alone):
    with open({log!r}, "a") as f:
        f.write(json.dumps({{"name": name, "tasks": tasks}}) + "\\n")
    {body}
    return 0

raise SystemExit(supervise({job!r}, "w", [0, 1], run))
"""


def _watcher(store: JobStore, log: Path, body: str) -> subprocess.Popen:
    script = textwrap.dedent(_SCRIPT).format(log=str(log), job=str(store.path), body=body)
    return subprocess.Popen([sys.executable, "-c", script])


def test_a_worker_killed_by_sigkill_in_a_task_kills_its_watcher_the_same_way_after_the_rest(tmp_path: Path) -> None:
    # (what a scheduler or a plugin reads the cause of a lost task from: the OOM killer's signal)
    store, log = _store(tmp_path, 2), tmp_path / "calls"
    body = (f"if name == 'w':\n        open({str(store.path / 'workers' / 'w.cur')!r}, 'wb').write("
            f"__import__('struct').pack('<qdq', 0, time.time(), 0)); os.kill(os.getpid(), signal.SIGKILL)")  # fmt: skip
    proc = _watcher(store, log, body)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert [c["tasks"] for c in _calls(log)] == [[0, 1], [1]]


def test_a_signal_to_the_watcher_stops_its_worker_which_is_not_started_again(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 2), tmp_path / "calls"
    proc = _watcher(store, log, "time.sleep(60)")
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _calls(log), "the worker did not start"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == -signal.SIGTERM  # killed by it, as its scheduler expects
    assert len(_calls(log)) == 1


def test_a_task_that_raised_in_a_dead_worker_still_ends_the_watcher_failed(tmp_path: Path) -> None:
    # (an element whose task failed ends failed, whatever became of its worker: afterok)
    from elsewhere.folder import records
    from elsewhere.folder.records import Kind

    for kind, code in ((Kind.ERROR, 1), (Kind.OK, 0)):
        store, log = _store(tmp_path / kind.name, 3), tmp_path / f"calls-{kind.name}"

        def run(name: str, tasks: list[int], alone: bool, store: JobStore = store, log: Path = log,
                kind: Kind = kind) -> int:  # fmt: skip
            first = not log.exists()
            with open(log, "a") as f:
                f.write(json.dumps({"name": name, "tasks": tasks}) + "\n")
            if first:  # task 0's outcome written, then a death that names no task
                os.makedirs(store.path / "journal", exist_ok=True)
                with open(store.journal_path(name), "ab") as f:
                    f.write(records.pack_frame([records.make_record(kind, 0, 0)]))
                os._exit(9)
            return 0

        assert supervise(str(store.path), "w", [0, 1, 2], run) == code
        assert [c["tasks"] for c in _calls(log)] == [[0, 1, 2], [1, 2]]
