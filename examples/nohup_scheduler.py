"""A complete user scheduler on elsewhere's generic plugin interface: "nohup".

MATLAB's generic scheduler interface asks its users to write the plugin scripts
themselves (submit, job state, cancel, delete); this is the same in Python. The
"scheduler" here is the simplest there is: background processes on this machine,
started with ``nohup`` so they outlive the Python session that submitted them.

Each of the ``slots`` processes runs ``python -m elsewhere.worker --job DIR --tasks a:b``:
the worker reads the job folder, runs tasks a..b-1 one after another and writes their
results back into the folder, which is all the client ever reads. What the plugin must
find again later (from a new Python process too) is kept with ``set_job_cluster_data``:
the pid, start time and task range of every process.

Use it by module path, or register it under the entry-point group ``elsewhere.schedulers``
of your package (``nohup = "mypkg.nohup_scheduler:NohupCluster"``) and say ``"nohup"``::

    import elsewhere as ew
    from elsewhere.backends import cluster_class

    NohupCluster = cluster_class("examples.nohup_scheduler:NohupCluster")
    print(ew.map(abs, [-1, -2, -3], on=NohupCluster(slots=2)))

or ``python examples/nohup_scheduler.py`` for a small demonstration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

import elsewhere as ew
from elsewhere.folder.records import Kind, make_record
from elsewhere.util.errors import ConfigError, SchedulerError


class NohupCluster(ew.Cluster):
    """Tasks in ``nohup``-started worker processes on this machine.

    Args:
        slots: how many processes a job gets (its tasks are split between them);
            default: the number of cores.
        python: the interpreter the workers run (default: this one).
        Other arguments as for every cluster (cores_per_task, storage, additional_properties).
    """

    kind = "nohup"

    def __init__(
        self, *, slots: int | None = None, python: str | None = None, **common: Any
    ) -> None:
        super().__init__(**common)
        if slots is not None and (not isinstance(slots, int) or slots < 1):
            raise ConfigError(f"slots must be a positive integer, not {slots!r}")
        self.slots = slots or max(1, (os.cpu_count() or 1) // self.cores_per_task)
        self.python = python or sys.executable
        self.post_construct()  # the base class leaves this call to the plugin

    # -- description: what rebuilds this cluster in another process -----------------
    def settings(self) -> dict[str, Any]:
        return {"slots": self.slots, "python": self.python, **super().settings()}

    def describe(self) -> dict[str, Any]:
        # A job recovered in a new process rebuilds its cluster from this. "nohup" is only
        # known there if an entry point registers it; "module:Class" is always found.
        return {**super().describe(), "kind": f"{type(self).__module__}:{type(self).__qualname__}"}

    # -- plugin operations ------------------------------------------------------
    def post_construct(self) -> None:
        """Check what the plugin needs: the nohup command and the interpreter."""
        import shutil

        if shutil.which("nohup") is None:
            raise ConfigError("the nohup cluster needs the nohup command (coreutils) on PATH")
        if not os.access(self.python, os.X_OK):
            raise ConfigError(f"python={self.python!r} is not an executable interpreter")

    def submit_independent(self, job: ew.Job) -> None:
        """Split the tasks into ``slots`` ranges; one detached process per range."""
        n = job.n_tasks
        per = -(-n // self.slots) if n else 1
        with job.store.locked_queue() as q:
            q["submitted"] = True
            q["next"] = n  # tasks are handed out by range, never claimed
        logs = job.path / "logs"
        logs.mkdir(mode=0o700, exist_ok=True)
        processes = []
        for first in range(0, n, per):
            last = min(n, first + per)
            argv = [
                "nohup",
                self.python,
                "-m",
                "elsewhere.worker",
                "--job",
                str(job.path),
                "--tasks",
                f"{first}:{last}",
            ]
            with open(logs / f"nohup-{first}.log", "ab") as out:
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        start_new_session=True,
                        cwd=os.getcwd(),
                    )
                except OSError as exc:
                    raise SchedulerError(
                        f"cannot start a worker for tasks {first}..{last - 1}",
                        command=argv,
                        stderr=str(exc),
                    ) from exc
            processes.append(
                {
                    "pid": proc.pid,
                    "started": _start_time(proc.pid),
                    "tasks": [first, last],
                    "log": out.name,
                }
            )
        self.set_job_cluster_data(job, {"processes": processes})

    def job_state(self, job: ew.Job, snapshot: Any) -> Any:
        """A process that is gone while some of its tasks have no result lost them."""
        lost: dict[int, str] = {}
        for proc in self.get_job_cluster_data(job).get("processes", []):
            first, last = proc["tasks"]
            open_tasks = [t for t in range(first, last) if t not in snapshot.final]
            if open_tasks and not _alive(proc):
                why = (
                    f"nohup worker (pid {proc['pid']}) exited without a result: "
                    f"killed, or see {proc['log']}"
                )
                lost.update(dict.fromkeys(open_tasks, why))
        if lost:
            _write_off(job, lost)
            snapshot.note = f"{len(lost)} task(s) lost with their process"
        return snapshot

    def cancel_job(self, job: ew.Job) -> None:
        """Mark the job cancelled, then stop its processes (SIGTERM, then SIGKILL)."""
        with job.store.locked_queue() as q:
            q["cancelled"] = True
        procs = [p for p in self.get_job_cluster_data(job).get("processes", []) if _alive(p)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                try:
                    os.killpg(p["pid"], sig)  # its own session: the worker and its children
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and any(_alive(p) for p in procs):
                time.sleep(0.05)

    def cancel_task(self, job: ew.Job, index: int) -> None:
        """A task not yet started is skipped (one that runs finishes: its process runs others too)."""
        with job.store.locked_queue() as q:
            q["cancelled_tasks"] = sorted(set(q.get("cancelled_tasks", [])) | {index})

    def delete_job(self, job: ew.Job) -> None:
        """Nothing lives outside the job folder but the processes: stop them."""
        if any(_alive(p) for p in self.get_job_cluster_data(job).get("processes", [])):
            self.cancel_job(job)


def _start_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return 0.0


def _alive(proc: dict[str, Any]) -> bool:
    """The recorded process still runs (the same one: pids are reused)."""
    try:
        p = psutil.Process(proc["pid"])
        return abs(p.create_time() - proc["started"]) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _write_off(job: ew.Job, reasons: dict[int, str]) -> None:
    """Fail tasks as "lost" with a reason, once each (what the built-in backends do)."""
    with job.store.locked_queue() as q:
        if q.get("cancelled"):
            return
        known = q.setdefault("lost_reason", {})
        attempts = q.get("attempts", {})
        recs = []
        for task, why in reasons.items():
            if str(task) in known:
                continue
            known[str(task)] = why
            recs.append(
                make_record(Kind.LOST, task, int(attempts.get(str(task), 0)), t_end=time.time())
            )
        if recs:
            job.store.append_control(recs)


def _demo() -> None:
    def slow_square(x: int) -> int:
        time.sleep(0.2)
        return x * x

    cluster = NohupCluster(slots=2)
    job = ew.submit(slow_square, range(6), on=cluster, name="nohup-demo")
    print(job.check())
    job.wait(timeout=60)
    print(
        job.results(),
        "from processes",
        [p["pid"] for p in cluster.get_job_cluster_data(job)["processes"]],
    )


if __name__ == "__main__":
    _demo()
