"""The tasks of the conformance suite: small, and light to import.

Workers import this module to run them (where they see the caller's files; elsewhere the
functions travel by value), so it imports nothing but the standard library. Tasks that
are ended from outside write their process id first; tasks that run twice leave a line
per start and a marker file, so a test can tell what ran how often.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def square_late(x: int) -> int:
    time.sleep(0.05 * (5 - x))  # the later tasks end first: results must still come in order
    return x * x


def raise_on_two(x: int) -> int:
    if x == 2:
        raise ValueError(f"bad input {x}")
    return x


def nap(seconds: float, folder: str, index: int) -> int:
    """Sleep, after writing this process's pid to ``folder/pid-<index>``."""
    Path(folder, f"pid-{index}.tmp").write_text(str(os.getpid()))
    os.replace(Path(folder, f"pid-{index}.tmp"), Path(folder, f"pid-{index}"))
    time.sleep(seconds)
    return index


def hold(folder: str, index: int) -> int:
    """Run until the test creates ``folder/release`` (30 s at most), after writing this
    process's pid to ``folder/pid-<index>``."""
    Path(folder, f"pid-{index}.tmp").write_text(str(os.getpid()))
    os.replace(Path(folder, f"pid-{index}.tmp"), Path(folder, f"pid-{index}"))
    deadline = time.monotonic() + 30
    while not Path(folder, "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return index


def long_unless_marked(index: int, folder: str) -> int:
    """Task 1 runs long on its first attempt only (a marker file tells the second); each
    start is a line of ``folder/starts-<index>``."""
    with open(Path(folder, f"starts-{index}"), "a") as f:
        f.write(f"{os.getpid()}\n")
    marker = Path(folder, f"marker-{index}")
    if index == 1 and not marker.exists():
        marker.touch()
        nap(60, folder, index)
    return index


def fail_first_time(index: int, folder: str) -> int:
    """Task 1 raises on its first attempt only; each start is a line of ``folder/starts-<index>``."""
    with open(Path(folder, f"starts-{index}"), "a") as f:
        f.write(f"{os.getpid()}\n")
    marker = Path(folder, f"marker-{index}")
    if index == 1 and not marker.exists():
        marker.touch()
        raise RuntimeError("the first attempt fails")
    return index * 10


def chatty(index: int) -> int:
    print(f"conformance stdout of task {index}", flush=True)
    print(f"conformance stderr of task {index}", file=sys.stderr, flush=True)
    return index


def pid_of(folder: Path, index: int) -> int:
    """The process id task ``index`` wrote into ``folder`` (0 before it started)."""
    path = folder / f"pid-{index}"
    return int(path.read_text()) if path.exists() else 0


def starts_of(folder: Path, index: int) -> int:
    """How many times task ``index`` started (its lines in ``folder/starts-<index>``)."""
    path = folder / f"starts-{index}"
    return len(path.read_text().splitlines()) if path.exists() else 0


class KillsWhenPickled:
    """A value whose pickling kills the process that pickles it (as a value too large for
    its worker's memory would, or a crash in a library's reduce)."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        os._exit(9)


def result_kills_its_worker(index: int, bad: int) -> object:
    """Task ``bad``'s value kills its worker when it is pickled; the others' are their index."""
    return KillsWhenPickled() if index == bad else index


def crash_on(index: int, bad: int) -> int:
    """Task ``bad`` kills its process (SIGKILL, as the kernel's OOM killer does; a segfault
    would leave a core file), the others return their index."""
    if index == bad:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return index
