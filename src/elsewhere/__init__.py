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

TYPE_CHECKING = False  # keep `import elsewhere` light: workers import this package too
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "map": "api",
    "submit": "api",
    "create_job": "api",
    "recover": "api",
    "jobs": "api",
    "local": "api",
    "cluster": "api",
    "slurm": "api",
    "ssh": "api",
    "peers": "api",
    "batch": "api",
    "Executor": "executor",
    "submit_communicating": "mpi",
    "Job": "job",
    "Task": "tasks",
    "Status": "tasks",
    "task": "context",
    "TaskContext": "context",
    "Cluster": "clusters.base",
    "TaskState": "states",
    "JobState": "states",
    "ElsewhereError": "errors",
    "ConfigError": "errors",
    "SerializationError": "errors",
    "JobError": "errors",
    "JobNotFound": "errors",
    "NameInUse": "errors",
    "TimeoutError": "errors",
    "SchedulerError": "errors",
    "TransportError": "errors",
    "PeerError": "errors",
    "TaskError": "errors",
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
    from .api import (
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
    from .clusters.base import Cluster
    from .context import TaskContext, task
    from .errors import (
        ConfigError,
        ElsewhereError,
        JobError,
        JobNotFound,
        NameInUse,
        PeerError,
        SchedulerError,
        SerializationError,
        TaskError,
        TimeoutError,
        TransportError,
    )
    from .executor import Executor
    from .job import Job
    from .mpi import submit_communicating
    from .states import JobState, TaskState
    from .tasks import Status, Task
