"""Local workers started as forks of a small client of one thread (hosts/forkstart.py): they
leave everything of the client behind, and any other client gets spawned workers as before.

Each client is a script in a fresh interpreter (a pytest process runs threads of its own); its
tasks look at the worker process they run in and return what they see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

CLIENT = textwrap.dedent(
    """
    import atexit, json, os, signal, sys, threading, time

    mode, mark = sys.argv[1], sys.argv[2]
    r, w = os.pipe()  # held by the client while its job runs: a worker must not hold it
    signal.signal(signal.SIGTERM, lambda *a: None)  # the client's handler: not the worker's
    atexit.register(lambda: open(mark, "a").write(f"exit {os.getpid()}\\n"))
    if mode == "thread":
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    if mode == "random":
        import random
    import elsewhere as ew

    def look(i):
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
        caught = int(status["SigCgt"].strip(), 16)
        return {"i": i, "pid": os.getpid(), "sid": os.getsid(0),
                "comm": open("/proc/self/comm").read().strip(),
                "cmdline": open("/proc/self/cmdline", "rb").read().decode(errors="replace"),
                "fds": fds, "sigterm_caught": bool(caught & (1 << (signal.SIGTERM - 1))),
                "argv": sys.argv, "cwd": os.getcwd()}

    out = ew.map(look, range(4), on=ew.local(cores=2))
    print(json.dumps({"client": os.getpid(), "sid": os.getsid(0), "pipe": os.readlink(f"/proc/self/fd/{w}"),
                      "tasks": out}))
    """
)


def _run(tmp_path: Path, mode: str, **env: str) -> tuple[dict, Path]:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    mark = tmp_path / "mark"
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(mark)],
        env={**os.environ, "ELSEWHERE_HOME": str(home), **env},
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), mark


def _stop(home: Path, pids: set[int]) -> None:
    from elsewhere.backends.local import LocalCluster

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        old = os.environ.get("ELSEWHERE_HOME")
        os.environ["ELSEWHERE_HOME"] = str(home)
        try:
            LocalCluster().shutdown()  # idle workers exit
        finally:
            if old is None:
                del os.environ["ELSEWHERE_HOME"]
            else:
                os.environ["ELSEWHERE_HOME"] = old
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "the workers did not exit when asked"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_small_client_of_one_thread_forks_its_workers_and_they_keep_nothing_of_it(tmp_path) -> None:
    got, mark = _run(tmp_path, "plain")
    tasks = got["tasks"]
    assert [t["i"] for t in tasks] == [0, 1, 2, 3]
    workers = {t["pid"] for t in tasks}
    try:
        for t in tasks:
            assert t["comm"] == "ew-worker", t["comm"]  # a fork (a spawned one runs python)
            assert "elsewhere.worker" not in t["cmdline"]  # (its command line is the client's)
            assert t["pid"] != got["client"]
            assert t["sid"] == t["pid"] != got["sid"]  # a session of its own: detached
            assert t["fds"]["0"] == "/dev/null"
            assert got["pipe"] not in t["fds"].values(), t["fds"]  # no descriptor of the client's
            assert not t["sigterm_caught"]  # the client's handler is undone
            assert t["argv"][0] == "-c" and "--pool" in t["argv"]  # as a spawned worker's
    finally:
        _stop(tmp_path / "home", workers)
    # the client's atexit ran once, in the client: never in a worker, even as it exits
    assert mark.read_text().splitlines() == [f"exit {got['client']}"]


@pytest.mark.parametrize("mode, env", [("thread", {}), ("random", {}), ("plain", {"ELSEWHERE_WORKER_START": "spawn"})],
                         ids=["client-with-a-thread", "client-with-random", "turned-off"])  # fmt: skip
def test_other_clients_spawn_their_workers(tmp_path, mode: str, env: dict) -> None:
    got, _ = _run(tmp_path, mode, **env)
    tasks = got["tasks"]
    try:
        assert [t["i"] for t in tasks] == [0, 1, 2, 3]
        for t in tasks:
            assert t["comm"] != "ew-worker"
            assert "elsewhere.worker" in t["cmdline"]
            assert got["pipe"] not in t["fds"].values()
    finally:
        _stop(tmp_path / "home", {t["pid"] for t in tasks})


def test_can_fork_says_no_to_another_interpreter_and_a_wrapper() -> None:
    from elsewhere.hosts.forkstart import can_fork
    from elsewhere.util.command import PythonCommand

    assert not can_fork(PythonCommand(("/usr/bin/env", sys.executable)))
    assert not can_fork(PythonCommand((sys.executable,), setup=("true",)))
    assert not can_fork("/nonexistent/python3")
    # this pytest process runs threads of its own (xdist's, the test's timeout)
    import threading

    if threading.active_count() > 1 or len(os.listdir("/proc/self/task")) > 1:
        assert not can_fork(sys.executable)
