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

The library does the rest, whatever started the worker: a task shows ``running`` while its
worker runs it, a cancelled task is marked in the job folder before ``cancel_task`` is called,
``job.retry()`` and ``retries=`` call ``submit_independent`` again with exactly the tasks to
rerun (``job.tasks``), and a worker of this machine that dies mid-task is reported lost.

Use it by module path, or register it under the entry-point group ``elsewhere.schedulers``
of your package (``nohup = "mypkg.nohup_scheduler:NohupCluster"``) and say ``"nohup"``::

    import elsewhere as ew

    cluster = ew.batch("examples.nohup_scheduler:NohupCluster", slots=2)
    print(ew.map(abs, [-1, -2, -3], on=cluster))

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


class NohupCluster(ew.Cluster):
    """Tasks in ``nohup``-started worker processes on this machine.

    Args:
        slots: how many processes a job gets (its tasks are split between them);
            default: the number of cores.
        python: the interpreter the workers run (default: this one).
        Other arguments as for every cluster (cores_per_task, storage, additional_properties).
    """

    kind = "nohup"
    #: What the plugin reads of ``additional_properties`` (anything else is refused).
    properties = {"nice": ew.Property(int, 0, "the niceness of the worker processes (nice -n)")}
    #: It also runs open jobs that grow while they run (ew.Executor).
    capabilities = frozenset({"stream"})

    def __init__(self, *, slots: int | None = None, python: str | None = None, **common: Any) -> None:
        super().__init__(**common)
        if slots is not None and (not isinstance(slots, int) or slots < 1):
            raise ew.ConfigError(f"slots must be a positive integer, not {slots!r}")
        self.slots = slots or max(1, (os.cpu_count() or 1) // self.cores_per_task)
        self.python = python or sys.executable

    # -- description: what rebuilds this cluster in another process -----------------
    def settings(self) -> dict[str, Any]:
        return {"slots": self.slots, "python": self.python, **super().settings()}

    # -- plugin operations ------------------------------------------------------
    def post_construct(self) -> None:
        """Check what the plugin needs: the nohup command and the interpreter (the library
        calls this when the cluster is first used, not when it only reads a job)."""
        import shutil

        if shutil.which("nohup") is None:
            raise ew.ConfigError("the nohup cluster needs the nohup command (coreutils) on PATH")
        if not os.access(self.python, os.X_OK):
            raise ew.ConfigError(f"python={self.python!r} is not an executable interpreter")

    def max_workers(self, n_tasks: int) -> int:
        return self.slots

    def submit_independent(self, job: ew.JobHandle) -> None:
        """Split ``job.tasks`` (all of them, or the ones to rerun) into ``slots`` parts; one
        detached process per part. An open job (``ew.Executor``) gets ``slots`` processes
        that claim its tasks from the job's queue as they come."""
        tasks = job.tasks
        per = -(-len(tasks) // self.slots) if tasks else 1
        parts = [tasks[k : k + per] for k in range(0, len(tasks), per)]
        if job.stream and not tasks:
            parts = [[] for _ in range(self.slots)]  # no --tasks: they claim
        self._start(job, parts)

    def _start(self, job: ew.JobHandle, parts: list[list[int]]) -> None:
        """One detached worker process per part (an empty part: a worker that claims)."""
        logs = job.path / "logs"
        logs.mkdir(mode=0o700, exist_ok=True)
        data = self.get_job_cluster_data(job)
        processes = data.setdefault("processes", [])
        for part in parts:
            spec = ",".join(map(str, part))
            argv = ["nohup", "nice", "-n", str(self.additional_properties["nice"]), self.python, "-m",
                    "elsewhere.worker", "--job", str(job.path)] + (["--tasks", spec] if part else [])
            log = logs / f"nohup-{len(processes)}.log"
            with open(log, "ab") as out:
                try:
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                            start_new_session=True, cwd=os.getcwd())
                except OSError as exc:
                    raise ew.SchedulerError(f"cannot start a worker for tasks {spec}", command=argv,
                                            stderr=str(exc)) from exc
            processes.append({"pid": proc.pid, "started": _start_time(proc.pid), "tasks": part, "log": str(log)})
        self.set_job_cluster_data(job, data)

    def poll(self, job: ew.JobHandle) -> None:
        """A process that is gone while some of its tasks have no result lost them."""
        if job.stream:  # its processes claim tasks: the queue knows what each held
            job.reap_workers()
            procs = self.get_job_cluster_data(job).get("processes", [])
            alive = sum(1 for p in procs if not p["tasks"] and _alive(p))
            if alive < self.slots and not job.state.done:
                self._start(job, [[] for _ in range(self.slots - alive)])  # replacements
        final = job.refresh()
        lost: dict[int, str] = {}
        procs = self.get_job_cluster_data(job).get("processes", [])
        owner = {t: k for k, p in enumerate(procs) for t in p["tasks"]}  # a rerun's process holds it now
        for k, proc in enumerate(procs):
            open_tasks = [t for t in proc["tasks"] if t not in final and owner[t] == k]
            if open_tasks and not _alive(proc):
                why = f"nohup worker (pid {proc['pid']}) exited without a result: killed, or see {proc['log']}"
                lost.update(dict.fromkeys(open_tasks, why))
        if lost:
            self.report_lost(job, lost)

    def cancel_job(self, job: ew.JobHandle) -> None:
        """Stop the job's processes (SIGTERM, then SIGKILL)."""
        _stop([p for p in self.get_job_cluster_data(job).get("processes", []) if _alive(p)])

    def cancel_task(self, job: ew.JobHandle, index: int) -> None:
        """Stop the process running task ``index`` when it has nothing else left to run; a
        process with other tasks to do skips it if it has not reached it."""
        final = job.refresh()
        cancelled = job.snapshot().cancelled_tasks
        for p in self.get_job_cluster_data(job).get("processes", []):
            rest = [t for t in p["tasks"] if t != index]
            if index in p["tasks"] and _alive(p) and all(t in final or t in cancelled for t in rest):
                _stop([p])

    def delete_job(self, job: ew.JobHandle) -> None:
        """Nothing lives outside the job folder but the processes: stop them."""
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


def _stop(procs: list[dict[str, Any]]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                os.killpg(p["pid"], sig)  # its own session: the worker and its children
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(_alive(p) for p in procs):
            time.sleep(0.05)


def _demo() -> None:
    def slow_square(x: int) -> int:
        time.sleep(0.2)
        return x * x

    cluster = NohupCluster(slots=2)
    job = ew.submit(slow_square, range(6), on=cluster, name="nohup-demo")
    print(job.check())
    job.wait(timeout=60)
    print(job.results(), "from processes", [p["pid"] for p in cluster.get_job_cluster_data(job.handle)["processes"]])
    job.purge()


if __name__ == "__main__":
    _demo()
