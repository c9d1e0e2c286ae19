"""The watcher of a worker given its tasks (run/supervise.py), driven with stand-in workers
on a real job folder: what a dead worker's tasks become, and that it is not started again
for ever when no task of its own killed it."""

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


def _store(tmp_path: Path, n: int, retries: int = 0) -> JobStore:
    store = create_store(tmp_path, {"id": "j", "name": "j", "n_tasks": n}, retries=retries, stream=False, n_tasks=n)
    (store.path / "workers").mkdir(exist_ok=True)
    return store


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _worker(store: JobStore, log: Path, *, crash_in: int | None):
    """A stand-in worker: notes its call; the first one dies in task ``crash_in`` (its map
    names it: -1 for none), the next ones end well."""

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


def test_the_task_a_dead_worker_ran_is_lost_and_its_others_run_each_written_alone(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 4), tmp_path / "calls"
    assert supervise(str(store.path), "w", [0, 1, 2, 3], _worker(store, log, crash_in=1)) == 1  # a task lost
    assert _calls(log) == [{"name": "w", "tasks": [0, 1, 2, 3], "alone": False},
                           {"name": "w.1", "tasks": [0, 2, 3], "alone": True}]  # fmt: skip
    q = store.queue()
    assert "task 1 was lost: its process exited with code 9" in (q.lost_reason(1) or "")
    assert CUR.unpack(open(store.path / "workers" / "w.cur", "rb").read())[0] == -1  # accounted for, once


def test_while_retries_last_the_task_runs_again_in_the_next_worker(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 3, retries=1), tmp_path / "calls"
    assert supervise(str(store.path), "w", [0, 1, 2], _worker(store, log, crash_in=2)) == 0
    assert _calls(log)[1] == {"name": "w.1", "tasks": [0, 1, 2], "alone": True}
    assert store.queue().attempt(2) == 1 and store.queue().lost_reason(2) is None


def test_a_worker_that_dies_before_any_task_of_its_own_is_not_started_again(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 3), tmp_path / "calls"
    assert supervise(str(store.path), "w", [0, 1, 2], _worker(store, log, crash_in=-1)) == 9
    assert len(_calls(log)) == 1  # the backend reports its tasks, as for any element that failed


def test_a_signal_to_the_watcher_stops_its_worker_which_is_not_started_again(tmp_path: Path) -> None:
    store, log = _store(tmp_path, 2), tmp_path / "calls"
    script = textwrap.dedent(f"""
        import json, time
        from elsewhere.run.supervise import supervise

        def run(name, tasks, alone):
            with open({str(log)!r}, "a") as f:
                f.write(json.dumps({{"name": name}}) + "\\n")
            time.sleep(60)
            return 0

        raise SystemExit(supervise({str(store.path)!r}, "w", [0, 1], run))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _calls(log), "the worker did not start"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == -signal.SIGTERM  # killed by it, as its scheduler expects
    assert len(_calls(log)) == 1
