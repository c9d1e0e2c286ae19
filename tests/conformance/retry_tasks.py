"""The tasks of the retry and dependency tests: small, and light to import (the standard
library only, as ``tasks.py``). Each start of a task is a line of ``folder/starts-<index>``,
so a test can tell what ran how often, and in which order."""

from __future__ import annotations

import builtins
import os
import time
from pathlib import Path


def _start(folder: str, index: int) -> int:
    """Note a start of task ``index``; how many starts it had before this one."""
    path = Path(folder, f"starts-{index}")
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {time.time():.6f}\n")
    return len(path.read_text().splitlines()) - 1


def fail_twice(index: int, folder: str, kind: str = "ConnectionResetError") -> int:
    """Task 1 raises ``kind`` (a builtin exception's name) on its first two runs; the others,
    and task 1's third run, return ``index * 10``."""
    before = _start(folder, index)
    if index == 1 and before < 2:
        raise getattr(builtins, kind)(f"run {before + 1} of task 1 fails")
    return index * 10


def stamp(index: int, folder: str, seconds: float = 0.0, release: str = "") -> float:
    """Sleep ``seconds`` (with ``release``: first wait until that file exists, 120 s at most),
    then return when the task ended (a unix time)."""
    _start(folder, index)
    deadline = time.monotonic() + 120
    while release and not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(seconds)
    return time.time()


def fail_on(index: int, folder: str, bad: int) -> int:
    """Task ``bad`` raises a ValueError; the others return their index."""
    _start(folder, index)
    if index == bad:
        raise ValueError(f"task {index} fails")
    return index


def start_times(folder: Path, index: int) -> list[float]:
    """When task ``index`` started, each time (unix times)."""
    path = folder / f"starts-{index}"
    return (
        [float(line.split()[1]) for line in path.read_text().splitlines()] if path.exists() else []
    )


def starts(folder: Path, index: int) -> int:
    """How many times task ``index`` started."""
    path = folder / f"starts-{index}"
    return len(path.read_text().splitlines()) if path.exists() else 0
