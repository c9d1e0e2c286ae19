"""Detached Python processes started here: their session, input, log, environment and folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elsewhere.hosts.spawn import package_root, spawn_python, spawn_python_pid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# prints what the started process sees of itself, as one JSON line, and one line on stderr
REPORT = """
import json, os, sys
print(json.dumps({
    "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
    "stdin": os.readlink("/proc/self/fd/0"), "cwd": os.getcwd(),
    "pythonpath": os.environ.get("PYTHONPATH", ""), "extra": os.environ.get("EW_EXTRA"),
    "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    "executable": sys.executable,
}), flush=True)
print("to stderr", file=sys.stderr)
"""


def _report(log: Path, timeout_s: float = 20.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if "to stderr" in text:
            return json.loads(next(x for x in text.splitlines() if x.startswith("{")))
        time.sleep(0.02)
    raise AssertionError(f"the started process wrote nothing to {log}: {text!r}")


def _inheritable() -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.get_inheritable(int(name)):
                out.add(int(name))
        except OSError:
            pass
    return out


@pytest.fixture(autouse=True)
def _linux_only() -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("reads /proc to see what the started process got")


def test_a_started_python_leads_its_own_session_with_no_input(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "start.log"
    log.parent.mkdir()
    log.write_text("before\n")
    proc = spawn_python(["-c", REPORT], log=log, cwd=tmp_path, env={**os.environ, "EW_EXTRA": "x"})
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=30) == 0
    seen = _report(log)
    assert seen["pid"] == proc.pid == seen["sid"] == seen["pgid"]  # setsid: a session of its own
    assert seen["sid"] != os.getsid(0)
    assert seen["stdin"] == "/dev/null"
    assert seen["cwd"] == str(tmp_path)
    assert seen["extra"] == "x"
    assert str(seen["pythonpath"]).split(os.pathsep)[0] == package_root()
    assert seen["executable"] == sys.executable
    assert seen["fds"] == [0, 1, 2, 3]  # 3: the listing's own; nothing of ours leaked in
    text = log.read_text()
    assert text.startswith("before\n") and text.endswith("to stderr\n")  # appended, both streams


def test_a_new_log_is_private_and_an_open_one_stays_open(tmp_path: Path) -> None:
    log = tmp_path / "new.log"
    spawn_python(["-c", "print('hi')"], log=log).wait(timeout=30)
    assert log.read_text() == "hi\n" and log.stat().st_mode & 0o777 == 0o600
    with open(tmp_path / "mine.log", "ab") as f:
        spawn_python(["-c", "print('one')"], log=f.fileno()).wait(timeout=30)
        f.write(b"still open\n")
    assert (tmp_path / "mine.log").read_text() == "one\nstill open\n"
    assert spawn_python(["-c", "print('dropped')"]).wait(timeout=30) == 0  # no log: /dev/null


def test_passed_descriptors_reach_it(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        code = f"import os; os.write({w}, b'through'); os.close({w})"
        spawn_python(["-c", code], pass_fds=[w]).wait(timeout=30)
        os.close(w)
        w = -1
        assert os.read(r, 100) == b"through"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_a_bare_interpreter_imports_this_elsewhere(tmp_path: Path) -> None:
    bare = "/usr/bin/python3"
    if not os.path.exists(bare) or subprocess.run([bare, "-c", "import elsewhere"],
                                                  capture_output=True).returncode == 0:
        pytest.skip(f"no {bare} without elsewhere on this machine")
    log = tmp_path / "bare.log"
    code = "import elsewhere.hosts.probe as p, sys; print(p.__file__)"
    proc = spawn_python(["-c", code], python=bare, log=log, cwd=tmp_path)
    assert proc.wait(timeout=30) == 0, log.read_text()
    assert log.read_text().strip() == os.path.join(package_root(), "elsewhere", "hosts", "probe.py")


@pytest.mark.parametrize("posix_spawn", [True, False], ids=["posix_spawn", "fallback"])
def test_started_by_pid_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     posix_spawn: bool) -> None:
    if not posix_spawn:
        def refuse(*args: object, **kwargs: object) -> int:
            raise NotImplementedError("setsid is not supported by posix_spawn here")

        monkeypatch.setattr(os, "posix_spawn", refuse)
    log = tmp_path / "pid.log"
    pid = spawn_python_pid(["-c", REPORT], log=log, env={**os.environ, "EW_EXTRA": "y"})
    assert isinstance(pid, int)
    seen = _report(log)
    assert seen["pid"] == pid == seen["sid"] == seen["pgid"]
    assert seen["stdin"] == "/dev/null"
    assert seen["extra"] == "y"
    assert str(seen["pythonpath"]).split(os.pathsep)[0] == package_root()
    # posix_spawn cannot close descriptors: only those made inheritable here may reach it
    assert set(seen["fds"]) - {0, 1, 2, 3} <= _inheritable()
    assert log.stat().st_mode & 0o777 == 0o600
    deadline = time.monotonic() + 30
    while os.waitpid(pid, os.WNOHANG) == (0, 0):  # ours to reap
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_missing_interpreter_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spawn_python(["-c", "pass"], python=tmp_path / "no-python")
    with pytest.raises(FileNotFoundError):
        spawn_python_pid(["-c", "pass"], python=tmp_path / "no-python")
