"""joblib's ``Parallel`` (and scikit-learn's ``n_jobs``) on any elsewhere cluster: the backend
``"elsewhere"``, registered by ``import elsewhere.joblib`` (docs/joblib.md)::

    import joblib, elsewhere as ew, elsewhere.joblib
    with joblib.parallel_config(backend="elsewhere", on=ew.slurm(partition="debug")):
        GridSearchCV(SVC(), grid).fit(X, y)

joblib hands the backend batches of calls (``BatchedCalls``, picklable callables) and a
callback for each; the backend runs each batch and calls the callback when it ends, and
joblib sends the next batch from there. Two ways to run the batches:

- on a cluster with the capability "stream" (local workers, peers): one ``ew.Executor`` per
  ``Parallel`` call, each batch one call of it; joblib's own auto-batching (as with loky);
- on any other (batch schedulers, ssh nodes, plugins): the batches pending together go as
  one job of ``ew.submit``, a task each, packed into at most ``n_jobs`` array elements on a
  batch scheduler (``joblib_batch.py``), with batch sizes from the time the workers
  measure, because a round trip there takes seconds.

``n_jobs=-1`` (and the default, as with dask's backend) means the cluster's slots
(``joblib_slots.py``); ``n_jobs=1`` runs in the caller, as joblib always does. A call that
raises comes out of ``Parallel`` as its own exception, the remote traceback as its cause.
``Parallel`` calls inside a task use threads, as many as the task's cores for ``n_jobs=-1``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from typing import Any

from joblib.parallel import (
    AutoBatchingMixin,
    FallbackToBackend,
    ParallelBackendBase,
    SequentialBackend,
    register_parallel_backend,
)

from ..folder import serial
from ..util.errors import ConfigError
from .joblib_batch import BatchRunner, objects_to_send_by_value
from .joblib_slots import cluster_slots
from .joblib_task import TaskThreads, large_arguments, share

__all__ = ["ElsewhereBackend", "register"]

_JOB_OPTIONS = ("tag", "seed", "retries", "files", "env", "storage")  # of ew.create_job
_OURS = ("on", "name", "keep", "wait_for_workers_s", *_JOB_OPTIONS)
# what joblib's Parallel passes to configure() for its own backends (memmapping, the
# multiprocessing context): nothing to do here, arrays travel with the calls
_JOBLIB_KWARGS = ("max_nbytes", "temp_folder", "mmap_mode", "verbose", "context", "idle_worker_timeout")
_SLOTS_TTL_S = 30.0  # the cluster's slots are asked again after this


def register(name: str = "elsewhere") -> None:
    """Register :class:`ElsewhereBackend` with joblib under ``name`` (``import
    elsewhere.joblib`` does it for "elsewhere")."""
    register_parallel_backend(name, ElsewhereBackend)


class ElsewhereBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's parallel backend on an elsewhere cluster (see the module).

    Args (``parallel_config(backend="elsewhere", ...)`` passes them; ``Parallel(backend=
    "elsewhere", ...)`` may give them too, for its call only):
        on: the cluster (default ``ew.local()``) or a profile name.
        name: the start of the names of the jobs (default "joblib").
        keep: keep the jobs after the calls (``ew.jobs()`` lists them).
        wait_for_workers_s: on peers, how long ``n_jobs=-1`` waits to hear a first worker.
        tag, seed, retries, files, env, storage: as for :func:`elsewhere.create_job`
            (``retries=2`` runs a call again where its worker was lost).
    """

    supports_retrieve_callback = True  # also return_as="generator" and Parallel(timeout=...)
    default_n_jobs = -1  # scikit-learn's n_jobs=None uses the cluster, as with dask's backend
    uses_threads = False
    supports_sharedmem = False

    def __init__(self, on: Any = None, *, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None, **options: Any) -> None:  # fmt: skip
        if inner_max_num_threads is not None:
            raise ConfigError("inner_max_num_threads is not taken by the elsewhere backend: a task's "
                              "threads follow its cores (give the cluster cores_per_task=N)")  # fmt: skip
        super().__init__(nesting_level=nesting_level)
        self._defaults = self._checked({"on": on, **options})
        self._call: dict[str, Any] = {}  # Parallel(backend="elsewhere", on=...): for its call only
        self._runner: Any = None
        self._n_jobs = 1  # how many calls run at once (n_jobs, or the slots for -1)
        self._slots: tuple[float, int, Any] | None = None  # (when, slots, cluster)
        self._max_nbytes: int | None = 1 << 20
        self.parallel: Any = None

    # -- settings --------------------------------------------------------------------------
    @staticmethod
    def _checked(options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - set(_OURS))
        if unknown:
            raise ConfigError(f"the elsewhere joblib backend got unknown option(s) {', '.join(unknown)}; it "
                              f"takes {', '.join(_OURS)}")  # fmt: skip
        from .clusters import resolve

        out = dict(options)
        out["on"] = resolve(options.get("on"))
        wait = out.get("wait_for_workers_s", 10.0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
            raise ConfigError(f"wait_for_workers_s must be a number of seconds, not {wait!r}")
        return out

    def _option(self, key: str, default: Any = None) -> Any:
        if key in self._call:
            return self._call[key]
        return self._defaults.get(key, default)

    @property
    def cluster(self) -> Any:
        """The cluster the calls run on."""
        return self._option("on")

    # -- joblib's hooks ----------------------------------------------------------------------
    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """``n_jobs``, where -1 is the cluster's slots (-2 all but one, ...); None: -1.

        At least 2 unless ``n_jobs=1`` is asked for: joblib runs a call of one job in the
        caller, and a cluster of one slot should still run the calls (one at a time)."""
        wanted = self._wanted(n_jobs)
        return wanted if n_jobs is not None and int(n_jobs) > 0 else max(wanted, 2)

    def _wanted(self, n_jobs: int | None) -> int:
        """How many calls should run at once for ``n_jobs``."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        n = self.default_n_jobs if n_jobs is None else int(n_jobs)
        return max(self.slots() + 1 + n, 1) if n < 0 else n

    def slots(self) -> int:
        """How many calls the cluster runs at once (asked again after 30 s)."""
        cluster = self.cluster
        now = time.monotonic()
        if self._slots is not None and self._slots[2] is cluster and now - self._slots[0] < _SLOTS_TTL_S:
            return self._slots[1]
        n = cluster_slots(cluster, wait_for_workers_s=float(self._option("wait_for_workers_s", 10.0)))
        self._slots = (time.monotonic(), n, cluster)
        return n

    def _known_slots(self) -> int | None:
        """The slots if they cost nothing to know now (local, or asked lately); else None."""
        from ..backends.local import LocalCluster

        cluster = self.cluster
        if isinstance(cluster, LocalCluster):
            return self.slots()
        fresh = self._slots is not None and self._slots[2] is cluster
        return self._slots[1] if fresh and self._slots is not None else None

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: Any = None, require: Any = None,
                  **backend_kwargs: Any) -> int:  # fmt: skip
        """Start a ``Parallel`` call (or a ``with Parallel(...)`` block): returns ``n_jobs``."""
        ours = {k: backend_kwargs.pop(k) for k in list(backend_kwargs) if k in _OURS}
        unknown = sorted(set(backend_kwargs) - set(_JOBLIB_KWARGS))
        if unknown:
            raise ConfigError(f"Parallel got unknown keyword(s) {', '.join(unknown)} for the elsewhere backend; "
                              f"it takes {', '.join(_OURS)}")  # fmt: skip
        if ours:
            self._call = {k: v for k, v in self._checked({**self._defaults, **ours}).items() if k in ours}
        self.parallel = parallel
        # joblib memory-maps arguments of max_nbytes or more ("1M"; None: never); here they
        # travel once per worker instead of once per batch (joblib_task.Shared)
        self._max_nbytes = backend_kwargs.get("max_nbytes", 1 << 20)
        n = self.effective_n_jobs(n_jobs)
        if n == 1:  # joblib runs n_jobs=1 in the caller whatever the backend
            self._call = {}
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self._n_jobs = self._wanted(n_jobs)
        self._start()
        return n

    def _start(self) -> None:
        cluster = self.cluster
        name = self._option("name") or "joblib"
        if not isinstance(name, str):
            raise ConfigError(f"name must be a string, not {name!r}")
        keep = bool(self._option("keep", False))
        options = {k: self._option(k) for k in _JOB_OPTIONS if self._option(k) is not None}
        if "stream" in cluster.capabilities:
            # n_jobs=2 on a larger cluster: at most 2 at once (the executor holds the others)
            slots = self._known_slots()
            limit = self._n_jobs if slots is None or self._n_jobs < slots else None
            self._runner = _StreamRunner(cluster, limit, self._max_nbytes, name=f"{name}-{os.urandom(3).hex()}",
                                         keep=keep, options=options)  # fmt: skip
        else:
            self._runner = BatchRunner(cluster, self._n_jobs, name=name, keep=keep, options=options,
                                       max_nbytes=self._max_nbytes)  # fmt: skip

    def submit(self, func: Any, callback: Any = None) -> Any:
        """Run the batch ``func``; ``callback(future)`` once it ends."""
        if self._runner is None:
            self._start()
        fut = self._runner.submit(func)
        if callback is not None:
            fut.add_done_callback(callback)
        return fut

    apply_async = submit  # the name of the hook before joblib 1.5

    def retrieve_result_callback(self, out: Any) -> Any:
        """The batch's results, or its call's exception (raised)."""
        return out.result()

    def compute_batch_size(self) -> int:
        if isinstance(self._runner, BatchRunner):
            return self._runner.sizing.batch_size()
        return int(super().compute_batch_size())

    def batch_completed(self, batch_size: int, duration: float) -> None:
        if not isinstance(self._runner, BatchRunner):  # the batch runner measures on the workers
            super().batch_completed(batch_size, duration)

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """joblib met an error (or its generator was dropped): stop every call of this backend
        (running ones too, as loky does); start afresh if more calls are to come."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.abort()
        if ensure_ready:
            self._start()

    def terminate(self) -> None:
        """The end of a ``Parallel`` call (or block): wait for its job to end and purge it."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()
        self._call = {}
        self.reset_batch_stats()

    def get_nested_backend(self) -> tuple[Any, int | None]:
        """``Parallel`` inside a task: threads, as many as the task's cores for ``n_jobs=-1``."""
        return TaskThreads(nesting_level=(self.nesting_level or 0) + 1), None

    def __repr__(self) -> str:
        return f"ElsewhereBackend(on={self.cluster!r})"


class _StreamRunner:
    """The batches of one ``Parallel`` call as calls of an ``ew.Executor``, made at the first
    batch: its large arguments (``max_nbytes`` or more) go as the job's data, once per worker,
    and the batches refer to them (``joblib_task.share``)."""

    def __init__(self, cluster: Any, limit: int | None, max_nbytes: int | None, *, name: str, keep: bool,
                 options: dict[str, Any]) -> None:  # fmt: skip
        self.cluster = cluster
        self.limit = limit
        self.max_nbytes = max_nbytes
        self.name = name
        self.keep = keep
        self.options = options
        self.shared: dict[int, tuple[str, Any]] = {}
        self.executor: Any = None
        self.lock = threading.Lock()

    def _executor(self, batch: Any) -> Any:
        with self.lock:
            if self.executor is None:
                from .executor import Executor

                self.shared = large_arguments([batch], self.max_nbytes, seen_twice=False)
                data = {key: obj for key, obj in self.shared.values()} or None
                types = [type(obj) for _, obj in self.shared.values()]
                with serial.by_value_for(types, shared_fs=self.cluster.shares_filesystem()):
                    self.executor = Executor(self.limit, on=self.cluster, name=self.name, keep=self.keep,
                                             job_data=data, **self.options)  # fmt: skip
            return self.executor

    def submit(self, batch: Any) -> cf.Future:
        try:
            executor = self._executor(batch)
            with serial.by_value_for(objects_to_send_by_value([batch]),
                                     shared_fs=self.cluster.shares_filesystem()):  # fmt: skip
                return executor.submit(share(batch, self.shared))
        except Exception as exc:  # cannot be sent (pickled): the batch fails with why
            fut: cf.Future = cf.Future()
            fut.set_exception(exc)
            return fut

    def abort(self) -> None:
        with self.lock:
            executor, self.shared = self.executor, {}
        if executor is not None:  # as loky, which kills its workers before it returns
            executor.shutdown(wait=True, kill=True)

    def close(self) -> None:
        with self.lock:
            executor, self.shared = self.executor, {}
        if executor is not None:
            executor.shutdown(wait=True)
