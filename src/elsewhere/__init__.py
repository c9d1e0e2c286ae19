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

from .util.version import __version__ as __version__

TYPE_CHECKING = False  # keep `import elsewhere` light: workers import this package too
if TYPE_CHECKING:
    from typing import Any


_EXPORTS = {
    "map": "api.functions",
    "submit": "api.functions",
    "create_job": "api.functions",
    "recover": "api.functions",
    "jobs": "api.functions",
    "local": "api.clusters",
    "cluster": "api.clusters",
    "slurm": "api.clusters",
    "ssh": "api.clusters",
    "peers": "api.clusters",
    "batch": "api.clusters",
    "Executor": "api.executor",
    "submit_communicating": "api.mpi",
    "web": "api.web",
    "Job": "api.job",
    "Task": "api.tasks",
    "Status": "api.tasks",
    "task": "run.context",
    "TaskContext": "run.context",
    "Retry": "util.retry",
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
    "UnsupportedPlatform": "util.errors",
    "NameInUse": "util.errors",
    "StateError": "util.errors",
    "TimeoutError": "util.errors",
    "SchedulerError": "util.errors",
    "TransportError": "util.errors",
    "PeerError": "util.errors",
    "TaskError": "util.errors",
}

__all__ = sorted([*_EXPORTS, "__version__"])


if not TYPE_CHECKING:  # type checkers read the imports at the end: a misspelt ew.name is an error

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'elsewhere' has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs; `X as X` marks a re-export
    from .api.clusters import batch as batch
    from .api.clusters import cluster as cluster
    from .api.clusters import local as local
    from .api.clusters import peers as peers
    from .api.clusters import slurm as slurm
    from .api.clusters import ssh as ssh
    from .api.executor import Executor as Executor
    from .api.functions import create_job as create_job
    from .api.functions import jobs as jobs
    from .api.functions import map as map
    from .api.functions import recover as recover
    from .api.functions import submit as submit
    from .api.job import Job as Job
    from .api.mpi import submit_communicating as submit_communicating
    from .api.tasks import Status as Status
    from .api.tasks import Task as Task
    from .api.web import web as web
    from .backends.base import Cluster as Cluster
    from .backends.base import Property as Property
    from .backends.remote import RemoteCluster as RemoteCluster
    from .folder.handle import JobHandle as JobHandle
    from .folder.snapshot import Snapshot as Snapshot
    from .run.context import TaskContext as TaskContext
    from .run.context import task as task
    from .util.errors import ConfigError as ConfigError
    from .util.errors import DamagedJob as DamagedJob
    from .util.errors import ElsewhereError as ElsewhereError
    from .util.errors import JobError as JobError
    from .util.errors import JobGone as JobGone
    from .util.errors import JobNotFound as JobNotFound
    from .util.errors import NameInUse as NameInUse
    from .util.errors import NoSuchTask as NoSuchTask
    from .util.errors import PeerError as PeerError
    from .util.errors import SchedulerError as SchedulerError
    from .util.errors import SerializationError as SerializationError
    from .util.errors import StateError as StateError
    from .util.errors import TaskError as TaskError
    from .util.errors import TimeoutError as TimeoutError
    from .util.errors import TransportError as TransportError
    from .util.errors import UnsupportedPlatform as UnsupportedPlatform
    from .util.retry import Retry as Retry
    from .util.states import JobState as JobState
    from .util.states import TaskState as TaskState
