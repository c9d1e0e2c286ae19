"""Helpers of the live peer tests: worker daemons as real processes, free ports.

Imported by name (conftest puts this folder on sys.path). Every wait has a
timeout; every process is stopped by its own pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[2] / "src")


def free_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1 a moment ago."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = int(u.getsockname()[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            try:
                t.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this source tree first on the path."""
    e = dict(os.environ)
    e["PYTHONPATH"] = SRC + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(extra or {})
    return e


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.02) -> Any:
    """Poll ``predicate`` until it is true; fail the test with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class WorkerProc:
    """One ``elsewhere peer worker`` process."""

    def __init__(self, args: Sequence[str], stats: Path, netns: str | None = None,
                 python: str = sys.executable, extra_env: dict[str, str] | None = None,
                 launcher: Sequence[str] | None = None) -> None:  # fmt: skip
        self.stats_path = stats
        start = list(launcher) if launcher else [python, "-m", "elsewhere.api.peer_cli", "peer", "worker"]
        cmd = [*start, "--stats-file", str(stats), "--log-level", "info", *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.log_path = stats.with_suffix(".log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     env=env(extra_env), start_new_session=True)  # fmt: skip
        self.pid = self.proc.pid

    def stats(self) -> dict[str, Any]:
        """The counters the daemon last wrote ({} before the first write)."""
        try:
            return dict(json.loads(self.stats_path.read_text()))
        except (OSError, ValueError):
            return {}

    def wait_started(self, timeout: float = 15.0) -> dict[str, Any]:
        return dict(wait_until(lambda: self.stats() or self._dead(), timeout, f"worker {self.pid} to start"))

    def _dead(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log()}")
        return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def children(self) -> list[int]:
        return [int(p) for p in self.stats().get("children", [])]

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def live_children(self) -> list[int]:
        """Pids of the daemon's task children now."""
        import psutil

        try:
            return [c.pid for c in psutil.Process(self.pid).children()]
        except psutil.Error:
            return []

    def kill(self) -> None:
        """SIGKILL the daemon and its task children (each by pid), as if the machine died."""
        kids = self.live_children()
        self.signal(signal.SIGKILL)
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (drain), then SIGKILL after ``timeout``; returns the exit status."""
        if self.proc.poll() is None:
            kids = self.live_children()
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
            for pid in kids:  # children the daemon did not get to stop
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._log.close()
        return self.proc.returncode


class Workers:
    """Several worker daemons on loopback that share a discovery port (a context manager)."""

    def __init__(self, tmp: Path, n: int, *, port: int, key: Path | None, slots: int = 1,
                 args: Sequence[str] = (), per_worker: Sequence[Sequence[str]] = ()) -> None:  # fmt: skip
        self.port = port
        self.procs: list[WorkerProc] = []
        base = ["--port", str(port), "--slots", str(slots), "--interface", "127.0.0.1"]
        if key is not None:
            base += ["--key", str(key)]
        for i in range(n):
            extra = list(per_worker[i]) if i < len(per_worker) else []
            self.procs.append(WorkerProc([*base, *args, *extra], tmp / f"worker{i}-{port}.json"))

    def __enter__(self) -> Workers:
        try:
            for p in self.procs:
                p.wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for p in self.procs:
            if p.proc.poll() is None:
                p.signal(signal.SIGTERM)
        for p in self.procs:
            p.stop()

    def __getitem__(self, i: int) -> WorkerProc:
        return self.procs[i]

    def __iter__(self) -> Iterator[WorkerProc]:
        return iter(self.procs)

    def __len__(self) -> int:
        return len(self.procs)
