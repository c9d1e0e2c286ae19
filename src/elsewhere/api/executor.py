"""``ew.Executor``: a ``concurrent.futures.Executor`` whose calls run on a cluster.

A drop-in for ``ProcessPoolExecutor``: the same constructor where its arguments mean
something here (``max_workers``, ``initializer``, ``initargs``), the same futures (the
standard library's own: ``as_completed``, ``wait``, callbacks and asyncio's
``run_in_executor`` work on them), the same cancel contract (a call a worker has taken
runs on; :meth:`Executor.kill` stops it), exceptions as the task raised them, and an
executor that is dropped, or never shut down, ends as the standard's do: at interpreter
exit its pending calls are waited for (``detach=True`` leaves them running instead, in a
job that can be recovered by name).

Behind it is one open-ended job (``streaming.py``); shutting the executor down closes the
job and, unless ``keep=True``, purges it once the last result is in.

Where it differs from ProcessPoolExecutor, by design: a worker process that dies fails
only the call it ran (``TaskError`` of reason "lost", or a rerun with ``retries=``), and
the executor lives on; there is no ``BrokenProcessPool``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from ..util.errors import ConfigError
from .futures import StreamFuture
from .streaming import Stream

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

    from ..backends.base import Cluster
    from .job import Job
    from .options import JobOptions

P = ParamSpec("P")
T = TypeVar("T")

__all__ = ["Executor"]

# the options of create_job
_JOB_OPTIONS = ("tag", "seed", "retries", "after", "files", "job_data", "env", "storage")
_live: weakref.WeakSet[Stream] = weakref.WeakSet()  # the streams not ended yet
_exiting = False  # the interpreter is shutting down: no new calls
_hooked = False
_hooked_pid = 0  # the process that registered the exit hook (a forked child inherits it)


def _at_exit() -> None:
    """At interpreter exit, as the standard's executors do: no new calls, and every
    executor's pending calls waited for (a detached one's job is closed and left to run)."""
    global _exiting
    if os.getpid() != _hooked_pid:
        # a child forked after executors started (multiprocessing's fork): it holds copies
        # of their streams but not their threads, and joining those would wait for ever
        return
    _exiting = True
    for stream in list(_live):
        try:
            stream.close()
            if not stream.detach:
                stream.join()
        except Exception:  # one executor's trouble must not keep the others from ending
            pass


def _hook() -> None:
    global _hooked, _hooked_pid
    if _hooked:
        return
    _hooked, _hooked_pid = True, os.getpid()
    register = getattr(threading, "_register_atexit", None)  # before threads are joined
    try:
        if register is not None:
            register(_at_exit)
            return
    except RuntimeError:  # already shutting down
        return
    import atexit

    atexit.register(_at_exit)


class Executor(cf.Executor):
    """Run callables on a cluster with the ``concurrent.futures`` interface.

    Args:
        max_workers: the most calls that run at once (default: as many as the cluster
            gives). A cluster may be given here instead, as ``on``.
        mp_context: accepted for ProcessPoolExecutor's sake when it is ``spawn`` or
            ``forkserver`` (elsewhere's workers are fresh interpreters, as with spawn);
            ``fork`` is refused.
        initializer: ``initializer(*initargs)`` runs once in each worker process
            before its first call (a model loaded once per process); it travels with the
            job's data, once per worker. An initializer that raises fails that call and is
            tried again before the next.
        initargs: the arguments of ``initializer``.
        max_tasks_per_child: refused: a worker runs calls until the executor ends.
        on: the cluster (default ``ew.local()``) or a profile name.
        name: the name of the job behind the executor.
        keep: keep the job after shutdown (recover it by name later).
        detach: at interpreter exit, leave unfinished calls running in their job
            (recoverable by name) rather than wait for them.
        **options: those of :func:`elsewhere.create_job` (seed, retries, env, job_data, ...).
    """

    def __init__(self, max_workers: int | Cluster | str | None = None, mp_context: BaseContext | None = None,
                 initializer: Callable[..., Any] | None = None, initargs: Iterable[Any] = (), *,
                 max_tasks_per_child: int | None = None, on: Cluster | str | None = None, name: str | None = None,
                 keep: bool = False, detach: bool = False, **options: Unpack[JobOptions]) -> None:  # fmt: skip
        from . import functions as api
        from .clusters import resolve

        if max_workers is not None and not isinstance(max_workers, int):
            if on is not None:
                raise ConfigError(f"max_workers must be a count, not {max_workers!r}")
            on, max_workers = max_workers, None  # Executor(ew.local()) or Executor("profile")
        if max_workers is not None and (isinstance(max_workers, bool) or max_workers <= 0):
            raise ConfigError(f"max_workers must be greater than 0, not {max_workers!r}")
        _check_mp_context(mp_context)
        if max_tasks_per_child is not None:
            raise ConfigError("max_tasks_per_child is not supported: elsewhere's workers run calls until the "
                              "executor ends; to start each call afresh, use ew.map or ew.submit, whose "
                              "workers leave after the job")  # fmt: skip
        if initializer is not None and not callable(initializer):
            raise ConfigError(f"initializer must be callable, not {initializer!r}")
        if isinstance(initargs, (str, bytes)) or not isinstance(initargs, Iterable):
            raise ConfigError(f"initargs must be a tuple of arguments, not {initargs!r}")
        unknown = sorted(k for k in options if k not in _JOB_OPTIONS)
        if unknown:
            raise ConfigError(f"Executor got unknown option(s) {', '.join(unknown)}; it takes max_workers, "
                              f"mp_context, initializer, initargs, on, name, keep, detach and the job options "
                              f"{', '.join(_JOB_OPTIONS)}")  # fmt: skip
        if options.get("after") is not None:
            raise ConfigError("an Executor runs calls as they come: it cannot wait for other jobs (after=); "
                              "wait for them first (job.wait()), or use ew.submit(..., after=[job])")  # fmt: skip
        if _exiting:
            raise RuntimeError("cannot make an Executor while the interpreter shuts down")
        if on is None and max_workers is not None:
            on = api.local(cores=max_workers) if max_workers <= _cores() else None
        cluster = resolve(on)
        if "stream" not in cluster.capabilities:
            raise ConfigError(
                f"the {cluster.kind or type(cluster).__name__} cluster cannot run an Executor: it runs jobs whose "
                "tasks are known when they are submitted (its backend lacks the capability 'stream'); use "
                "ew.map or ew.submit there, or an Executor on ew.local() or ew.peers()"
            )
        wrap = None
        if initializer is not None:
            from ..run.context import WorkerSetup, call_initialised

            token = os.urandom(8).hex()
            options["job_data"] = WorkerSetup(
                initializer, tuple(initargs), options.get("job_data"), token
            )

            def wrap(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                return (call_initialised, (fn, *args), kwargs)

        job = api.create_job(
            cluster, name=name or f"executor-{os.urandom(3).hex()}", _stream=True, **options
        )
        limit = None if max_workers is None or _caps_itself(cluster, max_workers) else max_workers
        self._stream = Stream(job, keep=keep, detach=detach, max_calls=limit, wrap=wrap)
        self._pid = os.getpid()  # a child forked later holds a copy, not the executor
        _live.add(self._stream)
        _hook()
        # Dropped without shutdown: closed as shutdown(wait=False) would (its calls go on,
        # their futures still complete, and the job is purged after the last).
        self._finalizer = weakref.finalize(self, Stream.close, self._stream)

    @property
    def job(self) -> Job[Any]:
        """The Job behind this executor."""
        return self._stream.job

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> cf.Future[T]:
        """Schedule ``fn(*args, **kwargs)``; returns a Future."""
        if _exiting or sys.is_finalizing():
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if not callable(fn):
            raise ConfigError(f"submit needs a callable, not {fn!r}")
        return cast("cf.Future[T]", self._stream.submit(fn, args, kwargs))

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1) -> Iterator[T]:  # fmt: skip
        """``map(fn, *iterables)`` with every call submitted at once; results in order
        (``chunksize`` is accepted: calls are grouped by the workers' claims already)."""
        if not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        return super().map(fn, *iterables, timeout=timeout)

    def kill(self, future: cf.Future[Any]) -> bool:
        """Stop ``future``'s call wherever it is, running or not (``cancel`` does not stop a
        running call, as the standard says); its future then raises a TaskError of reason
        "cancelled". False if it had ended."""
        if not isinstance(future, StreamFuture) or future._ew_stream is not self._stream:
            raise ConfigError("kill takes a future of this executor")
        return self._stream.kill(future)

    def shutdown(
        self, wait: bool = True, *, cancel_futures: bool = False, kill: bool = False
    ) -> None:
        """Take no more calls; close the job; with ``wait``, wait for the calls sent.

        ``cancel_futures``: cancel the calls no worker has taken (running ones go on);
        ``kill``: stop every unfinished call, running ones included. Unless ``keep=True``,
        the job is purged once its last result is in (with ``wait=False`` too). In a child
        forked from the process that made the executor, nothing: the executor is the
        parent's, and its threads are not in the child."""
        if os.getpid() != self._pid:
            return
        self._stream.close(cancel_futures=cancel_futures, kill=kill)
        if wait:
            self._stream.join()
        self._finalizer.detach()


def _check_mp_context(ctx: Any) -> None:
    if ctx is None:
        return
    get = getattr(ctx, "get_start_method", None)
    method = get() if callable(get) else None
    if method == "fork":
        raise ConfigError("mp_context 'fork' cannot be used: elsewhere's workers are fresh interpreters, as with "
                          "'spawn'; leave mp_context out (or give a 'spawn' context)")  # fmt: skip
    if method not in ("spawn", "forkserver"):
        raise ConfigError(f"mp_context must be a multiprocessing context, not {ctx!r}")


def _cores() -> int:
    from ..backends.local import machine_cores

    return machine_cores()


def _caps_itself(cluster: Any, max_workers: int) -> bool:
    """Whether ``cluster`` runs at most ``max_workers`` calls at once by itself (local workers
    with that many cores and one core per call)."""
    return (getattr(cluster, "kind", "") == "local" and getattr(cluster, "cores", None) is not None
            and cluster.cores <= max_workers and cluster.cores_per_task == 1)  # fmt: skip
