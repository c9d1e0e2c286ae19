"""Fixtures for the fake scheduler commands: a private queue, the fake bin on PATH, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parent
SRC = FAKES.parents[1] / "src"
try:
    import elsewhere.schedulers  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(SRC))
if str(FAKES) not in sys.path:  # scheduler_contract.py, shared with tests/schedulers
    sys.path.insert(0, str(FAKES))


class Fake:
    """One fake scheduler with its own queue folder; runs its commands."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.folder = folder
        self.state = folder / "state"
        self.work = folder / "work"
        self.work.mkdir()
        (self.work / "logs").mkdir()

    def run(
        self, argv: list[str], *, check: bool = False, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (a fake's, or a script that calls one) in the work folder."""
        result = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.work,
            env=os.environ.copy(),
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{argv} exited {result.returncode}: {result.stderr}")
        return result

    def queue(self) -> dict:
        """The fake's JSON queue, as stored."""
        path = self.state / f"{self.name}.json"
        return json.loads(path.read_text()) if path.exists() else {"jobs": {}}

    def running_pids(self) -> list[int]:
        """Runner pids of elements the queue says are running."""
        return [
            el["pid"]
            for job in self.queue()["jobs"].values()
            for el in job["elements"].values()
            if el["state"] == "running" and el["pid"]
        ]

    def kill_all(self) -> None:
        """Stop every element still running, runner and command (test teardown)."""
        groups = [
            pid
            for job in self.queue()["jobs"].values()
            for el in job["elements"].values()
            if el["state"] == "running"
            for pid in (el["pid"], el.get("child_pid"))
            if pid
        ]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in groups:
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.2)


def make_fake(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    fake = Fake(name, tmp_path)
    monkeypatch.setenv("ELSEWHERE_FAKE_STATE", str(fake.state))
    # finished elements stay in the queue view 8 s: long enough for a test on a loaded machine
    # to read them there (2 s was not), short enough for the tests that wait for them to leave
    monkeypatch.setenv("ELSEWHERE_FAKE_KEEP_S", "8")
    monkeypatch.setenv("ELSEWHERE_FAKE_KILL_WAIT_S", "0.5")
    monkeypatch.setenv("PATH", f"{FAKES / name / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return fake


@pytest.fixture
def lsf(tmp_path, monkeypatch):
    """The fake LSF, with its own queue."""
    fake = make_fake("lsf", tmp_path, monkeypatch)
    yield fake
    fake.kill_all()


@pytest.fixture
def htcondor(tmp_path, monkeypatch):
    """The fake HTCondor, with its own queue."""
    fake = make_fake("htcondor", tmp_path, monkeypatch)
    yield fake
    fake.kill_all()


@pytest.fixture
def flux(tmp_path, monkeypatch):
    """The fake Flux, with its own queue."""
    fake = make_fake("flux", tmp_path, monkeypatch)
    yield fake
    fake.kill_all()
