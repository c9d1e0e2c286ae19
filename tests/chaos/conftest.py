"""The chaos suite: experiments that attack elsewhere as a careless user, a full disk, a
killed process or a hostile peer would, and count what went wrong.

Run it alone with ``scripts/test tests/chaos``; ``ELSEWHERE_CHAOS_SOAK=1`` multiplies the
trials of every experiment by ten (a long soak, not run in CI).

Every experiment records its trials in a :class:`Tally` (the ``tally`` fixture) and fails when
any result was lost, any wait hung (hit its timeout) or any user-facing command printed a
Python traceback. The fixture prints one line per experiment, so a run shows what it tried.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

SOAK = os.environ.get("ELSEWHERE_CHAOS_SOAK", "0") not in ("", "0")


def scaled(n: int) -> int:
    """``n`` trials, or ten times as many in a soak."""
    return n * 10 if SOAK else n


@dataclass
class Tally:
    """What one experiment tried and what went wrong."""

    name: str
    trials: int = 0
    lost: int = 0
    hangs: int = 0
    tracebacks: int = 0
    notes: list[str] = field(default_factory=list)

    def trial(self, n: int = 1) -> None:
        self.trials += n

    def lose(self, n: int, why: str) -> None:
        """``n`` results lost (or wrong) in a trial."""
        if n:
            self.lost += n
            self.notes.append(f"lost {n}: {why}")

    def hang(self, why: str) -> None:
        self.hangs += 1
        self.notes.append(f"hang: {why}")

    def traceback(self, why: str) -> None:
        self.tracebacks += 1
        self.notes.append(f"traceback: {why}")

    def check_output(self, what: str, text: str) -> None:
        """Count a Python traceback in a command's output."""
        if "Traceback (most recent call last)" in text:
            self.traceback(f"{what}: {text.strip().splitlines()[-1][:200]}")

    def summary(self) -> str:
        return (f"chaos {self.name}: {self.trials} trials, {self.lost} lost, {self.hangs} hangs, "
                f"{self.tracebacks} tracebacks")  # fmt: skip

    def verify(self) -> None:
        assert self.trials > 0, f"{self.name}: the experiment ran no trial"
        bad = self.lost + self.hangs + self.tracebacks
        assert not bad, self.summary() + "\n  " + "\n  ".join(self.notes[:20])


@pytest.fixture
def tally(request):
    """A Tally for this experiment, verified when it ends (unless the test failed already)."""
    t = Tally(request.node.name)
    yield t
    print("\n" + t.summary())
    if not getattr(request.node, "_chaos_failed", False):
        t.verify()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        item._chaos_failed = True


def run_cli(tally: Tally, *args: str, timeout: float = 60, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``elsewhere ARGS`` as a user would; count a traceback or a hang. A hang's note holds
    where each thread of the command was when it was stopped (faulthandler's dump, asked for
    with SIGABRT), so that a hang met once in CI says where it was."""
    cmd = [sys.executable, "-m", "elsewhere", *args]
    # -X faulthandler: for this process only (an environment variable would reach its workers)
    with subprocess.Popen([sys.executable, "-X", "faulthandler", *cmd[1:]], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.PIPE if input is not None else None,
                          text=True, env={**os.environ, **(env or {})}) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            held = _locks_held(env.get("ELSEWHERE_HOME") if env else None)  # (before it is stopped)
            where = _stopped_for_a_hang(proc) + held
            tally.hang(f"elsewhere {' '.join(args)} ran over {timeout} s; where it was:\n{where}")
            print(tally.notes[-1])  # whole, in the failed test's captured output
            return subprocess.CompletedProcess(cmd, -9, "", where)  # (its stderr: where it was)
    p = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    tally.check_output("elsewhere " + " ".join(args), p.stdout + p.stderr)
    return p


def _stopped_for_a_hang(proc: subprocess.Popen) -> str:
    """Stop a command that hung, after it printed its threads' stacks; the end of what it said."""
    proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then it dies
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return "\n".join((err or "(nothing on stderr)").strip().splitlines()[-60:])


def _locks_held(home: str | None) -> str:
    """Who holds a lock on the home's lock files (``registry.lock``, the jobs' ``queue.lock``,
    workers' ``.cur``), from ``/proc/locks``: a command waiting for one names its holder."""
    home = home or os.environ.get("ELSEWHERE_HOME")
    if not home or not os.path.isdir(home):
        return ""
    names: dict[int, str] = {}
    for top, _dirs, files in os.walk(home):
        for f in files:
            if f.endswith((".lock", ".cur")):
                with contextlib.suppress(OSError):
                    names[os.stat(os.path.join(top, f)).st_ino] = os.path.relpath(os.path.join(top, f), home)
    lines = []
    try:
        with open("/proc/locks") as f:
            for line in f:  # "1: FLOCK  ADVISORY  WRITE 13689 fe:00:3722305 0 EOF"
                words = line.split()
                if "->" in words or len(words) < 6:
                    continue  # a waiter, not a holder
                inode = int(words[5].rsplit(":", 1)[1])
                if inode in names:
                    pid = int(words[4])
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as c:
                            what = c.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
                    except OSError:
                        what = "?"
                    me = " (this test's process)" if pid == os.getpid() else ""
                    lines.append(f"{names[inode]}: {words[1]} {words[3]} held by pid {pid}{me}: {what}")
    except OSError:
        return ""
    return "\nlocks held on the home's files:\n" + "\n".join(lines) if lines else ""


def has_open(pid: int, name: str) -> bool:
    """Whether process ``pid`` has a file whose path ends with ``name`` open."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(name) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False
