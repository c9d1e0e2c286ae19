"""The shell as a careless user meets it: every ``elsewhere`` command and sub-command with bad
input, a missing job, a purged job, a damaged job folder and a damaged registry. None may print
a Python traceback; each error is one line on stderr with a documented exit code (docs/cli.md:
0 done, 1 failed or an error, 2 usage or no such job, 124 a wait that timed out, 130 Ctrl-C);
every ``--json`` output is read by a strict JSON parser.

Most commands run in this process, through ``elsewhere.api.cli.main`` (the entry point of the
``elsewhere`` script, its error boundary included), so that a hundred of them take seconds;
a sample of each kind, the damaged registry, Ctrl-C and ``--debug`` run as a user runs them,
``python -m elsewhere`` in a process of its own (``run_cli``)."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import elsewhere as ew
from chaos.conftest import Tally, _locks_held, _stopped_for_a_hang, has_open, run_cli

pytestmark = pytest.mark.timeout(120)

EXIT_CODES = {0, 1, 2, 124, 130}


def strict_json(text: str):
    """``json.loads`` that refuses NaN, Infinity and -Infinity (as strict parsers do)."""

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def shell(tally, capsys, monkeypatch):
    """``shell(*args)``: ``elsewhere ARGS`` in this process; a CompletedProcess. An exception out
    of ``main`` counts as a traceback, as would one printed by the real command."""
    from elsewhere.api import cli
    from elsewhere.backends import peer

    # main() sets it: restored after the test
    monkeypatch.setattr(peer, "_carry_on_here", peer._carry_on_here)

    def run(*args: str) -> subprocess.CompletedProcess:
        tally.trial()
        capsys.readouterr()
        try:
            code = cli.main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # what the shell would print as a traceback
            tally.traceback(f"elsewhere {' '.join(args)}: {type(exc).__name__}: {exc}")
            code = -1
        out, err = capsys.readouterr()
        tally.check_output("elsewhere " + " ".join(args), out + err)
        return subprocess.CompletedProcess(["python", "-m", "elsewhere", *args], code, out, err)

    return run


def run_many(tally: Tally, cases: list[tuple[str, ...]], **kw) -> list[subprocess.CompletedProcess]:
    """``run_cli`` for each case, three at a time; their tallies added to ``tally``."""

    def one(args: tuple[str, ...]) -> tuple[Tally, subprocess.CompletedProcess]:
        own = Tally(" ".join(args))
        return own, run_cli(own, *args, **kw)

    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(one, cases))
    for own, _ in done:
        tally.trial()
        tally.hangs += own.hangs
        tally.tracebacks += own.tracebacks
        tally.notes += own.notes
    return [p for _, p in done]


def one_line_error(p: subprocess.CompletedProcess, code: int | set[int], *words: str) -> None:
    """``p`` ended with ``code`` (one of them) and said why on exactly one line of stderr."""
    codes = {code} if isinstance(code, int) else code
    what = " ".join(p.args[3:])
    assert p.returncode in codes, (
        f"elsewhere {what}: exit code {p.returncode}, not {codes}: {p.stderr}"
    )
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, f"elsewhere {what}: not one line on stderr: {p.stderr!r}"
    assert lines[0].startswith("elsewhere"), lines[0]
    for w in words:
        assert w in lines[0], f"elsewhere {what}: {w!r} not in {lines[0]!r}"


def nap(s):
    time.sleep(s)
    return s


def odd_floats(i):
    import numpy as np

    return {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "ok": 1.5, 2.5: "float key",
            "array": np.array([1.0, np.nan, np.inf]), "scalar": np.float32("nan"), "c": complex(i, 1),
            "set": {3, 1}, "nested": [(math.nan,), {"deep": [-math.inf]}]}  # fmt: skip


# ---------------------------------------------------------------- bad input, no job needed

USAGE_CASES = [  # (`elsewhere` alone prints the help: tests/cli/test_help.py)
    ("bogus",),
    ("--bogus-option",),
    ("status",),
    ("status", "x", "--bogus"),
    ("wait", "x", "--timeout", "soon"),
    ("wait", "x", "--timeout", "-1"),
    ("results", "x", "--compact", "extra"),
    ("logs", "x", "abc"),
    ("logs", "x", "-1"),
    ("logs", "x", "1.5"),
    ("cancel",),
    ("purge",),
    ("workers",),
    ("workers", "start"),
    ("template",),
    ("template", "bogus"),
    ("template", "show"),
    ("template", "show", "../../etc/passwd"),
    ("template", "show", "no-such-template"),
    ("template", "install", "mine", "--source", "no-such-template"),
    ("doctor",),
    ("demo", "--tasks", "0"),
    ("demo", "--samples", "many"),
    ("peer",),
    ("peer", "bogus"),
    ("peer", "worker", "--tcp-port", "99999"),
    ("peer", "worker", "--tcp-port", "-1"),
    ("peer", "worker", "--port", "65536"),
    ("peer", "worker", "--slots", "0"),
    ("peer", "worker", "--slots", "two"),
    ("peer", "worker", "--maxnum", "-3"),
    ("peer", "worker", "--half-life", "0"),
    ("peer", "worker", "--busy-poll", "-1"),
    ("peer", "worker", "--busy-poll", "5000"),
    ("peer", "worker", "--memavail", "lots"),
    ("peer", "worker", "--timavail", "forever-ish"),
    ("peer", "worker", "--grace", "0"),
    ("peer", "worker", "--key", "/nonexistent/key"),
    ("peer", "worker", "--group", "bad/name"),
    ("peer", "worker", "--log-level", "loud"),
    ("peer", "stop", "0"),
    ("peer", "stop", "--timeout", "x"),
    ("peer", "list", "--wait", "-1"),
    ("peer", "list", "--port", "70000"),
    (
        "peer",
        "keygen",
    ),
    ("peer", "keygen", "bad name!"),
]


def test_bad_arguments_are_one_line_and_exit_code_2(ew_home, tally, shell, tmp_path, monkeypatch):
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "config"))
    for args in USAGE_CASES:
        one_line_error(shell(*args), 2)
    assert not (tmp_path / "config" / "templates").exists()  # nothing was installed
    # and from the shell, a sample: the known tracebacks of before among them
    sample = [
        ("bogus",),
        ("logs", "x", "-1"),
        ("peer", "worker", "--tcp-port", "99999"),
        ("template", "show", "../x"),
    ]
    for p in run_many(tally, sample, timeout=30):
        one_line_error(p, 2)


def test_commands_that_work_without_a_job(ew_home, tally, shell, tmp_path, monkeypatch):
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "config"))
    # `template edit` opens the file with `true`: it returns at once
    monkeypatch.setenv("VISUAL", "true")
    key = tmp_path / "lab.key"
    cases = [("jobs",), ("jobs", "--json"), ("workers", "stop"), ("template", "list"),
             ("template", "show", "slurm"), ("template", "install", "mine", "--source", "slurm"),
             ("peer", "stop"), ("peer", "keygen", "lab", "--output", str(key)),
             ("peer", "list", "--wait", "0", "--json", "--port", "47133", "--multicast-group", "none",
              "--peer", "127.0.0.1:47134")]  # fmt: skip
    out = [shell(*args) for args in cases]
    for p in out:
        assert p.returncode == 0, (p.args, p.stderr)
    assert strict_json(out[1].stdout) == [] and strict_json(out[-1].stdout) == []
    again = [shell(*args) for args in [("template", "install", "mine", "--source", "slurm"),
                                       ("peer", "keygen", "lab", "--output", str(key)),
                                       ("template", "edit", "mine"), ("doctor", "no-such-host.invalid")]]  # fmt: skip
    one_line_error(again[0], 2, "--force")
    one_line_error(again[1], 2)
    assert again[2].returncode == 0, again[2].stderr
    assert again[3].returncode == 1 and "FAIL" in again[3].stdout  # the report says what to fix


# ---------------------------------------------------------------- a job that is not there

JOB_VERBS = [("status", "{}"), ("status", "{}", "--json"), ("wait", "{}", "--timeout", "5"), ("results", "{}"),
             ("results", "{}", "--json"), ("logs", "{}"), ("logs", "{}", "0"), ("cancel", "{}"),
             ("purge", "{}")]  # fmt: skip


def _verbs(name: str) -> list[tuple[str, ...]]:
    return [tuple(a.format(name) for a in v) for v in JOB_VERBS]


def test_a_missing_job_is_no_such_job(ew_home, tally, shell):
    for args in _verbs("no-such-job"):
        one_line_error(shell(*args), 2, "no job named 'no-such-job'")
    (p,) = run_many(tally, [("results", "no-such-job", "--json")])
    one_line_error(p, 2, "no job named 'no-such-job'")


def test_a_purged_job_and_a_job_whose_folder_vanished(ew_home, tally, shell):
    gone = ew.submit(abs, [1, -2], name="gone")
    vanished = ew.submit(abs, [3], name="vanished")
    gone.wait(timeout=60)
    vanished.wait(timeout=60)
    purge = run_cli(tally, "purge", "gone")
    assert purge.returncode == 0 and "purged job 'gone'" in purge.stdout, purge.stderr
    shutil.rmtree(vanished.path)  # the registry still names it
    for args in _verbs("gone"):
        one_line_error(shell(*args), 2, "no job named 'gone'")
    for args in _verbs("vanished"):
        one_line_error(shell(*args), 2, "'vanished'")
    # the Job objects of this process say it too
    from elsewhere.core import control

    for job in (gone, vanished):
        for act in (job.check, job.cancel, lambda j=job: j.wait(timeout=5),
                    lambda j=job: control.purge(j.cluster, j.handle)):  # fmt: skip
            with pytest.raises(ew.JobError, match=r"gone|deleted"):
                act()
    assert "vanished" not in {
        j["name"] for j in ew.jobs()
    }  # `elsewhere purge vanished` dropped its entry


def test_a_job_with_a_wrong_task_index(ew_home, tally, shell):
    ew.submit(abs, [1, -2, 3], name="three").wait(timeout=60)
    far, ok = shell("logs", "three", "99999"), shell("logs", "three", "2")
    one_line_error(far, 2, "no task 99999", "0 to 2")
    assert ok.returncode == 0, ok.stderr


# ---------------------------------------------------------------- damaged job folders and registry


def _damage(path: Path, how: str) -> None:
    if how == "job.json garbage":
        (path / "job.json").write_bytes(b"\x00\xffnot json at all")
    elif how == "job.json cut":
        data = (path / "job.json").read_bytes()
        (path / "job.json").write_bytes(data[: len(data) // 2])
    elif how == "queue garbage":
        (path / "queue.json").write_bytes(b"garbage")
        (path / "queue.b.json").write_bytes(b"garbage")
    elif how == "queue.lock deleted":
        (path / "queue.lock").unlink()
    elif how == "results deleted":
        for f in (path / "results").iterdir():
            f.unlink()


DAMAGES = [
    "job.json garbage",
    "job.json cut",
    "queue garbage",
    "queue.lock deleted",
    "results deleted",
]


def test_a_damaged_job_folder_is_one_line_never_a_traceback(ew_home, tally, shell):
    jobs = {how: ew.submit(abs, [1, -2], name=f"d{i}") for i, how in enumerate(DAMAGES)}
    for job in jobs.values():
        job.wait(timeout=60)
    for how, job in jobs.items():
        _damage(job.path, how)
    cases = [v for job in jobs.values() for v in _verbs(job.name) if v[0] != "purge"]
    cases += [("jobs",), ("jobs", "--json")]
    outcomes = [shell(*args) for args in cases]
    outcomes += run_many(tally, [("status", "d0"), ("results", "d2")])  # and from the shell
    for p in outcomes:
        assert p.returncode in {0, 1, 2}, (p.args, p.returncode, p.stderr)
        if p.returncode and (p.stderr or p.args[3] != "wait"):  # (wait: 1 if the job failed)
            one_line_error(p, {1, 2})
        elif "--json" in p.args:
            strict_json(p.stdout)
    # and `elsewhere purge` removes each, damaged or not
    for p, job in zip([shell("purge", job.name) for job in jobs.values()], jobs.values()):
        assert p.returncode == 0, (p.args, p.stderr)
        assert not job.path.exists()


def test_a_damaged_registry_is_one_line_never_a_traceback(ew_home, tally):
    ew.submit(abs, [1], name="reg").wait(timeout=60)
    reg = ew_home / "registry.sqlite"
    for side in ("-wal", "-shm"):
        Path(f"{reg}{side}").unlink(missing_ok=True)
    reg.write_bytes(b"this is not an SQLite database" * 100)
    for p in run_many(tally, [("jobs",), ("jobs", "--json"), ("status", "reg"), ("purge", "reg")]):
        assert p.returncode in {0, 1, 2}, (p.args, p.stderr)
        if p.returncode:
            one_line_error(p, {1, 2})


# ---------------------------------------------------------------- strict JSON


def test_every_json_output_is_strict(ew_home, tally, shell):
    pytest.importorskip("numpy")
    job = ew.submit(odd_floats, [0, 1], name="odd")
    job.wait(timeout=60)
    (res,) = run_many(tally, [("results", "odd", "--json")])  # as a user runs it
    compact, partial, status, jobs = (shell("results", "odd", "--json", "--compact"),
                                      shell("results", "odd", "--json", "--partial"),
                                      shell("status", "odd", "--json"), shell("jobs", "--json"))  # fmt: skip
    for p in (res, compact, partial, status, jobs):
        assert p.returncode == 0, p.stderr
        strict_json(p.stdout)
    assert len(compact.stdout.strip().splitlines()) == 1
    value = strict_json(res.stdout)[1]["value"]
    assert value["nan"] == "NaN" and value["inf"] == "Infinity" and value["ninf"] == "-Infinity"
    assert value["ok"] == 1.5 and value["2.5"] == "float key"
    assert value["array"] == [1.0, "NaN", "Infinity"] and value["scalar"] == "NaN"
    assert value["c"] == "(1+1j)" and value["set"] == [1, 3]
    assert value["nested"] == [["NaN"], {"deep": ["-Infinity"]}]
    assert strict_json(status.stdout)["state"] == "finished"
    (row,) = strict_json(jobs.stdout)
    # the cluster an object, not JSON text
    assert isinstance(row["cluster"], dict) and row["cluster"]["kind"] == "local"


# ---------------------------------------------------------------- wait: exit codes, timeout, Ctrl-C




def _sigint_inherited() -> str:
    """How this thread's SIGINT differs from a terminal command's ("" if it does not)."""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    return " and ".join(w for w, on in (("blocked", blocked), ("ignored", ignored)) if on)


def _sigint_as_at_a_terminal() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_wait_timeout_cancel_and_ctrl_c_have_their_own_exit_codes(ew_home, tally):
    job = ew.submit(nap, [60], name="sleepy", on=ew.local(cores=1))
    timed_out = run_cli(tally, "wait", "sleepy", "--timeout", "0.3", "--no-progress")
    one_line_error(timed_out, 124, "did not reach finished")
    # Ctrl-C while it waits: 130 and one line, once the waiter sleeps on the job's notify fifo
    # The waiter inherits this process's signal mask and ignored signals: a test run before
    # this one in the same pytest process, or the shell that started pytest in the
    # background, may have left SIGINT blocked or ignored, and then no Ctrl-C reaches it (it
    # hung so twice). Said here if so, and the waiter starts as a terminal's command would.
    inherited = _sigint_inherited()
    if inherited:
        print(f"note: this test's process has SIGINT {inherited}; the waiter starts without that")
    waiter = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "elsewhere", "wait", "sleepy", "--timeout",
                               "60", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_sigint_as_at_a_terminal)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not has_open(waiter.pid, "notify.fifo") and waiter.poll() is None:
            if time.monotonic() > deadline:
                tally.hang("the waiter never opened the job's notify fifo")
                break
            time.sleep(0.02)
        waiter.send_signal(signal.SIGINT)
        try:
            out, err = waiter.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            with open(f"/proc/{waiter.pid}/status") as f:  # (its signal mask, ignored and caught signals)
                sig = "".join(line for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
            where = sig + _locks_held(None) + "\n" + _stopped_for_a_hang(waiter)
            pytest.fail(f"elsewhere wait went on for 30 s after Ctrl-C; where it was:\n{where}")
    finally:
        if waiter.poll() is None:
            waiter.kill()
    tally.trial()
    tally.check_output("elsewhere wait (Ctrl-C)", out + err)
    assert waiter.returncode == 130, err
    assert (
        err.strip().count("\n") == 0 and "interrupted" in err and "elsewhere cancel sleepy" in err
    )
    cancel = run_cli(tally, "cancel", "sleepy")
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout, cancel.stderr
    ended, again = run_many(tally, [("wait", "sleepy", "--timeout", "30"), ("cancel", "sleepy")])
    # it ended, not finished
    assert ended.returncode == 1 and "cancelled" in ended.stdout, ended.stderr
    assert again.returncode == 0, again.stderr  # cancelling twice changes nothing
    assert job.state is ew.JobState.CANCELLED


# ---------------------------------------------------------------- the boundary itself


def test_the_boundary_turns_every_error_into_one_line_and_a_code(capsys, monkeypatch, tmp_path):
    import argparse
    import errno
    import sqlite3

    from elsewhere.api import exits

    monkeypatch.delenv("ELSEWHERE_DEBUG", raising=False)
    monkeypatch.setenv("ELSEWHERE_HOME", str(tmp_path))
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "jobs" / "x"))
    cases = [
        (KeyError("n_tasks"), 1, ["KeyError", "ELSEWHERE_DEBUG=1"]),
        (ValueError("two\nlines"), 1, ["ValueError: two lines"]),
        (full, 1, ["No space left on device", str(tmp_path / "jobs" / "x"), "free some space"]),
        (
            PermissionError(errno.EACCES, "Permission denied", "/root/x"),
            1,
            ["/root/x", "owner and mode"],
        ),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y"),
            1,
            ["no such file", "/x/y"],
        ),
        (
            sqlite3.DatabaseError("file is not a database"),
            1,
            ["registry", "file is not a database"],
        ),
        (ew.JobNotFound("no job named 'x'"), 2, ["no job named 'x'"]),
        (ew.ConfigError("cores must be positive"), 2, ["cores must be positive"]),
        (ew.TimeoutError("job 'x' did not reach finished"), 124, ["did not reach"]),
        (ew.StateError("cannot move"), 1, ["cannot move"]),
    ]
    for exc, code, words in cases:

        def fail(args, exc=exc):
            raise exc

        assert exits.run(fail, argparse.Namespace()) == code, exc
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("elsewhere: "), err
        for w in words:
            assert w in err, (w, err)

    def interrupted(args):
        raise KeyboardInterrupt

    assert exits.run(interrupted, argparse.Namespace(name="fits")) == 130
    assert "interrupted; job 'fits' goes on running" in capsys.readouterr().err
    # --debug (or ELSEWHERE_DEBUG=1): the traceback, then the line
    monkeypatch.setenv("ELSEWHERE_DEBUG", "1")
    assert exits.run(fail, argparse.Namespace()) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1].startswith(
        "elsewhere: "
    )


def test_debug_prints_the_traceback_from_the_shell(ew_home):
    p = subprocess.run([sys.executable, "-m", "elsewhere", "status", "nope", "--debug"], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2
    assert "Traceback (most recent call last)" in p.stderr
    assert (
        p.stderr.strip().splitlines()[-1]
        == "elsewhere: no job named 'nope': `elsewhere jobs` lists the jobs there are"
    )
    helped = subprocess.run([sys.executable, "-m", "elsewhere", "--help"], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert helped.returncode == 0 and "exit codes:" in helped.stdout and "124" in helped.stdout
