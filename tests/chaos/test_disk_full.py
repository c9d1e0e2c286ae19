"""Chaos: a full disk. The elsewhere home is a small tmpfs (mounted here, as root; skipped
otherwise) that a job's results overflow: the wait ends with the reason ("no space left on
..."), no task is silently lost, and once there is room again ``job.retry()`` runs what did not
finish. Submitting into a full disk fails with a clear error and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import elsewhere as ew
from chaos.conftest import Tally, scaled
from elsewhere.folder import housekeeping

pytestmark = pytest.mark.timeout(300)

MB = 1 << 20


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_home(ew_home, worker_pids):
    """The home on a 30 MB tmpfs; its workers stopped and the tmpfs unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    ew_home.mkdir(parents=True)
    got = _mount("-t", "tmpfs", "-o", "size=30m,mode=0700", "tmpfs", str(ew_home))
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield ew_home
    finally:
        from elsewhere.backends.local import LocalCluster

        deadline = time.monotonic() + 5
        while worker_pids(ew_home) and time.monotonic() < deadline:
            LocalCluster().shutdown()
            time.sleep(0.05)
        for pid in worker_pids(ew_home):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        housekeeping.finish()
        # lazily: this process may still hold the registry's database open
        subprocess.run(["umount", "-l", str(ew_home)], capture_output=True, timeout=30)


def _big(i):
    return bytes([i % 256]) * (2 * MB + i)


def _is_big(i, v) -> bool:
    return isinstance(v, bytes) and len(v) == 2 * MB + i and v[:1] == bytes([i % 256])


def test_results_overflow_the_disk(small_home, tally: Tally):
    """50 MB of results on a 30 MB disk: the job ends failed, each task with its value or
    "no space left on ..." (none queued or running for ever); with room again, a retry gets
    every value."""
    for trial in range(scaled(1)):
        n = 25
        job = ew.submit(_big, range(n), on=ew.local(cores=2), name=f"overflow{trial}")
        status = None
        try:
            job.wait(timeout=60)
            status = job.check()
        except ew.TimeoutError as exc:
            tally.hang(str(exc))
        except ew.JobError as exc:  # the disk too full to write off even the workers it lost
            if "no space left on" not in str(exc):
                raise
            print(f"the wait ended with: {exc}")
        tally.trial(n)
        if status:  # the usual case: every task written off or done
            full = 0
            for i, v in enumerate(job.results()):
                if (
                    isinstance(v, ew.TaskError)
                    and v.reason == "lost"
                    and "no space left on" in v.message
                ):
                    full += 1
                elif not _is_big(i, v):
                    tally.lose(1, f"task {i}: {v!r:.200}")
            if not full:
                tally.lose(n, f"the disk did not fill up, or nothing says so: {status}")
        assert _mount("-o", "remount,size=200m", str(small_home)).returncode == 0
        job.retry()
        try:
            job.wait(timeout=60)
        except ew.TimeoutError as exc:
            tally.hang(f"after the retry: {exc}")
        got = job.results(partial=True)
        bad = [i for i, v in enumerate(got) if not _is_big(i, v)]
        tally.lose(
            len(bad), f"after the retry, tasks {bad[:10]}: {[got[i] for i in bad[:2]]!r:.200}"
        )
        job.purge()
        housekeeping.finish()  # the purged folder removed now: the disk can shrink back
        deadline = time.monotonic() + 10  # (once the workers have closed its files)
        while _mount("-o", "remount,size=30m", str(small_home)).returncode != 0:
            assert time.monotonic() < deadline, "the tmpfs does not shrink back to 30 MB"
            time.sleep(0.1)


def test_submit_into_a_full_disk(small_home, tally: Tally):
    """``ew.submit`` and ``ew.map`` into a full disk raise a JobError that says so, and leave no
    job folder and no registry entry."""
    assert ew.map(abs, [-1, -2], on=ew.local(cores=1)) == [1, 2]  # the home, its registry, a pool
    jobs = small_home / "jobs"
    before = {p.name for p in jobs.iterdir()}
    filler = small_home / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * MB)
        except OSError:
            pass
    try:
        for trial in range(scaled(2)):
            for how in ("submit", "map"):
                name = f"full-{how}{trial}"
                tally.trial()
                try:
                    call = ew.submit if how == "submit" else ew.map
                    call(
                        abs,
                        [-(i + 1) for i in range(200)] + [b"x" * 100_000],
                        on=ew.local(cores=1),
                        name=name,
                    )
                except ew.JobError as exc:
                    if "no space left on" not in str(exc):
                        tally.lose(1, f"{how}: an unclear error: {exc}")
                else:
                    tally.lose(1, f"{how} into a full disk did not fail")
                housekeeping.finish()
                left = {p.name for p in jobs.iterdir() if not p.name.startswith(".")} - before
                if left:
                    tally.lose(1, f"{how} left job folders behind: {sorted(left)}")
                if any(r["name"] == name for r in ew.jobs(refresh=False)):
                    tally.lose(1, f"{how} left {name} in the registry")
    finally:
        filler.unlink()
    assert ew.map(abs, [-3], on=ew.local(cores=1)) == [3]  # with room again, all is well
