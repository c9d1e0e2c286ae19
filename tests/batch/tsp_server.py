"""A private Task Spooler server for a test: the queue behind examples/tsp_scheduler.py.

``start(tmp_path, monkeypatch)`` starts ``tsp -S SLOTS`` on a socket under ``tmp_path``
(``TS_SOCKET`` and ``TMPDIR`` set for the test and the processes it starts) and returns a
:class:`TspServer`; ``server(*args)`` runs a tsp command on it; ``server.stop()`` shuts it
down with ``tsp -K`` and kills it by its pid if it is still there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

TSP = shutil.which("tsp")
WHY_NO_TSP = (
    "the task spooler (tsp) is not installed: apt-get install task-spooler (ci/services/tsp.sh)"
)


def _server_pid(sock: str, started_by: list[str]) -> int | None:
    """The tsp server listening on ``sock``: by its socket, else by the command that started
    it (the server is that command, forked into the background)."""
    try:
        for conn in psutil.net_connections(kind="unix"):
            if conn.laddr == sock and conn.pid:
                return conn.pid
    except psutil.AccessDenied:
        pass
    for p in psutil.process_iter(["cmdline", "environ"]):
        if p.info["cmdline"] == started_by and (p.info["environ"] or {}).get("TS_SOCKET") == sock:
            return p.pid
    return None


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class TspServer:
    def __init__(self, socket: str, pid: int) -> None:
        self.socket, self.pid = socket, pid

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert TSP is not None
        return subprocess.run([TSP, *args], capture_output=True, text=True, timeout=10)

    def stop(self) -> None:
        self("-K")
        deadline = time.monotonic() + 5
        while not gone(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not gone(self.pid):
            os.kill(self.pid, signal.SIGKILL)


def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slots: int = 4) -> TspServer:
    if TSP is None:
        pytest.skip(WHY_NO_TSP)
    sock = str(tmp_path / "ts.sock")
    assert len(sock) < 100, f"socket path too long for a unix socket: {sock}"
    monkeypatch.setenv("TS_SOCKET", sock)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # tsp's output files, not in /tmp
    command = [TSP, "-S", str(slots)]
    subprocess.run(command, check=True, timeout=10)
    pid = _server_pid(sock, command)
    assert pid is not None, "the tsp server did not start"
    return TspServer(sock, pid)
