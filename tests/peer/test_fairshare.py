"""Fair share between controllers: the pure rule, then two real controllers on two workers."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from peer_procs import Workers, free_port, wait_until

import elsewhere as ew
from elsewhere.backends.peer import peers
from elsewhere.peer.fairshare import FairShare, Waiting, decay
from elsewhere.peer.keys import write_key

# ---------------------------------------------------------------- the rule, pure


def test_decay_halves_per_half_life() -> None:
    assert decay(8.0, 10.0, 10.0) == pytest.approx(4.0)
    assert decay(8.0, 30.0, 10.0) == pytest.approx(1.0)
    assert decay(8.0, 0.0, 10.0) == 8.0 and decay(0.0, 5.0, 10.0) == 0.0
    assert decay(8.0, 5.0, math.inf) == 8.0


def test_the_controller_with_less_measured_use_goes_first() -> None:
    fs = FairShare(half_life_s=60)
    fs.started("long", "r1", now=0.0)
    fs.finished("r1", now=10.0)  # 10 s of use
    fs.started("short", "r2", now=10.0)
    fs.finished("r2", now=10.5)  # 0.5 s
    waiting = [Waiting("long", arrival=11.0), Waiting("short", arrival=12.0)]
    assert waiting[fs.pick(waiting, now=13.0)].controller == "short"  # though it came later
    assert fs.use("long", 13.0) > fs.use("short", 13.0)


def test_running_tasks_count_as_use() -> None:
    fs = FairShare()
    fs.started("a", "r1", now=0.0)
    assert fs.use("a", 5.0) == pytest.approx(5.0)
    waiting = [Waiting("a", 1.0), Waiting("b", 2.0)]
    assert waiting[fs.pick(waiting, 5.0)].controller == "b"


def test_use_is_forgotten_over_time() -> None:
    fs = FairShare(half_life_s=10)
    fs.started("old", "r", now=0.0)
    fs.finished("r", now=100.0)  # 100 s of use, long ago
    fs.started("new", "s", now=190.0)
    fs.finished("s", now=195.0)  # 5 s, recently
    assert fs.use("old", 200.0) == pytest.approx(100 * 0.5**10)
    waiting = [Waiting("new", 1.0), Waiting("old", 2.0)]
    assert waiting[fs.pick(waiting, 200.0)].controller == "old"
    fs.prune(10_000.0)
    assert fs.snapshot(10_000.0) == {}


def test_ties_go_to_the_least_recent_use_then_the_oldest_request() -> None:
    fs = FairShare()
    fs.started("a", "x", now=0.0)
    fs.finished("x", now=0.0)  # no time used, but used at 0
    waiting = [Waiting("a", 1.0), Waiting("b", 2.0)]
    assert waiting[fs.pick(waiting, 1.0)].controller == "b"  # never used: least recent
    assert fs.pick([Waiting("c", 3.0), Waiting("d", 2.0)], 5.0) == 1


def test_first_come_first_served_when_switched_off() -> None:
    fs = FairShare(enabled=False)
    fs.started("heavy", "r", now=0.0)
    fs.finished("r", now=100.0)
    waiting = [Waiting("light", 5.0), Waiting("heavy", 4.0)]
    assert waiting[fs.pick(waiting, 101.0)].controller == "heavy"
    assert fs.pick([], 1.0) == -1


# ---------------------------------------------------------------- two controllers, two workers


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _short_job_time(tmp: Path, key: Path, fcfs: bool) -> float:
    """Seconds for 8 tasks of 0.1 s to finish while another controller floods 1 s tasks."""
    port = free_port()
    args = ["--fcfs"] if fcfs else []
    with Workers(tmp, 2, port=port, key=key, args=args):
        def on() -> ew.Cluster:
            return peers("lab", key=key, port=port, interface="127.0.0.1")

        long_job = ew.submit(nap, [1.0] * 12, on=on())
        wait_until(lambda: long_job.check().running == 2, 15, "the long tasks to take both workers")
        t0 = time.monotonic()
        short_job = ew.submit(nap, [0.1] * 8, on=on())
        short_job.wait(timeout=40)
        elapsed = time.monotonic() - t0
        assert short_job.results() == [0.1] * 8
        long_job.cancel()
        long_job.purge()
        short_job.purge()
    return elapsed


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_short_tasks_are_not_starved_by_long_ones(ew_home: Path, tmp_path: Path) -> None:
    key = write_key("lab", tmp_path / "lab.key")
    fair = _short_job_time(tmp_path, key, fcfs=False)
    fcfs = _short_job_time(tmp_path, key, fcfs=True)
    # fair share: the short tasks take each slot as it frees (about 1 s + 8 * 0.1 / 2);
    # first come first served: one short task per long one on each worker (about 4 * 1.1 s)
    print(f"short job: fair share {fair:.2f} s, first come first served {fcfs:.2f} s")
    assert fair < 2.5, (fair, fcfs)
    assert fcfs > 2 * fair, (fair, fcfs)
