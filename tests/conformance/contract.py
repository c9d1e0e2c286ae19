"""What the conformance tests share: a backend as a recipe, waiting, and a task ended from outside.

A :class:`Backend` is how a user makes one kind of cluster (``ew.slurm(partition="debug")``):
called, it makes the cluster in this process; :meth:`Backend.source` is the same call as
Python source, for the processes a test starts (a job submitted in one process and
recovered in another). ``conftest.py`` makes one per backend; the tests never name one.

Imported by name (``tests/`` is on ``sys.path``): ``from conformance.contract import ...``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import elsewhere as ew
from elsewhere.backends.batch import BatchCluster


@dataclass
class Backend:
    """One kind of cluster, as a user makes it: ``ew.<function>(*args, **kwargs)``.

    ``remote``: where the backend keeps copies of a job on its node (ssh's remote storage),
    for the check that a purge leaves nothing there; None when it keeps none.
    """

    name: str
    function: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    remote: Path | None = None
    made: list[ew.Cluster] = field(default_factory=list)

    def __call__(self) -> ew.Cluster:
        """A new cluster object of this kind (``post_construct`` has run)."""
        cluster = getattr(ew, self.function)(*self.args, **self.kwargs)
        self.made.append(cluster)
        return cluster

    def source(self) -> str:
        """The same call as Python source (``ew`` imported), for another process."""
        words = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"ew.{self.function}({', '.join(words)})"

    def __repr__(self) -> str:
        return f"<backend {self.name}: {self.source()}>"

    def leftovers(self, job_id: str) -> list[Path]:
        """What remains of job ``job_id`` in the backend's own storage on its node."""
        if self.remote is None or not self.remote.exists():
            return []
        return [p for p in self.remote.rglob("*") if job_id in p.name]

    def cancel_unfinished(self) -> None:
        """Cancel every job of this test's home that has not ended (test teardown), with the
        cluster object that runs it where that matters (a peer job's controller lives in it)."""
        for row in ew.jobs(refresh=False):
            try:
                job = ew.recover(row["id"])
                if job.state.done:
                    continue
                for cluster in self.made:
                    runs_it = getattr(cluster, "controller", None)
                    if runs_it is not None and runs_it(job.handle) is not None:
                        job.cluster = cluster
                job.cancel()
            except Exception as exc:  # teardown: the next job must still be cancelled
                print(f"teardown: could not cancel job {row['name']!r}: {exc!r}")

    def close(self) -> None:
        """Close what the clusters made keep open (ssh sessions)."""
        for cluster in self.made:
            close = getattr(cluster, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    print(f"teardown: closing {cluster!r}: {exc!r}")


def wait_until(predicate: Callable[[], Any], timeout: float, what: Callable[[], Any] | str,
               step: float = 0.1) -> Any:  # fmt: skip
    """Poll ``predicate`` until it is true and return its value; after ``timeout`` seconds fail
    with ``what`` (a text, or a function giving the state to show, e.g. ``job.check``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting; now: {shown}")
        time.sleep(step)


def lacks(cluster: ew.Cluster, capability: str) -> bool:
    """Whether ``cluster``'s backend declares that it cannot do ``capability``.

    Only a capability that the library lists as optional (``elsewhere.backends.base.
    CAPABILITIES``) may be missing; every other operation is part of the common contract
    that every backend keeps. A backend without a ``capabilities`` attribute declares
    nothing, so it is held to everything.
    """
    declared = getattr(type(cluster), "capabilities", None)
    if declared is None:
        return False
    from elsewhere.backends import base

    optional = getattr(base, "CAPABILITIES", None)
    if optional is not None and capability not in optional:
        return False
    return capability not in declared


def running_worker(job: ew.Job, index: int) -> dict[str, Any]:
    """What the job folder says of the worker running task ``index`` (host, pid, ...), or
    {} while the task is not known to run."""
    task = job.tasks[index]
    if task.state is not ew.TaskState.RUNNING or not task.worker:
        return {}
    return dict(job.handle.store.worker_info(task.worker))


def element_of(cluster: BatchCluster, job: ew.Job, index: int) -> str:
    """The scheduler's id of the array element that holds task ``index`` (the newest one)."""
    for sub in reversed(cluster.get_job_cluster_data(job.handle).get("submissions", [])):
        chunks = json.loads((job.path / "submissions" / f"{sub['name']}.json").read_text())
        for k, chunk in enumerate(chunks):
            if not chunk:  # a packed element claims its tasks: which, only its worker knows
                continue
            tasks = chunk[1:] if chunk[0] == -1 else range(chunk[0], chunk[1])
            if index in tasks:
                return cluster.syntax.element_id(
                    sub["native_id"], k + cluster.syntax.array_index_base
                )
    raise AssertionError(f"no submission of job {job.name!r} is given task {index} (elements that claim "
                         "their tasks hold none of them in advance: give tasks_per_element=1)")


def recorded_worker(job: ew.Job, index: int, task_pid: int, timeout: float = 5.0) -> str:
    """Check that the job folder knows who runs task ``index``, which runs in process
    ``task_pid`` on this machine: the worker recorded for it (the running task's worker, its
    worker info) is that process or a parent of it (a peer worker runs each task in a child
    process). "" if so, else what is wrong. A record may come late or be completed later
    (results and worker files of remote nodes arrive by polling): waits up to ``timeout``
    seconds for a right one."""
    try:
        parents = [p.pid for p in psutil.Process(task_pid).parents()]
    except psutil.NoSuchProcess:
        parents = []
    here = socket.gethostname()
    deadline = time.monotonic() + timeout
    while True:
        info = running_worker(job, index)
        if info and info.get("host") == here and info.get("pid") in (task_pid, *parents):
            return ""
        if info and info.get("host") == here and info.get("peer_id") and not info.get("pid") and _under_peer_worker(parents):
            return ""  # a peer daemon is known to its controllers by its peer id and address, not by pid
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not info:
        return (
            f"task {index} runs in process {task_pid}, but the job folder shows no worker "
            f"running it (job {job.check()})"
        )
    return (
        f"task {index} runs in process {task_pid} on {here} (parents {parents}), but the job "
        f"folder names this worker for it: {info}"
    )


def end_running_task(job: ew.Job, index: int, task_pid: int) -> str:
    """End task ``index`` from outside while it runs, as a failure would; what was ended.

    On a batch scheduler its array element is cancelled with the scheduler's own command
    (as an administrator or a node failure would). Elsewhere the process running the task
    (``task_pid``, as the task wrote it) is killed with SIGKILL.
    """
    cluster = job.cluster
    if isinstance(cluster, BatchCluster):
        elem = element_of(cluster, job, index)
        argv = cluster.syntax.build_cancel([elem])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert cluster.syntax.cancel_ok(done.returncode, done.stderr, done.stdout), (argv, done)
        return elem
    os.kill(task_pid, signal.SIGKILL)
    return f"pid {task_pid}"


def gone(pid: int) -> bool:
    """Process ``pid`` has ended (a zombie waiting for its parent has ended too)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


__all__ = [
    "Backend",
    "element_of",
    "end_running_task",
    "gone",
    "lacks",
    "recorded_worker",
    "running_worker",
    "wait_until",
]


def _under_peer_worker(parents: list[int]) -> bool:
    """Whether one of ``parents`` is an ``elsewhere peer worker`` daemon."""
    for pid in parents:
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if "peer worker" in cmd or "peer_cli" in cmd:
            return True
    return False


def folders(tmp_path: Path, *names: str) -> list[Path]:
    """New folders ``tmp_path/NAME``, one per name (where each job's tasks leave their marks)."""
    out = []
    for name in names:
        (tmp_path / name).mkdir()
        out.append(tmp_path / name)
    return out
