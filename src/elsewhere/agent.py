"""``python -m elsewhere.agent``: what a client asks of a host that holds a job copy.

The ssh backend keeps a copy of the job folder on every node; the workers
there claim tasks from that copy's queue. One ssh command per node and poll
runs this agent, which does on the node what the local backend does here:

    start  JOB --workers N [--tasks a:b --retries R]
                                   (this node's share of the tasks) start N
                                   detached workers for the job
    poll   JOB --workers N         write off vanished workers (their running
                                   task "lost" or retried), start replacements
                                   while work remains; print the queue state
    add    JOB --tasks 3,7,9       put tasks (moved from another node) in the queue
    cancel JOB                     stop the job's workers; nothing new starts
    info   [DIR]                   python, elsewhere, cores, load, memory, and
                                   whether DIR is writable

Every answer is one JSON line on stdout, after a marker, so login banners do
not confuse the client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .store import JobStore, lock_is_free, reap

MARKER = "ELSEWHERE-AGENT "


def _live(q: dict[str, Any]) -> int:
    return sum(1 for m in q["members"].values() if m.get("state") in ("active", "waiting"))


def _spawn(job: Path, count: int) -> list[int]:
    env = dict(os.environ)
    pkg = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    pids = []
    (job / "logs").mkdir(exist_ok=True)
    for _ in range(count):
        log = os.open(job / "logs" / "workers-start.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            p = subprocess.Popen([sys.executable, "-m", "elsewhere.worker", "--job", str(job)],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                 start_new_session=True, close_fds=True, cwd=str(job))
        finally:
            os.close(log)
        pids.append(p.pid)
    return pids


def start(job: Path, workers: int, tasks: str = "", retries: int = 0) -> dict[str, Any]:
    """Start workers; with ``tasks`` ("a:b"), first make this node's queue hold those tasks."""
    from .store import new_queue

    store = JobStore(job)
    with store.locked_queue() as q:
        if tasks:
            a, b = (int(x) for x in tasks.split(":"))
            q.clear()
            q.update(new_queue(b, retries=retries, max_workers=workers))
            q["next"] = a
        q["submitted"] = True
        q["max_workers"] = workers
    (job / "files").mkdir(exist_ok=True)
    return {"pids": _spawn(job, workers)}


def poll(job: Path, workers: int) -> dict[str, Any]:
    store = JobStore(job)
    with store.locked_queue() as q:
        gone = reap(store, q) if q.get("submitted") and not q.get("cancelled") else []
        live = _live(q)
        work = len(q["retry"]) + max(0, q["n"] - q["next"])
        want = 0 if q.get("cancelled") else max(0, min(workers, work) - live)
        if want:
            q["max_workers"] = max(q.get("max_workers", 1), live + want)
        state = {k: q.get(k) for k in ("n", "next", "retry", "cancelled", "lost_by", "lost_reason")}
        state["members"] = {w: {"state": m.get("state"), "pid": m.get("pid"), "host": m.get("host")}
                            for w, m in q["members"].items()}
    pids = _spawn(job, want) if want else []
    return {"gone": gone, "started": pids, "live": live, "work": work, "queue": state}


def add(job: Path, tasks: list[int]) -> dict[str, Any]:
    store = JobStore(job)
    with store.locked_queue() as q:
        have = set(q["retry"])
        q["retry"] += [t for t in tasks if t not in have]
        for t in tasks:
            q["attempts"][str(t)] = q["attempts"].get(str(t), 0) + 1
    return poll(job, int(store.queue().get("max_workers", 1)))


def cancel(job: Path) -> dict[str, Any]:
    store = JobStore(job)
    killed = 0
    with store.locked_queue() as q:
        q["cancelled"] = True
        q["retry"] = []
        for m in q["members"].values():
            if m.get("state") in ("active", "waiting") and not lock_is_free(m.get("lock", "")):
                try:
                    os.killpg(int(m["pid"]), signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, PermissionError):
                    pass
                m["state"] = "dead"
    return {"killed": killed}


def info(directory: str | None) -> dict[str, Any]:
    import platform

    from . import __version__

    out: dict[str, Any] = {
        "python_version": platform.python_version(), "executable": sys.executable,
        "elsewhere_version": __version__, "cpu_count": os.cpu_count(), "hostname": os.uname().nodename,
    }
    try:
        out["cpus_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        out["cpus_usable"] = os.cpu_count()
    try:
        out["load_average"] = list(os.getloadavg())
    except OSError:
        out["load_average"] = None
    if directory:
        d = Path(os.path.expanduser(directory))
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = d / f".probe-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
            out["writable"] = str(d.resolve())
        except OSError as exc:
            out["writable"] = None
            out["writable_error"] = str(exc)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m elsewhere.agent")
    p.add_argument("op", choices=["start", "poll", "add", "cancel", "info"])
    p.add_argument("job", nargs="?")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--tasks", default="")
    p.add_argument("--retries", type=int, default=0)
    a = p.parse_args(argv)
    if a.op == "info":
        out = info(a.job)
    else:
        if not a.job:
            p.error("give the job folder")
        job = Path(a.job)
        if not (job / "job.json").exists():
            print(MARKER + json.dumps({"error": f"no job folder at {job}"}))
            return 3
        if a.op == "start":
            out = start(job, a.workers, a.tasks, a.retries)
        elif a.op == "poll":
            out = poll(job, a.workers)
        elif a.op == "add":
            out = add(job, [int(t) for t in a.tasks.split(",") if t])
        else:
            out = cancel(job)
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    return 0


def parse_answer(text: str) -> dict[str, Any] | None:
    """The agent's JSON answer in ``text`` (after any login banner), or None."""
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            try:
                value = json.loads(line[len(MARKER):])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


if __name__ == "__main__":
    sys.exit(main())
