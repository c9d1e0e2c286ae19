"""``elsewhere workers stop`` stops the idle warm workers whatever name of the interpreter
started them: a script run with ``.venv/bin/python3`` leaves workers in the pool of that
name, and the ``elsewhere`` script runs ``.venv/bin/python3.11``, or ``.venv/bin/python``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from cli.conftest import COMMAND, SCRIPT, worker_pids

pytestmark = pytest.mark.timeout(120)


def _interpreter_of_the_command() -> str:
    if COMMAND[0] == str(SCRIPT):
        first = SCRIPT.read_text().splitlines()[0]
        return first[2:].strip() if first.startswith("#!") else sys.executable
    return sys.executable


def _other_name() -> str | None:
    """Another name, in the same folder, of the interpreter the command runs."""
    used = Path(_interpreter_of_the_command())
    for sibling in sorted(used.parent.glob("python*")):
        if sibling.name != used.name and os.path.realpath(sibling) == os.path.realpath(used):
            return str(sibling)
    return None


def _idle(home: Path) -> list[Path]:
    return [m for pool in (home / "local").glob("*") for m in (pool / "idle").glob("*")]


def test_workers_stop_finds_workers_started_by_another_name_of_the_interpreter(shell):
    other = _other_name()
    if other is None:
        pytest.skip("the interpreter has one name only here")
    shell.python("""
        import elsewhere as ew
        assert ew.map(abs, [-1, -2], on=ew.local(cores=2, idle_timeout_s=300)) == [1, 2]
    """, python=other)  # fmt: skip
    deadline = time.monotonic() + 30
    while len(_idle(shell.home)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = worker_pids(shell.home)
    assert len(_idle(shell.home)) == 2 and pids, (_idle(shell.home), pids)

    stopped = shell("workers", "stop")
    assert (
        stopped.returncode == 0 and stopped.stdout.strip() == "asked 2 idle local worker(s) to exit"
    )
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not worker_pids(shell.home), "the workers did not exit"
    assert shell("workers", "stop").stdout.strip() == "asked 0 idle local worker(s) to exit"
