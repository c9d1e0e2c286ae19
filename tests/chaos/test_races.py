"""Concurrent clients on one job: purge against purge, cancel against purge, retry against
purge and against retry, wait against purge, from several processes at once on the same job,
twelve jobs (trials) of each at a time.

The client processes of a trial (forked from one that imported elsewhere) wait at a barrier
(a FIFO every one of them opens for reading: all go on the moment the test opens it for
writing), so that their actions meet within a few milliseconds. Waiters go first and are waiting (they
hold the job's notify FIFO open) when the barrier opens. Whatever the interleaving, nobody may
see a FileNotFoundError or a traceback, nothing may hang, and the outcomes are those
docs/cli.md promises: of several purges exactly one succeeds and the others say the job is gone
(exit code 2), a cancel or a wait of a purged job says so, two retries run each task once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import elsewhere as ew
from chaos.conftest import Tally, has_open, scaled

pytestmark = pytest.mark.timeout(180)

TRIALS = scaled(12)

ZYGOTE = r"""
import json, os, signal, sys, traceback
import elsewhere as ew
from elsewhere.api import cli, commands, functions, job  # what every client imports, once
from elsewhere.backends import local, peer
from elsewhere.core import control
from elsewhere.folder import registry


def act(mode, args):
    if mode in ("cli", "cli-wait"):
        return cli.main(args)
    name, action = args
    try:
        j = ew.recover(name)
        if action == "retry":  # what job.retry() does, with the tasks it started again
            print("retried", *control.retry(j.cluster, j.handle))
        else:
            j.wait(timeout=30, progress=False)
            print("waited")
    except ew.TimeoutError as exc:
        print("timeout:", exc)
    except ew.JobError as exc:
        print("job error:", type(exc).__name__, exc)
    return 0


signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the clients
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        continue
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, req["out"] + ".stdout"), (2, req["out"] + ".stderr")):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        if not req["mode"].endswith("wait"):
            open(req["out"] + ".ready", "w").close()
            os.close(os.open(req["barrier"], os.O_RDONLY))  # blocks until the test opens it: all go at once
        code = act(req["mode"], req["args"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        with open(req["out"] + ".rc.tmp", "w") as f:
            f.write(str(code))
        os.replace(req["out"] + ".rc.tmp", req["out"] + ".rc")
        os._exit(code)
"""


def nap(s):
    time.sleep(s)
    return s




def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Race:
    """The client processes of a batch of trials, released together.

    Each client is a fresh process forked from a zygote that imported elsewhere once (a
    hundred interpreters importing it would take longer than the races): it shares nothing
    with the others but what a job folder and the registry share."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / f"race-{time.monotonic_ns()}"
        self.dir.mkdir()
        self.barrier = self.dir / "barrier"
        os.mkfifo(self.barrier)
        self.zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)  # fmt: skip
        self.clients: list[tuple[int, Path, str]] = []

    def start(self, mode: str, *args: str) -> None:
        """A client: ``cli`` ARGS (``elsewhere ARGS``), ``api`` NAME retry (``job.retry()``),
        and the waiters, which go at once, not at the barrier: ``cli-wait`` ARGS, ``api-wait``
        NAME wait (``job.wait()``)."""
        out = self.dir / f"client-{len(self.clients)}"
        req = {"mode": mode, "args": list(args), "out": str(out), "barrier": str(self.barrier)}
        assert self.zygote.stdin and self.zygote.stdout
        self.zygote.stdin.write(json.dumps(req) + "\n")
        self.zygote.stdin.flush()
        pid = int(self.zygote.stdout.readline())
        self.clients.append((pid, out, " ".join((mode, *args))))

    def go(self, tally: Tally, timeout: float = 90) -> list[subprocess.CompletedProcess]:
        """Release them all once each is at the barrier (a waiter: waiting); their outcomes."""
        deadline = time.monotonic() + timeout
        for pid, out, what in self.clients:
            ready = out.with_suffix(".ready")
            while not (ready.exists() or not _alive(pid) or has_open(pid, "notify.fifo")):
                if time.monotonic() > deadline:
                    tally.hang(f"{what} never reached the barrier")
                    break
                time.sleep(0.005)
        fd = self._open_barrier(deadline)
        results = []
        try:
            for pid, out, what in self.clients:
                rc = out.with_suffix(".rc")
                while not rc.exists() and _alive(pid):
                    if time.monotonic() > deadline:
                        tally.hang(f"{what} ran past {timeout} s")
                        os.kill(pid, signal.SIGKILL)
                        break
                    time.sleep(0.005)
                code = int(rc.read_text()) if rc.exists() else -9
                stdout, stderr = (
                    out.with_suffix(".stdout").read_text(),
                    out.with_suffix(".stderr").read_text(),
                )
                tally.check_output(what, stdout + stderr)
                if "FileNotFoundError" in stdout + stderr or "No such file" in stdout + stderr:
                    tally.traceback(
                        f"{what}: a raw FileNotFoundError: {(stdout + stderr).strip()[-300:]}"
                    )
                results.append(subprocess.CompletedProcess(what, code, stdout, stderr))
        finally:
            if fd >= 0:
                os.close(fd)
            self.zygote.stdin.close()
            self.zygote.wait(timeout=30)
        return results

    def _open_barrier(self, deadline: float) -> int:
        """Open the barrier for writing (every reader goes on), once a reader has it open."""
        while True:
            try:
                return os.open(self.barrier, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader (all waiters, or on their way)
                if time.monotonic() > deadline or not any(o.with_suffix(".ready").exists() and _alive(p)
                                                          for p, o, _ in self.clients):  # fmt: skip
                    return -1
                time.sleep(0.001)


def _jobs(prefix: str, *, cancelled: bool = False) -> list[ew.Job]:
    """TRIALS jobs of two sleeping tasks each (one worker each, so that twelve jobs run at once
    on a small machine); ``cancelled``: cancelled at once (their tasks are to be retried)."""
    jobs = [
        ew.submit(nap, [60, 60], name=f"{prefix}{i}", on=ew.local(cores=1)) for i in range(TRIALS)
    ]
    if cancelled:
        for job in jobs:
            job.cancel()
    return jobs


def _gone(job: ew.Job) -> None:
    assert not job.path.exists(), f"{job.name}: its folder is left"
    assert job.id not in {j["id"] for j in ew.jobs(refresh=False)}, (
        f"{job.name}: its registry entry is left"
    )


def _says_gone(p: subprocess.CompletedProcess) -> None:
    """Exit code 2 and one line: the job is gone, or there is no such job (it went first)."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.args, p.returncode, p.stderr)
    assert "is gone" in lines[0] or "no job named" in lines[0], lines[0]


def test_purge_against_purge_against_purge(ew_home, tally, tmp_path):
    jobs = _jobs("pp")
    race = Race(tmp_path)
    for job in jobs:
        for _ in range(3):
            race.start("cli", "purge", job.name)
    out = race.go(tally)
    for i, job in enumerate(jobs):
        tally.trial()
        mine = out[3 * i : 3 * i + 3]
        won = [p for p in mine if p.returncode == 0]
        assert len(won) == 1 and f"purged job {job.name!r}" in won[0].stdout, [
            (p.returncode, p.stderr) for p in mine
        ]
        for p in mine:
            if p.returncode:
                _says_gone(p)
        _gone(job)


def test_cancel_against_purge(ew_home, tally, tmp_path):
    jobs = _jobs("cp")
    race = Race(tmp_path)
    for job in jobs:
        race.start("cli", "cancel", job.name)
        race.start("cli", "purge", job.name)
    out = race.go(tally)
    for i, job in enumerate(jobs):
        tally.trial()
        cancel, purge = out[2 * i], out[2 * i + 1]
        assert purge.returncode == 0, purge.stderr
        if cancel.returncode:
            _says_gone(cancel)
        else:
            assert "cancelled" in cancel.stdout, cancel.stdout
        _gone(job)


def test_retry_against_purge(ew_home, tally, tmp_path):
    jobs = _jobs("rp", cancelled=True)
    race = Race(tmp_path)
    for job in jobs:
        race.start("api", job.name, "retry")
        race.start("cli", "purge", job.name)
    out = race.go(tally)
    for i, job in enumerate(jobs):
        tally.trial()
        retry, purge = out[2 * i], out[2 * i + 1]
        assert purge.returncode == 0, purge.stderr
        said = retry.stdout.strip()
        assert retry.returncode == 0 and (said.startswith("retried") or "JobNotFound" in said
                                          or "JobGone" in said), (said, retry.stderr)  # fmt: skip
        _gone(job)


def test_retry_against_retry_runs_each_task_once(ew_home, tally, tmp_path):
    jobs = _jobs("rr", cancelled=True)
    race = Race(tmp_path)
    for job in jobs:
        race.start("api", job.name, "retry")
        race.start("api", job.name, "retry")
    out = race.go(tally)
    for i, job in enumerate(jobs):
        tally.trial()
        again = []
        for p in out[2 * i : 2 * i + 2]:
            assert p.returncode == 0 and p.stdout.startswith("retried"), (p.stdout, p.stderr)
            again += [int(t) for t in p.stdout.split()[1:]]
        assert sorted(again) == [0, 1], f"{job.name}: tasks retried {again}: each once"
    for job in jobs:
        job.cancel()


def test_wait_against_purge(ew_home, tally, tmp_path):
    jobs = _jobs("wp")
    race = Race(tmp_path)
    for job in jobs:
        race.start("cli-wait", "wait", job.name, "--timeout", "60", "--no-progress")
        race.start("api-wait", job.name, "wait")
        race.start("cli", "purge", job.name)
    out = race.go(tally)
    for i, job in enumerate(jobs):
        tally.trial()
        shell, api, purge = out[3 * i : 3 * i + 3]
        assert purge.returncode == 0, purge.stderr
        # the wait ends (never 124, nor a hang): at the purge's first step, which cancels the job
        # (then it says so, exit code 1), or when the job is gone (exit code 2)
        if shell.returncode == 1:
            assert "cancelled" in shell.stdout and not shell.stderr, (shell.stdout, shell.stderr)
        else:
            _says_gone(shell)
        said = api.stdout.strip()
        assert api.returncode == 0 and (said.startswith("job error:") or said == "waited"), (
            said,
            api.stderr,
        )
        _gone(job)
