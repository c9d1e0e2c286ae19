"""elsewhere: run Python functions as tasks elsewhere.

On local worker processes, on hosts reached by ssh, as array jobs of batch
schedulers, and on a peer network of workstations; every job is kept on
disk and can be followed, collected, cancelled and recovered by name.

    >>> import elsewhere as ew
    >>> ew.map(pow, [1, 2, 3], [2, 2, 2])
    [1, 4, 9]

Names are loaded on first use, so that ``python -m elsewhere.worker`` starts
fast (it imports this package but needs none of the client side).
"""

from __future__ import annotations

import importlib

from .util.version import __version__

TYPE_CHECKING = False  # keep `import elsewhere` light: workers import this package too
if TYPE_CHECKING:
    from typing import Any


_EXPORTS = {
    "map": "api.functions",
    "submit": "api.functions",
    "create_job": "api.functions",
    "recover": "api.functions",
    "jobs": "api.functions",
    "local": "api.functions",
    "cluster": "api.functions",
    "slurm": "api.functions",
    "ssh": "api.functions",
    "peers": "api.functions",
    "batch": "api.functions",
    "Executor": "api.executor",
    "submit_communicating": "api.mpi",
    "Job": "api.job",
    "Task": "api.job",
    "Status": "api.job",
    "task": "run.context",
    "TaskContext": "run.context",
    "Cluster": "backends.base",
    "Property": "backends.base",
    "RemoteCluster": "backends.remote",
    "JobHandle": "folder.handle",
    "Snapshot": "folder.snapshot",
    "TaskState": "util.states",
    "JobState": "util.states",
    "ElsewhereError": "util.errors",
    "ConfigError": "util.errors",
    "SerializationError": "util.errors",
    "JobError": "util.errors",
    "JobNotFound": "util.errors",
    "JobGone": "util.errors",
    "NoSuchTask": "util.errors",
    "DamagedJob": "util.errors",
    "NameInUse": "util.errors",
    "StateError": "util.errors",
    "TimeoutError": "util.errors",
    "SchedulerError": "util.errors",
    "TransportError": "util.errors",
    "PeerError": "util.errors",
    "TaskError": "util.errors",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elsewhere' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .api.executor import Executor
    from .api.functions import (
        batch,
        cluster,
        create_job,
        jobs,
        local,
        map,
        peers,
        recover,
        slurm,
        ssh,
        submit,
    )
    from .api.job import Job, Status, Task
    from .api.mpi import submit_communicating
    from .backends.base import Cluster, Property
    from .backends.remote import RemoteCluster
    from .folder.handle import JobHandle
    from .folder.snapshot import Snapshot
    from .run.context import TaskContext, task
    from .util.errors import (
        ConfigError,
        DamagedJob,
        ElsewhereError,
        JobError,
        JobGone,
        JobNotFound,
        NameInUse,
        NoSuchTask,
        PeerError,
        SchedulerError,
        SerializationError,
        StateError,
        TaskError,
        TimeoutError,
        TransportError,
    )
    from .util.states import JobState, TaskState
