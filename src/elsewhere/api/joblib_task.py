"""The worker's side of the joblib backend (``elsewhere.joblib``): a task that runs one of
joblib's batches of calls, the backend that ``Parallel`` calls nested inside a task use, and
the large arguments that calls share (sent once per worker, as the job's data).

Apart from ``joblib_backend`` so that a worker loading a batch imports joblib and this module
only, none of the client's side (executor, jobs, clusters).
"""

from __future__ import annotations

from typing import Any

from joblib.parallel import BatchedCalls, ThreadingBackend, cpu_count

__all__ = ["Shared", "SharedBatch", "TaskThreads", "call_batch", "large_arguments", "share", "task_cores"]


def task_cores() -> int:
    """The cores of the task running now (``ew.task().cores``); the machine's outside a task."""
    from ..run.context import task

    try:
        return int(task().cores)
    except RuntimeError:  # not in a task: a nested call made in the caller itself
        return int(cpu_count())


class TaskThreads(ThreadingBackend):
    """joblib's threading backend for ``Parallel`` calls inside a task (a RandomForest with
    ``n_jobs=-1`` inside a GridSearchCV): ``n_jobs=-1`` means the task's cores, not the
    machine's, so that tasks sharing a node do not oversubscribe it. With one core per task
    the nested call runs sequentially, as joblib does for ``n_jobs=1``."""

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs is not None and n_jobs < 0:
            n_jobs = max(task_cores() + 1 + n_jobs, 1)
        return int(super().effective_n_jobs(n_jobs))


def call_batch(batch: Any) -> Any:
    """Run one of joblib's batches (``BatchedCalls``, or a :class:`SharedBatch`): the task of a
    job on a cluster without the capability "stream" (a batch scheduler, ssh nodes)."""
    return batch()


# -- large arguments, sent once ---------------------------------------------------------------
class Shared:
    """In a batch sent to a worker: the place of a large argument that travels once per worker
    as the job's data (``ew.task().job_data[key]``), not once per batch. joblib's loky backend
    memory-maps such arrays (``max_nbytes``, 1 MB by default); dask's scatters them."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return Shared, (self.key,)


class SharedBatch:
    """A joblib batch whose large arguments are :class:`Shared` places: run on the worker, with
    the arguments put back from the job's data (joblib's ``BatchedCalls`` made anew)."""

    __slots__ = ("backend_and_jobs", "items")

    def __init__(self, items: list[tuple[Any, tuple[Any, ...], dict[str, Any]]], backend_and_jobs: Any) -> None:
        self.items = items
        self.backend_and_jobs = backend_and_jobs

    def __len__(self) -> int:
        return len(self.items)

    def __call__(self) -> list[Any]:
        from ..run.context import task

        data = task().job_data

        def put(value: Any) -> Any:
            return data[value.key] if type(value) is Shared else value

        items = [(f, tuple(put(a) for a in args), {k: put(v) for k, v in kwargs.items()})
                 for f, args, kwargs in self.items]  # fmt: skip
        return list(BatchedCalls(items, self.backend_and_jobs)())

    def __reduce__(self) -> tuple[Any, ...]:
        return SharedBatch, (self.items, self.backend_and_jobs)


def nbytes(obj: Any) -> int:
    """What a NumPy array, a pandas object or a SciPy sparse matrix weighs; 0 for the rest."""
    n = getattr(obj, "nbytes", None)  # NumPy arrays, pandas Series and Index
    if isinstance(n, int) and not isinstance(obj, type):
        return n
    module = type(obj).__module__
    if module.startswith("pandas") and hasattr(obj, "memory_usage"):
        try:
            return int(obj.memory_usage(index=True).sum())  # a DataFrame
        except Exception:
            return 0
    if module.startswith("scipy.sparse"):
        return sum(getattr(getattr(obj, a, None), "nbytes", 0) for a in ("data", "indices", "indptr", "row", "col"))
    return 0


def large_arguments(batches: list[Any], max_nbytes: int | None, *, seen_twice: bool) -> dict[int, tuple[str, Any]]:
    """The arguments of the calls in ``batches`` that weigh ``max_nbytes`` or more (all of them,
    or with ``seen_twice`` those that two calls share): ``{id(obj): (key, obj)}``."""
    if max_nbytes is None:
        return {}
    count: dict[int, int] = {}
    found: dict[int, Any] = {}
    for batch in batches:
        for _f, args, kwargs in getattr(batch, "items", ()):
            for value in (*args, *kwargs.values()):
                i = id(value)
                if i in found or (i not in count and nbytes(value) >= max_nbytes):
                    found[i] = value
                    count[i] = count.get(i, 0) + 1
    return {i: (f"a{k}", v) for k, (i, v) in enumerate(found.items()) if not seen_twice or count[i] > 1}


def share(batch: Any, shared: dict[int, tuple[str, Any]]) -> Any:
    """``batch`` with the arguments in ``shared`` replaced by their places (a
    :class:`SharedBatch`); ``batch`` itself if it has none of them."""
    items = getattr(batch, "items", None)
    if not shared or items is None or not hasattr(batch, "_backend"):
        return batch

    def place(value: Any) -> Any:
        hit = shared.get(id(value))
        return Shared(hit[0]) if hit is not None and hit[1] is value else value

    new = [(f, tuple(place(a) for a in args), {k: place(v) for k, v in kwargs.items()}) for f, args, kwargs in items]
    if all(a is b for (_, old_args, old_kw), (_, args, kw) in zip(items, new)
           for a, b in zip((*old_args, *old_kw.values()), (*args, *kw.values()))):  # fmt: skip
        return batch
    return SharedBatch(new, (batch._backend, getattr(batch, "_n_jobs", None)))
