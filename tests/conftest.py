"""Shared fixtures: every test gets its own elsewhere home (storage, registry, pool)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

# A test process that ends leaves its unfinished peer jobs as they are, rather than handing
# them to background controllers that would outlive the test run (tests of the hand-off
# set it to "1" in the process they start).
os.environ.setdefault("ELSEWHERE_PEER_HAND_OFF", "0")


def _pids_with_home(home: Path) -> list[int]:
    """Worker processes started for this home (see tests/workerprocs.py)."""
    from workerprocs import worker_pids

    return worker_pids(home)


def _background_controllers(home: Path) -> list[int]:
    """Peer jobs' background controllers (``detach=True``) started for this home."""
    pids = []
    want = (b"ELSEWHERE_PEER_BACKGROUND_CONTROLLER=1", b"ELSEWHERE_HOME=" + str(home).encode())
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if all(w in env for w in want):
                pids.append(int(d))
    return pids


@pytest.fixture
def ew_home(tmp_path, monkeypatch):
    """A private ELSEWHERE_HOME; stops the workers started under it afterwards."""
    home = tmp_path / "home"
    monkeypatch.setenv("ELSEWHERE_HOME", str(home))
    yield home
    from elsewhere.backends.local import LocalCluster

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _pids_with_home(home):
        try:
            LocalCluster().shutdown()  # idle workers exit; busy ones become idle soon
        except Exception:
            pass
        time.sleep(0.05)
    for pid in _pids_with_home(home) + _background_controllers(home):  # only this test's own home's
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def worker_pids():
    """A function returning the pids of live workers of a home."""
    return _pids_with_home


def pytest_sessionfinish(session, exitstatus):
    """Executors a failed test left open are stopped, so that the interpreter's exit (which
    waits for pending calls, as the standard's executors do) does not wait on them."""
    import sys

    executor = sys.modules.get("elsewhere.api.executor")
    if executor is None:
        return
    for stream in list(executor._live):
        try:
            stream.close(kill=True)
        except Exception:
            pass


# Run in parallel (pytest-xdist, ``-n N --dist loadgroup``, as scripts/test does): the tests of
# one file stay together on one process (its module fixtures are made once), and the files that
# use the network-namespace hosts share one group, since some of them cut a host's link.
_SHARED_GROUPS = {
    "netns": ("tests/peer/test_netns.py", "tests/peer/test_netns_job.py", "tests/ssh/test_multihost.py",
              "tests/mpi/test_mpi.py"),
    # these clean up with `scancel --name ewtest` (and qdel): never beside each other
    "real-schedulers": ("tests/schedulers/test_real_slurm.py", "tests/schedulers/test_real_slurm_torque.py",
                        "tests/schedulers/test_real_sge.py"),
}  # fmt: skip
_GROUP_OF_FILE = {f: group for group, files in _SHARED_GROUPS.items() for f in files}

# The tests that reach the real SLURM, Grid Engine and PBS (one 8-CPU node between them, with
# tests that wait for an array's elements to run) take their turn one at a time, as in a run
# of one process: side by side they waited on each other's elements past their timeouts.
_REAL_SCHEDULER = re.compile(r"slurm|sge|pbs|torque", re.IGNORECASE)


def test_group(nodeid: str) -> str:
    """The group a test runs in: one process runs a whole group, one test after another."""
    nodeid = nodeid.split("@", 1)[0]  # an xdist_group suffix, where xdist adds one
    path = nodeid.split("::", 1)[0]
    group = _GROUP_OF_FILE.get(path)
    if group is None and _REAL_SCHEDULER.search(nodeid):
        group = "real-schedulers"
    return group or path


test_group.__test__ = False  # not a test, despite its name


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # xdist may be absent
def pytest_xdist_make_scheduler(config, log):
    """Our groups, read from each test's node id by the controller.

    xdist's own ``loadgroup`` reads ``xdist_group`` marks that its workers write into the node
    ids, which pytest 9.2 no longer lets a plugin change: with it, every test went to any
    process, and the real-scheduler tests ran side by side after all.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return test_group(nodeid)

    return GroupScheduling(config, log)
