"""A client that finds fewer idle workers than it wants waits a moment for the pool's busy ones
to come back (a job submitted right after the one before finds its workers still leaving it)
rather than starting new ones that would stay beside them until their idle timeout.

The pool is a real pool folder with real FIFOs; the test holds the read end of a worker's FIFO
as the worker does, and makes its ``idle/<wid>`` marker as the worker does when it comes back.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from elsewhere.backends import localworkers
from elsewhere.backends.localworkers import take_idle_or_returning


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    for sub in ("idle", "fifo"):
        (tmp_path / sub).mkdir()
    return tmp_path


def _worker(pool: Path, wid: str) -> int:
    """A live worker's FIFO: made and held open for reading (read-write, as a worker holds it)."""
    os.mkfifo(pool / "fifo" / wid, 0o600)
    return os.open(pool / "fifo" / wid, os.O_RDWR | os.O_NONBLOCK)


def test_a_busy_worker_that_comes_back_is_taken_rather_than_a_new_one_started(pool: Path) -> None:
    reader = _worker(pool, "w1")
    back = threading.Timer(0.2, lambda: (pool / "idle" / "w1").touch())  # it leaves its last job
    back.start()
    try:
        taken = take_idle_or_returning(pool, 1, wait_s=60)
        assert [wid for wid, _ in taken] == ["w1"]
        assert not (pool / "idle" / "w1").exists()  # ours alone: its marker is taken
        for _, fd in taken:
            os.close(fd)
    finally:
        back.cancel()
        os.close(reader)


def test_with_no_busy_worker_nothing_is_waited_for(pool: Path) -> None:
    reader = _worker(pool, "w1")
    (pool / "idle" / "w1").touch()
    try:
        t0 = time.monotonic()
        taken = take_idle_or_returning(pool, 3, wait_s=60)  # one idle, none busy: two to start
        assert [wid for wid, _ in taken] == ["w1"]
        assert time.monotonic() - t0 < 30  # not the 60 s a busy worker would be waited for
        for _, fd in taken:
            os.close(fd)
    finally:
        os.close(reader)


def test_a_fifo_no_worker_reads_is_not_waited_for_and_goes_once_old(pool: Path, monkeypatch) -> None:
    os.mkfifo(pool / "fifo" / "killed", 0o600)  # its worker was killed: nobody reads it
    t0 = time.monotonic()
    assert take_idle_or_returning(pool, 1, wait_s=60) == []
    assert time.monotonic() - t0 < 30
    assert (pool / "fifo" / "killed").exists()  # young: perhaps a worker that starts
    later = time.time() + 120
    monkeypatch.setattr(localworkers.time, "time", lambda: later)
    assert take_idle_or_returning(pool, 1, wait_s=60) == []
    assert not (pool / "fifo" / "killed").exists()


def test_a_worker_busy_for_longer_is_waited_for_at_most_the_wait(pool: Path) -> None:
    reader = _worker(pool, "w1")  # busy with a long job of another client
    try:
        assert take_idle_or_returning(pool, 1, wait_s=0.05) == []  # then the caller starts one
    finally:
        os.close(reader)


def test_the_jobs_own_busy_workers_are_not_waited_for(pool: Path) -> None:
    # after prepare() started them, a job's own workers are busy in it: they do not come back
    reader = _worker(pool, "w1")
    asked = []
    try:
        t0 = time.monotonic()
        assert take_idle_or_returning(pool, 2, wait_s=60, exclude=lambda: asked.append(1) or ["w1"]) == []
        assert time.monotonic() - t0 < 30 and asked == [1]
    finally:
        os.close(reader)


def test_a_dead_workers_marker_fifo_and_kit_are_removed_when_a_client_finds_it(pool: Path) -> None:
    os.mkfifo(pool / "fifo" / "w1", 0o600)  # no reader: its worker was killed
    (pool / "idle" / "w1").touch()
    (pool / "kit").mkdir()
    (pool / "kit" / "w1.log").touch()
    assert localworkers.take_idle(pool) == []
    assert [p.name for p in pool.rglob("*") if p.is_file() or p.is_fifo()] == []
