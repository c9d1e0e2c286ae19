"""A ``concurrent.futures.Executor`` whose tasks run on a cluster.

Behind it is one open-ended *stream* job: each ``submit`` appends a task to
the job's payload and wakes a waiting worker; a collector thread reads the
workers' journals and completes the futures::

    submit() ──append──> payload.log, queue.json ──wake──> worker FIFOs
    collector thread <──notify.fifo── workers <──claim── queue.json
         └── Future.set_result / set_exception

The futures are the standard library's own; ``as_completed`` and ``wait``
work on them as usual. Shutting the executor down closes the job and, unless
``keep=True``, purges it.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from .clusters.local import _wake
from .errors import ConfigError, TaskError
from .records import Kind


class _Future(cf.Future):
    """A standard Future whose ``cancel`` also cancels the task on the cluster."""

    def __init__(self, executor: Executor, index: int) -> None:
        super().__init__()
        self._ew_executor = executor
        self._ew_index = index

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        try:
            self._ew_executor._cancel_task(self._ew_index)
        except Exception:
            pass
        return True


class Executor(cf.Executor):
    """Run callables on a cluster with the ``concurrent.futures`` interface.

    Args:
        on: the cluster (default ``ew.local()``) or a profile name.
        name: the name of the job behind the executor.
        keep: keep the job after shutdown (recover it by name later).
        **options: those of :func:`elsewhere.create_job` (seed, retries, env, ...).
    """

    def __init__(self, on: Any = None, *, name: str | None = None, keep: bool = False, **options: Any) -> None:
        from . import api
        from .payload import PayloadWriter

        self._job = api.create_job(on, name=name or f"executor-{os.urandom(3).hex()}", _stream=True, **options)
        self._keep = keep
        self._writer = PayloadWriter(self._job.store.path / "payload.log")
        self._writer.write_common(None, self._job._job_data)
        self._lock = threading.Lock()
        self._futures: dict[int, _Future] = {}
        self._n = 0
        self._shutdown = False
        api._write_and_submit(self._job, None, [])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._collect, name="elsewhere-executor", daemon=True)
        self._thread.start()

    @property
    def job(self) -> Any:
        """The Job behind this executor."""
        return self._job

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """Schedule ``fn(*args, **kwargs)``; returns a Future."""
        if not callable(fn):
            raise ConfigError(f"submit needs a callable, not {fn!r}")
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            index = self._n
            try:
                from . import serial

                with serial.by_value_for([fn], shared_fs=self._job.cluster.shares_filesystem()):
                    self._writer.write_tasks(index, [(fn, args, kwargs)])
            except Exception:
                from . import serial

                serial.check_serialisable(None, [(fn, args, kwargs)])
                raise
            fut = _Future(self, index)
            self._futures[index] = fut
            self._n += 1
            store = self._job.store
            with store.locked_queue() as q:
                q["n"] = self._n
                waiting = [m.get("fifo") for m in q["members"].values() if m.get("state") == "waiting"]
                live = sum(1 for m in q["members"].values() if m.get("state") in ("active", "waiting"))
                pending = len(q.get("dispatched", {}))
                need = live + pending < q.get("max_workers", 1) and q["n"] - q["next"] > len(waiting)
            for fifo in waiting:
                _wake(fifo)
            added = getattr(self._job.cluster, "tasks_added", None)
            if added is not None:
                added(self._job)  # backends that push tasks (peers) hear of them at once
            elif need:
                self._job.cluster.poll(self._job)
        return fut

    def _cancel_task(self, index: int) -> None:
        self._job.cluster.cancel_task(self._job, index)

    def _collect(self) -> None:
        job = self._job
        reader = job._reader
        fd = os.open(job.store.path / "notify.fifo", os.O_RDWR | os.O_NONBLOCK)
        last_poll = time.monotonic()
        try:
            while True:
                r, _, _ = select.select([fd], [], [], 0.25)
                if r:
                    try:
                        while os.read(fd, 4096):
                            pass
                    except BlockingIOError:
                        pass
                reader.refresh()
                self._resolve()
                now = time.monotonic()
                if now - last_poll > 1.0:
                    last_poll = now
                    try:
                        job.cluster.poll(job)
                    except Exception:
                        pass
                with self._lock:
                    if self._stop.is_set() and not self._futures:
                        return
                    if self._stop.is_set() and job.store.queue().get("cancelled"):
                        for f in self._futures.values():
                            f.cancel()
                        return
        finally:
            os.close(fd)

    def _resolve(self) -> None:
        job = self._job
        with self._lock:
            for i in [i for i, f in self._futures.items() if f.cancelled()]:
                del self._futures[i]
            ready = [i for i in self._futures if i in job._reader.final]
        for i in ready:
            fut = self._futures.pop(i)
            if fut.done():
                continue
            job._snap = None
            try:
                value = job._value(i)
            except Exception as exc:
                value = TaskError(f"cannot read the result: {exc}", index=i, job=job.name)
            try:
                rec = job._reader.final[i][1]
                if isinstance(value, TaskError) and rec.kind != Kind.OK:
                    fut.set_exception(value.as_original_type())
                else:
                    fut.set_result(value)
            except cf.InvalidStateError:
                pass

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; optionally wait for the running ones; close the job."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            if cancel_futures:
                for f in list(self._futures.values()):
                    f.cancel()
        with self._job.store.locked_queue() as q:
            q["closed"] = True
            waiting = [m.get("fifo") for m in q["members"].values() if m.get("state") == "waiting"]
        for fifo in waiting:
            _wake(fifo)
        self._writer.close()
        self._stop.set()
        if wait:
            self._thread.join()
            if not self._keep:
                self._job.purge()
