"""The queue shared by the fake LSF, HTCondor and Flux commands (stdlib only).

Each fake command is a small script in ``tests/fakes/<scheduler>/bin`` that
parses its arguments, reads or changes the queue through this module, and
prints what the real tool prints. The queue is one JSON file per scheduler
in the folder named by ``ELSEWHERE_FAKE_STATE`` (default:
``$TMPDIR/elsewhere-fake-<uid>``); every read-modify-write holds an exclusive
``flock`` on ``<scheduler>.lock``.

Elements really run. Submitting records the job and calls :func:`tick`,
which starts pending elements as far as the job's ``max_running`` and the
fake cluster's slots (``ELSEWHERE_FAKE_SLOTS``, default 64) allow. Each
element runs under a *runner*: ``python3 fakecore.py run SCHED JOB INDEX``,
started detached in its own session (so its process group id is its pid),
which starts the element's command with the element's environment and output
file, waits for it (killing it at the job's walltime), records the exit code,
and calls :func:`tick` again so the next pending elements start. Nothing
else runs in the background.

Cancelling kills the element's process group (SIGTERM, then SIGKILL after
``ELSEWHERE_FAKE_KILL_WAIT_S``, default 2 s) and records the element as
cancelled at once. A finished element stays in the queue view for
``ELSEWHERE_FAKE_KEEP_S`` seconds (default 30), then only the history
command shows it. A runner that vanished without recording (killed from
outside) is found by :func:`tick` and recorded as failed, reason "lost".

Generic element states: ``pending``, ``running``, ``done`` (exit 0),
``failed`` (exit != 0), ``cancelled``, ``timeout``, ``lost``; each fake
prints them in its own vocabulary.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

TERMINAL = ("done", "failed", "cancelled", "timeout", "lost")


def state_dir() -> str:
    """The folder holding the fakes' queues (created on first use)."""
    path = os.environ.get("ELSEWHERE_FAKE_STATE") or os.path.join(
        tempfile.gettempdir(), f"elsewhere-fake-{os.getuid()}"
    )
    os.makedirs(path, exist_ok=True)
    return path


def keep_s() -> float:
    """How long a finished element stays in the queue view."""
    return float(os.environ.get("ELSEWHERE_FAKE_KEEP_S", "30"))


def slots() -> int:
    """Elements that may run at once on the whole fake cluster."""
    return int(os.environ.get("ELSEWHERE_FAKE_SLOTS", "64"))


