"""The one plugin interface every backend implements.

This is the Python form of MATLAB's generic scheduler plugin scripts. The
client calls each operation at the same stage MATLAB calls its script:

=========================  ===============================================
operation                  called when
=========================  ===============================================
``post_construct``         a cluster object is made: check commands, settings
``submit_independent``     ``job.submit()`` of a job of independent tasks
``submit_communicating``   ``job.submit()`` of a communicating (MPI) job
``job_state``              ``job.check()``/``wait()``: given the state read
                           from the job folder, return a fresher one
``poll``                   periodically while a client waits: find lost
                           workers, start replacements, mirror results
``cancel_job``             ``job.cancel()``
``cancel_task``            ``job.tasks[i].cancel()``
``delete_job``             ``job.purge()``, before the folder is removed
``delete_task``            a task is removed from a job
=========================  ===============================================

A backend keeps what it must find again (scheduler job ids, hosts, pids) with
``set_job_cluster_data`` / ``get_job_cluster_data``; it lands in the job
folder (``cluster.json``) so a job recovered in a new process still knows
it. ``additional_properties`` are free per-cluster settings a plugin reads
(a node list, a constraint); they travel with the cluster's description.

A cluster is rebuilt in another process from :meth:`Cluster.describe`, via
:func:`elsewhere.backends.from_description`.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..util.errors import ConfigError

if TYPE_CHECKING:
    from ..api.job import Job
    from ..folder.snapshot import Snapshot


class Cluster(abc.ABC):
    """Where tasks run. Subclass it to add a backend.

    Args:
        cores_per_task: cores each task gets (``ew.task().cores``); a node
            with C cores runs ``C // cores_per_task`` tasks at once.
        storage: where job folders go; default ``<home>/jobs``.
        additional_properties: free settings for the plugin.
    """

    #: The registry key of the backend ("local", "slurm", ...).
    kind: ClassVar[str] = ""

    def __init__(
        self,
        *,
        cores_per_task: int = 1,
        storage: str | Path | None = None,
        additional_properties: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(cores_per_task, int) or cores_per_task < 1:
            raise ConfigError(f"cores_per_task must be a positive integer, not {cores_per_task!r}")
        self.cores_per_task = cores_per_task
        self.storage = Path(storage).expanduser().absolute() if storage else None
        self.additional_properties: dict[str, Any] = dict(additional_properties or {})

    # -- description --------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The constructor arguments that rebuild this cluster (JSON-able)."""
        return {
            "cores_per_task": self.cores_per_task,
            "storage": str(self.storage) if self.storage else None,
            "additional_properties": self.additional_properties,
        }

    def describe(self) -> dict[str, Any]:
        """``{"kind": ..., "class": "module:Class", **settings}``: enough to rebuild it elsewhere."""
        cls = type(self)
        return {"kind": self.kind, "class": f"{cls.__module__}:{cls.__qualname__}", **self.settings()}

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Cluster:
        """Rebuild from :meth:`settings`."""
        return cls(**settings)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items() if v not in (None, {}, [], ()))
        return f"{type(self).__name__}({args})"

    # -- the plugin operations ---------------------------------------------
    def post_construct(self) -> None:
        """Check that the cluster can work (commands present, settings valid)."""

    def max_workers(self, n_tasks: int) -> int:
        """How many tasks of a job may run at once."""
        return max(1, n_tasks)

    def prepare(self, job: Job, n_tasks: int) -> None:
        """Called before the inputs are written: start what takes time (workers), if anything."""

    @abc.abstractmethod
    def submit_independent(self, job: Job) -> None:
        """Start the tasks of ``job``; return at once (they run detached)."""

    def submit_communicating(self, job: Job) -> None:
        """Start ``job``'s ranks together (an MPI job)."""
        raise ConfigError(f"the {self.kind or type(self).__name__} cluster cannot run communicating jobs")

    def job_state(self, job: Job, snapshot: Snapshot) -> Snapshot:
        """A fresher view than ``snapshot`` (read from the folder), if the backend knows one."""
        return snapshot

    def poll(self, job: Job) -> None:
        """Periodic care while a client waits: find lost workers, replace them."""

    def cancel_job(self, job: Job) -> None:
        """Stop everything of ``job``; nothing new starts."""

    def cancel_task(self, job: Job, index: int) -> None:
        """Stop one task; the others go on."""

    def delete_job(self, job: Job) -> None:
        """Remove what the backend keeps of ``job`` outside its folder."""

    def delete_task(self, job: Job, index: int) -> None:
        """Remove one task from the backend."""

    def report_lost(self, job: Job, reasons: dict[int, str]) -> None:
        """Fail tasks that ended without a result (``{task: why}``), unless a result came.

        For plugins: a scheduler said the tasks' job ended, their process is
        gone. The reason becomes the message of each task's TaskError.
        """
        import time

        from ..folder.records import Kind, make_record

        job._reader.refresh()
        with job.store.locked_queue() as q:
            if q.get("cancelled"):
                return
            said = q.setdefault("lost_reason", {})
            recs = []
            for t, why in reasons.items():
                if t in job._reader.final or str(t) in said:
                    continue
                said[str(t)] = why
                recs.append(make_record(Kind.LOST, t, int(q["attempts"].get(str(t), 0)), t_end=time.time()))
            if recs:
                job.store.append_control(recs)
        job._dirty()

    # -- cluster data -----------------------------------------------------------
    def set_job_cluster_data(self, job: Job, data: dict[str, Any]) -> None:
        """Store what this backend must find again (scheduler ids, hosts, pids)."""
        job.store.set_cluster_data(data)

    def get_job_cluster_data(self, job: Job) -> dict[str, Any]:
        """What :meth:`set_job_cluster_data` stored; ``{}`` if nothing."""
        return job.store.cluster_data()

    # -- environment of the job ---------------------------------------------------
    def shares_filesystem(self) -> bool:
        """True when workers see the client's files at the same paths."""
        return True

    def sends_files(self) -> bool:
        """True when a job's ``files=`` reach its tasks wherever they run."""
        return True
