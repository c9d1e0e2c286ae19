"""The context of a running task: ``ew.task()``.

Kept free of heavy imports: the worker imports it at start-up.
"""

from __future__ import annotations

import contextvars

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "elsewhere_task", default=None
)


class TaskContext:
    """What a running task knows about itself.

    Attributes:
        index: the task's 0-based index in its job.
        job: the job's name.
        job_id: the job's id.
        cores: the cores this task was given (``cores_per_task`` of the cluster).
        seed: the seed ``random`` and NumPy were seeded with (job seed + index).
        job_seed: the seed of the whole job.
        attempt: 0 on the first run, 1 on the first retry, ...
        host: the host name of the worker.
        rank, size, comm: for communicating (MPI) jobs, the rank, the number of
            ranks and an mpi4py communicator; ``None`` in independent jobs.
    """

    __slots__ = ("_comm", "_index", "_job_data", "_live", "_seed", "attempt", "cores", "host", "job", "job_id",
                 "job_seed", "rank", "size")

    def __init__(
        self, index: int, job: str, job_id: str, cores: int, seed: int, job_seed: int, attempt: int = 0,
        host: str = "", rank: int | None = None, size: int | None = None,
        _job_data: Callable[[], Any] | None = None, _comm: Any = None,
    ) -> None:
        self._index = index
        self._live: Any = None  # while a loop of tiny tasks runs: its map, whose [0] is the index
        self.job = job
        self.job_id = job_id
        self.cores = cores
        self._seed = seed
        self.job_seed = job_seed
        self.attempt = attempt
        self.host = host
        self.rank = rank
        self.size = size
        self._job_data = _job_data
        self._comm = _comm

    def __repr__(self) -> str:
        extra = f", rank={self.rank}, size={self.size}" if self.rank is not None else ""
        return (f"TaskContext(index={self.index}, job={self.job!r}, cores={self.cores}, seed={self.seed}, "
                f"attempt={self.attempt}, host={self.host!r}{extra})")

    @property
    def index(self) -> int:
        live = self._live
        return self._index if live is None else live[0]

    @index.setter
    def index(self, index: int) -> None:
        self._index = index

    @property
    def seed(self) -> int:
        live = self._live
        return self._seed if live is None else self.job_seed + live[0]

    @seed.setter
    def seed(self, seed: int) -> None:
        self._seed = seed

    @property
    def job_data(self) -> Any:
        """The job's ``job_data`` (sent once per worker, not once per task)."""
        data = self._job_data() if self._job_data is not None else None
        return data.data if isinstance(data, WorkerSetup) else data

    @property
    def comm(self) -> Any:
        """An mpi4py communicator over the job's ranks (communicating jobs only)."""
        if self._comm is None and self.rank is not None:
            from mpi4py import MPI

            self._comm = MPI.COMM_WORLD
        return self._comm

    @property
    def rng(self) -> Any:
        """A NumPy Generator seeded for this task (independent streams per task)."""
        import numpy as np

        return np.random.default_rng(np.random.SeedSequence(self.job_seed, spawn_key=(self.index,)))


class WorkerSetup:
    """The job data of an ``ew.Executor`` made with an ``initializer``: the user's ``data``
    (what ``ew.task().job_data`` gives), and ``initializer(*initargs)``, which
    :func:`call_initialised` runs once in each process before its first call of the job.
    It travels as job data does: once per worker, not once per task."""

    __slots__ = ("data", "initargs", "initializer", "token")

    def __init__(self, initializer: Callable[..., Any], initargs: tuple[Any, ...], data: Any, token: str) -> None:
        self.initializer = initializer
        self.initargs = tuple(initargs)
        self.data = data
        self.token = token

    def __reduce__(self) -> Any:
        return (WorkerSetup, (self.initializer, self.initargs, self.data, self.token))


_initialised: set[str] = set()  # the tokens of the WorkerSetups run in this process


def call_initialised(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, after the job's :class:`WorkerSetup` has run in this process
    (once: an initializer that raises fails this call, and is tried again before the next)."""
    ctx = _current.get()
    setup = ctx._job_data() if ctx is not None and ctx._job_data is not None else None
    if isinstance(setup, WorkerSetup) and setup.token not in _initialised:
        setup.initializer(*setup.initargs)
        _initialised.add(setup.token)
    return fn(*args, **kwargs)


def task() -> TaskContext:
    """The context of the task that is running now.

    Raises RuntimeError when called outside a task.
    """
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("elsewhere.task() was called outside a running task")
    return ctx


def set_current(ctx: TaskContext | None) -> contextvars.Token:
    """Install ``ctx`` as the running task's context (used by the worker)."""
    return _current.set(ctx)
