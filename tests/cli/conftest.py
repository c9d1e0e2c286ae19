"""The shell as a user meets it: the real ``elsewhere`` script (the venv's console script, or
``python -m elsewhere`` where there is none) in a process of its own, on real jobs of local
workers made once per module in a home of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("elsewhere")
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "elsewhere"]


def strict_json(text: str):
    """``json.loads`` that refuses NaN and the infinities, as strict parsers do."""

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


class Shell:
    """``shell(*args)``: ``elsewhere ARGS`` with this home and config; a CompletedProcess."""

    def __init__(self, home: Path, config: Path) -> None:
        self.home, self.config = home, config
        self.env = {**os.environ, "ELSEWHERE_HOME": str(home), "ELSEWHERE_CONFIG": str(config)}
        self.env.pop("NO_COLOR", None)
        self.env.pop("FORCE_COLOR", None)
        self.env.pop("COLUMNS", None)

    def __call__(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        p = subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout,
                           env={**self.env, **env})  # fmt: skip
        assert "Traceback (most recent call last)" not in p.stderr, p.stderr
        return p

    def python(self, code: str, *, python: str = sys.executable, timeout: float = 90) -> str:
        """Run ``code`` in a Python of its own with this home; its stdout."""
        p = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=timeout, env=self.env)  # fmt: skip
        assert p.returncode == 0, p.stderr
        return p.stdout


def one_line(p: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """``p`` ended with ``code`` and said why in one line on stderr, with ``words``."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("elsewhere"), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def worker_pids(home: Path) -> list[int]:
    """Worker processes started for ``home`` (see tests/workerprocs.py)."""
    from workerprocs import worker_pids as pids

    return pids(home)


def stop_workers(home: Path) -> None:
    """Stop what a test started under ``home``: idle workers are asked, the rest killed."""
    subprocess.run([*COMMAND, "workers", "stop"], capture_output=True, timeout=60,
                   env={**os.environ, "ELSEWHERE_HOME": str(home)})  # fmt: skip
    deadline = time.monotonic() + 5
    while worker_pids(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in worker_pids(home):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def shell(tmp_path):
    """A Shell on a home of this test's own; its workers stopped afterwards."""
    sh = Shell(tmp_path / "home", tmp_path / "config")
    yield sh
    stop_workers(sh.home)


MAKE_JOBS = """
import time
import elsewhere as ew

def fit(x):
    print(f"fitting {x}")
    if x == 1:
        raise ValueError(f"bad input {x}")
    return {"x": x}

ew.submit(fit, [0, 1, 2], name="fits", on=ew.local(cores=2)).wait(timeout=60)
ew.submit(time.sleep, [600], name="slow", on=ew.local(cores=1))
"""


@pytest.fixture(scope="session")
def jobs(tmp_path_factory):
    """A Shell whose home holds job 'fits' (3 tasks, task 1 raised ValueError) and job 'slow'
    (one task that sleeps: running while the tests run); made once, only read by the tests."""
    root = tmp_path_factory.mktemp("cli")
    sh = Shell(root / "home", root / "config")
    sh.python(MAKE_JOBS)
    yield sh
    sh("cancel", "slow")
    stop_workers(sh.home)
