"""Finding the local workers a test started, however they were started.

A spawned worker's command line names ``elsewhere.worker`` and its pool (under the test's
``ELSEWHERE_HOME``); a worker started as a fork of its client (``hosts/forkstart.py``) keeps
its client's command line, is named ``ew-worker`` and holds its pool's FIFO open under the
home. Used by the fixtures that stop what a test left running.
"""

from __future__ import annotations

import os


def is_forked_worker_of(pid: int, home: str | os.PathLike[str]) -> bool:
    """Whether ``pid`` is a worker started as a fork that holds a file under ``home``."""
    folder = os.fspath(home).rstrip(os.sep) + os.sep
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            if f.read().strip() != b"ew-worker":
                return False
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folder):
                return True
        except OSError:
            continue
    return False


def worker_pids(home: str | os.PathLike[str], *, also: tuple[bytes, ...] = ()) -> list[int]:
    """The pids of the workers started for ``home`` (with ``also``: processes whose command
    line names the home and one of these words too, e.g. a wrapper's name)."""
    needle = os.fsencode(os.fspath(home))
    words = (b"elsewhere.worker", *also)
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if (needle in cmd and any(w in cmd for w in words)) or is_forked_worker_of(int(d), home):
            out.append(int(d))
    return out
