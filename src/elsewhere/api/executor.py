"""A ``concurrent.futures.Executor`` whose tasks run on a cluster.

Behind it is one open-ended *stream* job: each ``submit`` appends a task to
the job's payload and wakes a waiting worker; a collector thread reads the
workers' journals and completes the futures::

    submit() ──append──> payload.log
    counter thread ──n──> queue.json ──wake──> worker FIFOs
    collector thread <──notify.fifo── workers <──claim── queue.json
         └── Future.set_result / set_exception

``submit`` writes the task (so what cannot be pickled fails there); a task
submitted while none is pending is counted in the queue at once, one submitted
while others are pending is left to the counter thread, which counts all that
came meanwhile and wakes waiting workers: one queue update for a burst of
submits, not one each.

A cluster that runs a controller in this process (the peers) takes the tasks
in memory instead, and hands each value back as it arrives; the job folder is
still written, by two threads off the path of a task: the payload by the
executor's writer, the results (durable before a worker forgets them) by the
controller's recorder::

    submit() ──put──> controller ──TASK──> worker ──RESULT──> controller
        │                                                         ├── Future.set_result
        └──> payload writer thread: payload.log, queue.json       └── recorder: results, fsync, ACK

The collector thread still reads the journals, for what the controller does
not hand back (lost tasks, values it cannot unpickle, a restarted controller).

The futures are the standard library's own; ``as_completed`` and ``wait``
work on them as usual. Shutting the executor down closes the job and, unless
``keep=True``, purges it.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from ..backends.local import _wake
from ..folder.records import Kind, Record
from ..util.errors import ConfigError, TaskError
from .job import job_data, value_of

log = logging.getLogger(__name__)

_PAYLOAD_GATHER_S = 0.05
_PAYLOAD_DEFER_S = 1.0


class _Future(cf.Future):
    """A standard Future whose ``cancel`` also cancels the task on the cluster (running
    or not: it is stopped where it runs), and, where the cluster says so (the peer
    network), whose ``running()`` is true while the task is on a worker."""

    def __init__(self, executor: Executor, index: int) -> None:
        super().__init__()
        self._ew_executor = executor
        self._ew_index = index

    def running(self) -> bool:
        if super().running():
            return True
        link = self._ew_executor._link
        return link is not None and not self.done() and link.is_running(self._ew_index)

    def result(self, timeout: float | None = None) -> Any:
        try:
            return super().result(timeout)
        except cf.TimeoutError:
            raise cf.TimeoutError(self._late(timeout)) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return super().exception(timeout)
        except cf.TimeoutError:
            raise cf.TimeoutError(self._late(timeout)) from None

    def _late(self, timeout: float | None) -> str:
        """What a timeout says: where the task is, and what holds it back (the backend's note)."""
        ex = self._ew_executor
        where = "running" if self.running() else "not started"
        note = ""
        try:
            note = ex._job.check().note or ""
        except Exception:  # the message must not fail
            pass
        return (f"task {self._ew_index} of job {ex._job.name!r} did not finish within {timeout} s "
                f"({where}{'; ' + note if note else ''})")  # fmt: skip

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        try:
            self._ew_executor._cancel_task(self._ew_index)
        except Exception:  # the future is cancelled whatever the job says; the log tells why it ran on
            log.warning("task %d of job %r could not be cancelled in its job", self._ew_index,
                        self._ew_executor._job.name, exc_info=True)
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
        from ..folder.payload import PayloadWriter
        from . import functions as api
        from .job import write_and_submit

        cluster = api._resolve(on)
        if "stream" not in cluster.capabilities:
            from ..util.errors import ConfigError

            raise ConfigError(
                f"the {cluster.kind or type(cluster).__name__} cluster cannot run an Executor: it runs jobs whose "
                "tasks are known when they are submitted (its backend lacks the capability 'stream'); use "
                "ew.map or ew.submit there, or an Executor on ew.local() or ew.peers()")
        self._job = api.create_job(cluster, name=name or f"executor-{os.urandom(3).hex()}", _stream=True, **options)
        self._keep = keep
        self._writer = PayloadWriter(self._job.store.path / "payload.log",
                                     compress=not self._job.cluster.shares_filesystem())
        self._writer.write_common(None, job_data(self._job))
        self._lock = threading.Lock()
        self._futures: dict[int, _Future] = {}
        self._n = 0
        self._shutdown = False
        self._by_value_cache: dict[Any, Any] = {}
        write_and_submit(self._job, None, [])
        self._stop = threading.Event()
        self._link: Any = None  # the in-process controller that takes tasks in memory
        link = getattr(self._job.cluster, "executor_link", None)
        if link is not None:
            self._link = link(self._job.handle, self._on_outcome)
            self._pickle_lock = threading.Lock()
            self._to_write: queue.SimpleQueue[Any] = queue.SimpleQueue()
            self._payload_thread = threading.Thread(target=self._write_payload, daemon=True,
                                                    name="elsewhere-executor-payload")  # fmt: skip
            self._payload_thread.start()
        else:
            self._queued = 0  # the tasks the queue counts
            self._count_lock = threading.Lock()  # one count at a time, so the queue's n only grows
            self._news = threading.Event()
            self._count_thread = threading.Thread(target=self._count_tasks, daemon=True,
                                                  name="elsewhere-executor-queue")  # fmt: skip
            self._count_thread.start()
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
        if self._link is not None:
            return self._submit_direct(fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            index = self._n
            try:
                from ..folder import serial

                with self._by_value(fn):
                    self._writer.write_tasks(index, [(fn, args, kwargs)])
            except Exception:
                from ..folder import serial

                serial.check_serialisable(None, [(fn, args, kwargs)])
                raise
            fut = _Future(self, index)
            self._futures[index] = fut
            self._n += 1
            lone = len(self._futures) == 1
        if lone:
            self._count_now()  # nothing else pending: into the queue now, no hand-over
        else:
            self._news.set()  # a burst: the counter thread counts what has come meanwhile at once
        return fut

    def _count_tasks(self) -> None:
        """The counter thread: count the tasks written in the queue, wake workers."""
        while not self._stop.is_set():
            self._news.wait()
            self._news.clear()
            try:
                self._count_now()
            except Exception:
                log.exception("cannot count the executor's tasks in job %r", self._job.name)

    def _count_now(self) -> None:
        with self._count_lock:
            with self._lock:
                n = self._n  # every one of them is in the payload
            if n <= self._queued:
                return
            with self._job.store.locked_queue() as q:
                q.grow(n)
                waiting = q.waiting_fifos()
                need = q.live_members() + len(q.dispatched()) < q.max_workers and q.n - q.next > len(waiting)
            self._queued = n
        for fifo in waiting:
            _wake(fifo)
        added = getattr(self._job.cluster, "tasks_added", None)
        if added is not None:
            added(self._job.handle)  # backends that push tasks hear of them at once
        elif need:
            self._job.cluster.poll(self._job.handle)

    def _submit_direct(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> cf.Future:
        from ..folder import serial

        entry = (fn, args, kwargs)
        by_value = self._by_value(fn)
        # Pickled here, once, for the controller to send (the function once per function):
        # what cannot be sent fails at once. The payload writer pickles the objects later.
        try:
            prepared = self._link.prepare(entry)
        except Exception:
            serial.check_serialisable(None, [entry])
            raise
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            index = self._n
            self._n += 1
            fut = _Future(self, index)
            self._futures[index] = fut
            self._to_write.put((index, entry, by_value, fut))
        # outside the lock: the controller calls _on_outcome holding its own
        self._link.put(index, entry, prepared)
        return fut

    def _by_value(self, fn: Any) -> Any:
        """``serial.by_value_for([fn])``, decided once per module (the decision looks
        the module up on ``sys.path``: hundreds of microseconds)."""
        from ..folder import serial

        name = getattr(fn, "__module__", None)
        bv = self._by_value_cache.get(name)
        if bv is None:
            bv = serial.by_value_for([fn], shared_fs=self._job.cluster.shares_filesystem())
            if len(self._by_value_cache) < 256:
                self._by_value_cache[name] = bv
        return bv

    def _write_payload(self) -> None:
        """The writer thread: append the tasks to the payload (for a controller started
        later, ``retry`` and ``recover``), then count them in the queue.

        The controller sends each task from memory, so the payload is not on a task's
        path; written while the task is sent or runs, it would compete with it for the
        cores, the interpreter and the memory bus (100 MB of arguments cost more to
        write than to send). So tasks are taken together, and written once they ended
        or after ``_PAYLOAD_DEFER_S``, whichever comes first.
        """
        while True:
            items = [self._to_write.get()]
            if items[0] is not None:
                self._stop.wait(_PAYLOAD_GATHER_S)
                try:
                    while items[-1] is not None:
                        items.append(self._to_write.get_nowait())
                except queue.Empty:
                    pass
                # woken once, when the last of them ends, not by each result
                cf.wait([it[3] for it in items if it is not None], timeout=_PAYLOAD_DEFER_S)
            tasks = [it[:3] for it in items if it is not None]
            if tasks:
                try:
                    self._append(tasks)
                except Exception:
                    log.exception("cannot write the executor's tasks to job %r", self._job.name)
            if len(tasks) < len(items):
                return

    def _append(self, tasks: list[tuple[int, Any, Any]]) -> None:
        # Runs of consecutive tasks that send the same modules by value are written in one
        # call: a function shared by the run is then pickled once per chunk, not per task.
        start = 0
        while start < len(tasks):
            bv = tasks[start][2]
            end = start + 1
            while end < len(tasks) and tasks[end][2] is bv and tasks[end][0] == tasks[end - 1][0] + 1:
                end += 1
            lock = self._pickle_lock if bv.modules else contextlib.nullcontext()
            with lock, bv:
                self._writer.write_tasks(tasks[start][0], [t[1] for t in tasks[start:end]])
            start = end
        with self._job.store.locked_queue() as q:
            q.grow(tasks[-1][0] + 1)
        if self._link is not None and not self._link.alive():
            with contextlib.suppress(Exception):
                self._job.cluster.poll(self._job.handle)  # a new controller reads them from the payload

    def _on_outcome(self, index: int, ok: bool, value: Any, seed: int) -> None:
        """The controller thread: task ``index`` ended with ``value`` (an error description
        unless ``ok``); its record follows in the job folder."""
        with self._lock:
            fut = self._futures.pop(index, None)
        if fut is None or fut.done():
            return
        try:
            if ok:
                fut.set_result(value)
            else:
                from ..folder.outcomes import task_error as _task_error

                rec = Record(int(Kind.ERROR), 0, 0, index, seed=seed)
                fut.set_exception(_task_error(value, self._job.name, rec).as_original_type())
        except cf.InvalidStateError:
            pass

    def _cancel_task(self, index: int) -> None:
        from ..core import control

        # the queue knows the task before it is cancelled there
        if self._link is None:
            self._count_now()
        else:  # in memory at the controller; its payload may still be on its way to the file
            with self._job.store.locked_queue() as q:
                q.grow(index + 1)
        control.cancel_task(self._job.cluster, self._job.handle, index)

    def _collect(self) -> None:
        job = self._job
        reader = job.handle.reader
        # With a controller handing values back, the journal is only a fallback: looked
        # at four times a second rather than woken by every result.
        fd = -1 if self._link is not None else os.open(job.store.path / "notify.fifo", os.O_RDWR | os.O_NONBLOCK)
        last_poll = time.monotonic()
        try:
            while True:
                if fd < 0:
                    self._stop.wait(0.25)
                    r: list[Any] = []
                else:
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
                        job.cluster.poll(job.handle)
                    except Exception:
                        pass
                with self._lock:
                    if self._stop.is_set() and not self._futures:
                        return
                    if self._stop.is_set() and job.store.queue().cancelled:
                        for f in self._futures.values():
                            f.cancel()
                        return
        finally:
            if fd >= 0:
                os.close(fd)

    def _resolve(self) -> None:
        job = self._job
        with self._lock:
            for i in [i for i, f in self._futures.items() if f.cancelled()]:
                del self._futures[i]
            ready = [i for i in self._futures if i in job.handle.outcomes]
        for i in ready:
            with self._lock:
                fut = self._futures.pop(i, None)
            if fut is None or fut.done():
                continue
            try:
                value = value_of(job, i)
            except Exception as exc:
                value = TaskError(f"cannot read the result: {exc}", index=i, job=job.name)
            try:
                rec = job.handle.outcomes[i][1]
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
        if self._link is not None:
            self._to_write.put(None)
            self._payload_thread.join()
        else:
            self._count_now()  # every task counted before the job is closed
        with self._job.store.locked_queue() as q:
            q.close()
            waiting = q.waiting_fifos()
        for fifo in waiting:
            _wake(fifo)
        self._writer.close()
        if self._link is not None:
            self._link.refresh_queue()  # it sees the job closed now, not at its next look
        self._stop.set()
        if self._link is None:
            self._news.set()  # the counter thread ends
        if wait:
            self._thread.join()
            if self._link is not None:  # the futures came from memory: wait for the folder
                self._link.finished.wait()
            if not self._keep:
                self._job.purge()