@contextlib.contextmanager
def locked(scheduler: str) -> Iterator[dict[str, Any]]:
    """The queue of ``scheduler``, locked; changes are written back on exit."""
    folder = state_dir()
    with open(os.path.join(folder, f"{scheduler}.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(folder, f"{scheduler}.json")
        try:
            with open(path) as fh:
                queue = json.load(fh)
        except FileNotFoundError:
            queue = {"next_id": 100, "jobs": {}}
        yield queue
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(queue, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)


def read(scheduler: str) -> dict[str, Any]:
    """The queue after a tick (reaps lost runners, starts what may start)."""
    with locked(scheduler) as queue:
        tick(scheduler, queue)
        return json.loads(json.dumps(queue))


def new_job(
    queue: dict[str, Any],
    *,
    job_id: str,
    name: str,
    argv: list[str],
    indices: list[int],
    outputs: dict[int, str],
    errors: dict[int, str] | None = None,
    env: dict[str, str] | None = None,
    element_env: dict[int, dict[str, str]] | None = None,
    cwd: str | None = None,
    max_running: int | None = None,
    walltime_s: float | None = None,
    is_array: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record a job whose elements ``indices`` run ``argv``.

    ``outputs[i]`` is element i's stdout file (stderr too unless ``errors``
    names another); ``env`` is added to every element's environment and
    ``element_env[i]`` to element i's.
    """
    now = time.time()
    job = {
        "id": job_id,
        "name": name,
        "argv": argv,
        "cwd": cwd or os.getcwd(),
        "env": env or {},
        "max_running": max_running,
        "walltime_s": walltime_s,
        "is_array": is_array,
        "submitted": now,
        "user": _user(),
        "extra": extra or {},
        "elements": {
            str(i): {
                "index": i,
                "state": "pending",
                "pid": None,
                "exit_code": None,
                "signal": None,
                "submitted": now,
                "start": None,
                "end": None,
                "reason": "",
                "output": outputs[i],
                "error": (errors or {}).get(i, outputs[i]),
                "env": (element_env or {}).get(i, {}),
            }
            for i in indices
        },
    }
    queue["jobs"][job_id] = job
    return job


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def tick(scheduler: str, queue: dict[str, Any]) -> None:
    """Reap vanished runners, then start pending elements where limits allow."""
    now = time.time()
    running = 0
    for job in queue["jobs"].values():
        for el in job["elements"].values():
            if el["state"] == "running":
                if el["pid"] and not _alive(el["pid"]):
                    el.update(state="lost", end=now, reason="lost")
                    if el.get("child_pid"):  # what a dead node would take with it
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(el["child_pid"], signal.SIGKILL)
                else:
                    running += 1
    free = slots() - running
    for job in sorted(queue["jobs"].values(), key=lambda j: j["submitted"]):
        active = sum(1 for el in job["elements"].values() if el["state"] == "running")
        for el in sorted(job["elements"].values(), key=lambda e: e["index"]):
            if free <= 0:
                return
            if el["state"] != "pending" or el.get("held"):
                continue
            if job["max_running"] and active >= job["max_running"]:
                break
            el["pid"] = _start_runner(scheduler, job["id"], el["index"])
            el.update(state="running", start=now)
            active += 1
            free -= 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie has not been reaped by init yet; it is finished all the same
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _start_runner(scheduler: str, job_id: str, index: int) -> int:
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "run", scheduler, job_id, str(index)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return proc.pid


def run_element(scheduler: str, job_id: str, index: int) -> int:
    """The runner: run one element, record how it ended, start what may start next.

    The element's command runs in a process group of its own; SIGTERM to the
    runner (a cancel) is passed on to that group, with SIGKILL after the
    grace time, so that nothing of a cancelled element survives.
    """
    with locked(scheduler) as queue:
        job = queue["jobs"].get(job_id)
        el = job["elements"].get(str(index)) if job else None
        if el is None or el["state"] != "running":
            return 0
        argv = el.get("argv") or job["argv"]  # a proc may have its own arguments
        cwd, walltime = job["cwd"], job["walltime_s"]
        env = dict(os.environ)
        env.update(job["env"])
        env.update(el["env"])
        output, error = el["output"], el["error"]
    exit_code: int | None = None
    sig: int | None = None
    outcome, reason = "failed", ""
    with contextlib.ExitStack() as files:
        try:
            out = files.enter_context(open(output, "ab"))
            err = out if error == output else files.enter_context(open(error, "ab"))
        except OSError as exc:
            outcome, reason, exit_code = "failed", f"cannot open output: {exc}", 1
        else:
            try:
                child = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    preexec_fn=os.setpgrp,
                )
            except OSError as exc:
                outcome, reason, exit_code = "failed", f"cannot start: {exc}", 127
            else:
                with locked(scheduler) as queue:
                    job = queue["jobs"].get(job_id)
                    if job is not None:  # so that a lost element's processes can be stopped
                        job["elements"][str(index)]["child_pid"] = child.pid

                def on_term(signum: int, frame: Any) -> None:
                    _stop_group(child)
                    os._exit(128 + signum)

                signal.signal(signal.SIGTERM, on_term)
                try:
                    rc = child.wait(timeout=walltime)
                except subprocess.TimeoutExpired:
                    rc = _stop_group(child)
                    outcome, reason = "timeout", "walltime"
                else:
                    outcome = "done" if rc == 0 else "failed"
                if rc < 0:
                    sig, exit_code = -rc, 128 - rc
                else:
                    exit_code = rc
    with locked(scheduler) as queue:
        job = queue["jobs"].get(job_id)
        el = job["elements"].get(str(index)) if job else None
        if el is not None and el["state"] == "running":
            el.update(
                state=outcome, exit_code=exit_code, signal=sig, end=time.time(), reason=reason
            )
        tick(scheduler, queue)
    return 0


def _stop_group(child: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the child's process group, SIGKILL after the grace time; its return code."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            rc = child.wait(timeout=kill_wait_s())
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        rc = child.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)  # what is left of the group
    return rc


def kill_wait_s() -> float:
    """Seconds between SIGTERM and SIGKILL when cancelling."""
    return float(os.environ.get("ELSEWHERE_FAKE_KILL_WAIT_S", "2"))


def cancel_element(el: dict[str, Any], reason: str = "cancelled") -> bool:
    """Cancel one element (caller holds the lock). False when it had already ended."""
    if el["state"] in TERMINAL:
        return False
    if el["state"] == "running" and el["pid"]:
        _kill_group(el["pid"])
        el["signal"] = signal.SIGTERM
        el["exit_code"] = 128 + signal.SIGTERM
    el.update(state="cancelled", end=time.time(), reason=reason)
    return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    # The runner passes SIGTERM on to the element's own group and escalates;
    # should the runner hang, a detached helper kills its group later (we hold
    # the lock and do not wait here).
    subprocess.Popen(
        ["/bin/sh", "-c", f"sleep {3 * kill_wait_s() + 1}; kill -KILL -{pgid} 2>/dev/null"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def visible(el: dict[str, Any], now: float | None = None) -> bool:
    """Whether an element still shows in the queue view."""
    if el["state"] not in TERMINAL:
        return True
    return (now or time.time()) - (el["end"] or 0) <= keep_s()


def next_id(queue: dict[str, Any]) -> int:
    """A new job number."""
    number = int(queue["next_id"])
    queue["next_id"] = number + 1
    return number


def expand_idset(text: str) -> list[int]:
    """``"0-4"``, ``"1,3,5-7"``, ``"1-10:2"`` -> the indices."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        rng, _, step = part.partition(":")
        first, _, last = rng.partition("-")
        out.extend(range(int(first), int(last or first) + 1, int(step or 1)))
    return out


def main(argv: list[str]) -> int:
    """``fakecore.py run SCHED JOB INDEX`` (the runner)."""
    if len(argv) == 4 and argv[0] == "run":
        return run_element(argv[1], argv[2], int(argv[3]))
    print("usage: fakecore.py run SCHEDULER JOB INDEX", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
