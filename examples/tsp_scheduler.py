"""A user scheduler on elsewhere's generic plugin interface: Task Spooler ("tsp").

Task Spooler (Debian package ``task-spooler``, command ``tsp``; ``ts`` on some systems) is a
batch queue for one machine: a server per socket (``TS_SOCKET``) runs queued commands, at most
``tsp -S`` slots' worth at once, each command taking ``tsp -N`` slots. This plugin puts a job's
tasks into that queue: it splits ``job.tasks`` into chunks, one tsp job per chunk, each running
``python -m elsewhere.worker --job DIR --tasks SPEC``. The worker reads the job folder, runs its
tasks and writes their results back, which is all the client ever reads.

What the plugin must find again later (from a new Python process too) is kept with
``set_job_cluster_data``: the socket, and for every tsp job its id, label and tasks. A tsp job
that ended (finished, killed, removed from the queue) while some of the tasks it holds have no
result lost them: ``poll`` reports them with tsp's exit status. An open job (``ew.Executor``)
gets workers without ``--tasks``, which claim its tasks from its queue as they are submitted;
``poll`` lets the library write off a claiming worker that ended (``job.reap_workers()``) and
queues a replacement while the job is open. ``cancel_job``/``cancel_task``
remove queued tsp jobs (``tsp -r``) and kill running ones (``tsp -k``); ``delete_job`` also
drops the job's entries from tsp's list and removes tsp's output files.

The library does the rest, whatever started the worker: a task shows ``running`` while its
worker runs it, a cancelled task is marked in the job folder before ``cancel_task`` is called,
and ``job.retry()`` and ``retries=`` call ``submit_independent`` again with exactly the tasks to
rerun (``job.tasks``), which become tsp jobs of their own.

Use it by module path, or register it under the entry-point group ``elsewhere.schedulers`` of
your package (``tsp = "mypkg.tsp_scheduler:TspCluster"``) and say ``"tsp"``::

    import elsewhere as ew

    cluster = ew.batch("examples.tsp_scheduler:TspCluster", slots=2)
    print(ew.map(abs, [-1, -2, -3], on=cluster))

or ``python examples/tsp_scheduler.py`` for a small demonstration (it uses the tsp server of
``TS_SOCKET``, or the user's default one).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import elsewhere as ew

ACTIVE = ("queued", "allocating", "running")  # tsp -l states of a job that has not ended


class TspCluster(ew.Cluster):
    """Tasks as Task Spooler jobs on this machine.

    Args:
        slots: the server's number of slots, set with ``tsp -S`` before each submission;
            default: leave the server's setting as it is.
        tasks_per_job: how many tasks one tsp job runs; default: a job's tasks are split
            into as many tsp jobs as the server runs at once (slots // slots per tsp job).
        socket: the tsp server's socket (``TS_SOCKET``); default: ``TS_SOCKET`` of the
            submitting process, else tsp's own default. Kept with each job, so a job
            recovered elsewhere talks to the same server.
        command: the task spooler command; default: ``tsp``, else ``ts`` if that is the
            task spooler.
        python: the interpreter the workers run (default: this one).
        Other arguments as for every cluster (cores_per_task, storage, additional_properties).
    """

    kind = "tsp"
    #: What the plugin reads of ``additional_properties`` (anything else is refused).
    properties = {
        "job_slots": ew.Property(int, 0, "slots each tsp job takes (tsp -N); 0: cores_per_task"),
        "label": ew.Property(str, "ew", "prefix of the tsp job labels (tsp -L), shown by tsp -l"),
    }
    #: Open jobs that grow while they run (ew.Executor): workers claim their tasks.
    capabilities = frozenset({"stream"})

    def __init__(self, *, slots: int | None = None, tasks_per_job: int | None = None,
                 socket: str | None = None, command: str | None = None, python: str | None = None,
                 **common: Any) -> None:
        super().__init__(**common)
        for name, value in (("slots", slots), ("tasks_per_job", tasks_per_job)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ew.ConfigError(f"{name} must be a positive integer, not {value!r}")
        if self.additional_properties["job_slots"] < 0:
            raise ew.ConfigError("additional property job_slots must be 0 or more")
        self.slots, self.tasks_per_job = slots, tasks_per_job
        self.socket = str(socket) if socket else None
        self.command = command or _find_command()
        self.python = python or sys.executable

    # -- description: what rebuilds this cluster in another process -----------------
    def settings(self) -> dict[str, Any]:
        return {"slots": self.slots, "tasks_per_job": self.tasks_per_job, "socket": self.socket,
                "command": self.command, "python": self.python, **super().settings()}

    # -- plugin operations ------------------------------------------------------
    def post_construct(self) -> None:
        """Check the task spooler command and the interpreter, and that the server answers."""
        if shutil.which(self.command) is None:
            raise ew.ConfigError(f"the tsp cluster needs the task spooler command {self.command!r} on PATH "
                                 "(Debian: apt-get install task-spooler)")
        if not os.access(self.python, os.X_OK):
            raise ew.ConfigError(f"python={self.python!r} is not an executable interpreter")
        self._tsp(self._socket(), "-S", check=True)

    def max_workers(self, n_tasks: int) -> int:
        """Workers of an open job (ew.Executor) at once: the server's slots."""
        return self.slots or max(1, (os.cpu_count() or 1) // self.cores_per_task)

    def submit_independent(self, job: ew.JobHandle) -> None:
        """One tsp job per chunk of ``job.tasks`` (all of them, or the ones to rerun); for an
        open job (ew.Executor), as many workers as the server runs at once, which claim the
        job's tasks from its queue as they come."""
        data = self.get_job_cluster_data(job)
        sock = data.setdefault("socket", self._socket())
        if self.slots:
            self._tsp(sock, "-S", str(self.slots), check=True)
        at_once = self._at_once(sock)
        tasks = list(job.tasks)
        if tasks:
            per = self.tasks_per_job or -(-len(tasks) // at_once)
            parts = [tasks[k : k + per] for k in range(0, len(tasks), per)]
        else:  # an open job: its tasks come later
            parts = [[] for _ in range(at_once)] if job.stream else []
        self._queue(job, data, parts)

    def _at_once(self, sock: str | None) -> int:
        """How many of this cluster's tsp jobs the server runs at once."""
        job_slots = self.additional_properties["job_slots"] or self.cores_per_task
        server_slots = int(self._tsp(sock, "-S", check=True).stdout.split()[0])
        if job_slots > server_slots:  # tsp would keep such a job queued for ever
            raise ew.ConfigError(f"a tsp job would take {job_slots} slots (tsp -N) but the tsp server "
                                 f"has {server_slots}: give slots={job_slots} or more")
        return server_slots // job_slots

    def _queue(self, job: ew.JobHandle, data: dict[str, Any], parts: list[list[int]]) -> None:
        """A tsp job per part: a worker for those tasks, or one that claims ([])."""
        sock = data["socket"]
        job_slots = self.additional_properties["job_slots"] or self.cores_per_task
        logs = job.path / "logs"
        logs.mkdir(mode=0o700, exist_ok=True)
        entries = data.setdefault("tsp_jobs", [])
        before = len(entries)
        for part in parts:
            n = len(entries)
            label = f"{self.additional_properties['label']}-{job.id}-{n}"
            log = logs / f"tsp-{n}.log"
            worker = [self.python, "-m", "elsewhere.worker", "--job", str(job.path)]
            if part:
                worker += ["--tasks", ",".join(map(str, part))]
            # tsp keeps a command's output in a file of its own under TMPDIR; the worker's
            # goes to the job folder instead, next to the logs the worker writes itself.
            out = self._tsp(sock, "-L", label, "-N", str(job_slots), "sh", "-c", 'exec "$@" >>"$0" 2>&1',
                            str(log), *worker)
            tsp_id = out.stdout.strip()
            if out.returncode or not tsp_id.isdigit():
                self._stop(data, entries[before:])  # all or nothing: take back what this call queued
                raise ew.SchedulerError(f"tsp did not queue a worker for tasks {part or 'of the queue'}",
                                        command=out.args, returncode=out.returncode,
                                        stderr=out.stderr + out.stdout)
            entries.append({"id": int(tsp_id), "label": label, "tasks": part, "log": str(log)})
        self.set_job_cluster_data(job, data)

    def job_state(self, job: ew.JobHandle, snapshot: ew.Snapshot) -> ew.Snapshot:
        """Tasks waiting in tsp's queue say so, in the snapshot's ``reasons`` (``job.check().reasons``)."""
        data = self.get_job_cluster_data(job)
        if snapshot.cancelled or not data.get("tsp_jobs"):
            return snapshot
        states = self._states(data)
        reasons = dict(snapshot.reasons or {})
        for entry in _current(data):
            state = states.get(entry["id"])
            if state in ("queued", "allocating"):
                for t in entry["tasks"]:
                    if t not in snapshot.final and t not in snapshot.running:
                        reasons.setdefault(t, f"tsp: {state} (tsp job {entry['id']})")
        return snapshot.but(reasons=reasons) if reasons != (snapshot.reasons or {}) else snapshot

    def poll(self, job: ew.JobHandle) -> None:
        """A tsp job that ended while tasks it holds have no result lost them. An open job's
        workers claim their tasks from its queue: a claiming worker that ended is written
        off by the library (``reap_workers``: its running task lost, the rest of its claim
        back in the queue) and replaced while the job is open."""
        data = self.get_job_cluster_data(job)
        if not data.get("tsp_jobs"):
            return
        states = self._states(data)  # ask tsp first, then read the results: no race
        if job.stream:
            job.reap_workers()
            claiming = sum(1 for e in data["tsp_jobs"] if not e["tasks"] and states.get(e["id"]) in ACTIVE)
            missing = self._at_once(data["socket"]) - claiming
            if missing > 0 and not job.state.done and not job.snapshot().cancelled:
                self._queue(job, data, [[] for _ in range(missing)])
        final = job.refresh()
        cancelled = job.snapshot().cancelled_tasks
        lost: dict[int, str] = {}
        for entry in _current(data):
            open_tasks = [t for t in entry["tasks"] if t not in final and t not in cancelled]
            state = states.get(entry["id"])
            if open_tasks and state not in ACTIVE:
                if state is None:
                    how = "is gone from tsp's list (removed, or its server ended)"
                else:
                    how = f"ended ({self._exit_status(data['socket'], entry['id'])})"
                why = f"tsp job {entry['id']} ({entry['label']}) {how} without a result; see {entry['log']}"
                lost.update(dict.fromkeys(open_tasks, why))
        if lost:
            self.report_lost(job, lost)

    def cancel_job(self, job: ew.JobHandle) -> None:
        """Remove the job's queued tsp jobs, kill its running ones."""
        data = self.get_job_cluster_data(job)
        if data.get("tsp_jobs"):
            self._stop(data, data["tsp_jobs"])

    def cancel_task(self, job: ew.JobHandle, index: int) -> None:
        """Stop the tsp job holding task ``index`` when it has nothing else left to run; a
        worker with other tasks to run skips it if it has not reached it."""
        data = self.get_job_cluster_data(job)
        final = job.refresh()
        cancelled = set(job.snapshot().cancelled_tasks) | {index}
        owners = [e for e in _current(data) if index in e["tasks"]]
        if owners and all(t in final or t in cancelled for t in owners[0]["tasks"]):
            self._stop(data, owners)

    def delete_job(self, job: ew.JobHandle) -> None:
        """Stop what still runs, then drop the job's entries from tsp's list with their
        output files (tsp keeps them under TMPDIR)."""
        data = self.get_job_cluster_data(job)
        if not data.get("tsp_jobs"):
            return
        self._stop(data, data["tsp_jobs"])
        sock = data["socket"]
        listed = self._states(data)
        for entry in data["tsp_jobs"]:
            if entry["id"] in listed:
                out = self._tsp(sock, "-o", str(entry["id"])).stdout.strip()
                self._tsp(sock, "-r", str(entry["id"]))
                if out.startswith("/") and os.path.basename(out).startswith("ts-out."):
                    Path(out).unlink(missing_ok=True)

    # -- talking to tsp ---------------------------------------------------------
    def _socket(self) -> str | None:
        return self.socket or os.environ.get("TS_SOCKET") or None

    def _tsp(self, sock: str | None, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        if sock:
            env["TS_SOCKET"] = sock
        argv = [self.command, *args]
        try:
            out = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ew.SchedulerError(f"{self.command} did not answer", command=argv, stderr=str(exc)) from exc
        if check and out.returncode:
            raise ew.SchedulerError(f"{self.command} failed", command=argv, returncode=out.returncode,
                                    stderr=out.stderr + out.stdout)
        return out

    def _states(self, data: dict[str, Any]) -> dict[int, str]:
        """``{tsp id: state}`` of the job's tsp jobs that tsp still lists, from one ``tsp -l``.
        An id counts only with its label: a new server numbers its jobs from 0 again."""
        out = self._tsp(data["socket"], "-l", check=True)
        labels = {e["id"]: f"[{e['label']}]" for e in data.get("tsp_jobs", [])}
        states = {}
        for line in out.stdout.splitlines()[1:]:
            fields = line.split(None, 2)
            if len(fields) == 3 and fields[0].isdigit():
                tsp_id = int(fields[0])
                if tsp_id in labels and labels[tsp_id] in fields[2]:
                    states[tsp_id] = fields[1]
        return states

    def _exit_status(self, sock: str | None, tsp_id: int) -> str:
        for line in self._tsp(sock, "-i", str(tsp_id)).stdout.splitlines():
            if line.startswith("Exit status:"):
                return line.partition(":")[2].strip()
        return "exit status unknown"

    def _stop(self, data: dict[str, Any], entries: list[dict[str, Any]]) -> None:
        """Queued: remove (``tsp -r``); running: SIGTERM to its process group (``tsp -k``),
        then SIGKILL if it has not ended within 3 seconds; returns once tsp lists them ended
        (or 10 more seconds have gone: a server too slow to reap is not waited for longer)."""
        sock = data["socket"]
        wanted = {e["id"] for e in entries}
        states = {i: s for i, s in self._states(data).items() if i in wanted and s in ACTIVE}
        # the queued ones first: a slot freed by a kill would start the next one
        kill = [i for i, s in states.items() if s == "running" or self._tsp(sock, "-r", str(i)).returncode]
        for tsp_id in kill:  # running, or started since
            self._tsp(sock, "-k", str(tsp_id))
        running = self._active_after(data, wanted, 3)
        for tsp_id in running:
            pid = self._tsp(sock, "-p", str(tsp_id)).stdout.strip()
            if pid.isdigit():
                try:
                    os.killpg(int(pid), signal.SIGKILL)  # tsp -k's process group, without mercy
                except (ProcessLookupError, PermissionError):
                    pass
        if running:  # until tsp has reaped them, its list still says running
            self._active_after(data, wanted, 10)

    def _active_after(self, data: dict[str, Any], wanted: set[int], seconds: float) -> list[int]:
        """The ``wanted`` tsp jobs still active once they all ended or ``seconds`` went by."""
        deadline = time.monotonic() + seconds
        while True:
            active = [i for i, s in self._states(data).items() if i in wanted and s in ACTIVE]
            if not active or time.monotonic() >= deadline:
                return active
            time.sleep(0.05)


def _current(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The tsp jobs as holders of their tasks' current attempts: a task started again is
    held by its newest tsp job only (the entry keeps only the tasks it still holds)."""
    entries = data.get("tsp_jobs", [])
    owner = {t: k for k, e in enumerate(entries) for t in e["tasks"]}
    return [{**e, "tasks": [t for t in e["tasks"] if owner[t] == k]} for k, e in enumerate(entries)]


def _find_command() -> str:
    if shutil.which("tsp"):
        return "tsp"
    if shutil.which("ts"):  # moreutils has a "ts" too (timestamps): only the spooler knows -V
        out = subprocess.run(["ts", "-V"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if "task spooler" in (out.stdout + out.stderr).lower():
            return "ts"
    return "tsp"


def _demo() -> None:
    def slow_square(x: int) -> int:
        time.sleep(0.2)
        return x * x

    cluster = TspCluster(slots=2)
    job = ew.submit(slow_square, range(6), on=cluster, name="tsp-demo")
    print(job.check())
    job.wait(timeout=60)
    print(job.results(), "from tsp jobs", [e["id"] for e in cluster.get_job_cluster_data(job.handle)["tsp_jobs"]])
    job.purge()


if __name__ == "__main__":
    _demo()
