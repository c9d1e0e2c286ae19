"""The machinery behind ``ew.Executor``: one open-ended *stream* job and its futures.

Each ``submit`` appends a task to the job's payload and wakes a waiting worker; a collector
thread reads the workers' journals and completes the futures::

    submit() ──append──> payload.log
    counter thread ──n──> queue.json ──wake──> worker FIFOs
    collector thread <──notify.fifo── workers <──claim── queue.json
         └── Future.set_result / set_exception

``submit`` writes the task (so what cannot be pickled fails there); a task submitted while
none is pending is counted in the queue at once, one submitted while others are pending is
left to the counter thread, which counts all that came meanwhile and wakes waiting workers:
one queue update for a burst of submits, not one each.

A cluster that runs a controller in this process (the peers) takes the calls in memory
instead (``streamwriter.py``).

Nothing here holds the :class:`~.executor.Executor` itself: its threads and futures hold this
:class:`Stream`, so an executor that is dropped is collected, and its finaliser shuts the
stream down (see ``executor.py``). A call is *running* (in the standard's sense: it can no
longer be cancelled) once a worker has claimed it, as ProcessPoolExecutor's calls are once
they are in its call queue.
"""

from __future__ import annotations

import collections
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
from ..folder.errorrecord import ErrorRecord
from ..folder.records import Kind
from ..util.errors import TaskError
from .futures import StreamFuture, raised
from .job import Job, value_of
from .streamwriter import write_payload_behind

log = logging.getLogger("elsewhere.api.executor")

_POLL_S = 1.0  # the cluster is polled (lost workers, replacements) this often


class Stream:
    """An Executor's job, its threads and its unfinished futures (see the module)."""

    def __init__(self, job: Job[Any], *, keep: bool, detach: bool, max_calls: int | None,
                 wrap: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None) -> None:  # fmt: skip
        from ..folder.payload import PayloadWriter
        from .job import write_and_submit

        self.job = job
        self.keep = keep
        self.detach = detach
        self.max_calls = (
            max_calls  # None: no limit; else at most this many calls sent and unfinished
        )
        self.wrap = wrap  # (fn, args, kwargs) -> the entry written (an initializer's wrapping)
        self.writer = PayloadWriter(
            job.store.path / "payload.log", compress=not job.cluster.shares_filesystem()
        )
        # (the job's function and data are written by write_and_submit, once)
        self.lock = threading.Lock()
        self.futures: dict[int, StreamFuture] = {}  # sent, unfinished
        self.held: collections.deque[tuple[StreamFuture, Any]] = collections.deque()  # not sent yet
        self.n = 0
        self.shutdown_started = False
        self.closing = False
        self.by_value_cache: dict[Any, Any] = {}
        write_and_submit(job, None, [])
        self.stop = threading.Event()
        self.ended = threading.Event()  # the collector has ended (every future resolved)
        self.link: Any = None  # the in-process controller that takes tasks in memory
        link = getattr(job.cluster, "executor_link", None)
        if link is not None:
            self.link = link(job.handle, self._on_outcome)
            self.pickle_lock = threading.Lock()
            self.to_write: queue.SimpleQueue[Any] = queue.SimpleQueue()
            self.payload_thread = threading.Thread(target=write_payload_behind, args=(self,), daemon=True,
                                                   name="elsewhere-executor-payload")  # fmt: skip
            self.payload_thread.start()
        else:
            self.queued = 0  # the tasks the queue counts
            self.count_lock = threading.Lock()  # one count at a time, so the queue's n only grows
            self.news = threading.Event()
            self.count_thread = threading.Thread(target=self._count_tasks, daemon=True,
                                                 name="elsewhere-executor-queue")  # fmt: skip
            self.count_thread.start()
        job.handle.reader.track = []  # the calls read, retired once their futures are done
        self.thread = threading.Thread(target=self._collect, name="elsewhere-executor", daemon=True)
        self.thread.start()

    # -- submitting -------------------------------------------------------------------------
    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> StreamFuture:
        entry = self.wrap(fn, args, kwargs) if self.wrap is not None else (fn, args, kwargs)
        fut = StreamFuture(self)
        with self.lock:
            if self.shutdown_started:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self.max_calls is not None and (self.held or len(self.futures) >= self.max_calls):
                self._check(entry)  # what cannot be pickled fails here, as it would if sent
                self.held.append((fut, entry))
                return fut
        self._send(fut, entry)
        return fut

    def _check(self, entry: Any) -> None:
        from ..folder import serial

        with self._by_value(entry[0]):
            serial.check_serialisable(None, [entry])

    def _send(self, fut: StreamFuture, entry: Any) -> None:
        """Write (or hand the controller) the call ``entry`` of ``fut``: it is in the job now."""
        if self.link is not None:
            self._send_direct(fut, entry)
            return
        from ..folder import serial

        with self.lock:
            if self.shutdown_started and self.stop.is_set():
                raise RuntimeError("cannot schedule new futures after shutdown")
            index = self.n
            try:
                with self._by_value(entry[0]):
                    self.writer.write_tasks(index, [entry])
            except Exception:
                serial.check_serialisable(None, [entry])
                raise
            fut._ew_index = index
            self.futures[index] = fut
            self.n += 1
            lone = len(self.futures) == 1
        if lone:
            self.count_now()  # nothing else pending: into the queue now, no hand-over
        else:
            self.news.set()  # a burst: the counter thread counts what has come meanwhile at once

    def _send_direct(self, fut: StreamFuture, entry: Any) -> None:
        from ..folder import serial

        by_value = self._by_value(entry[0])
        # Pickled here, once, for the controller to send (the function once per function):
        # what cannot be sent fails at once. The payload writer pickles the objects later.
        try:
            prepared = self.link.prepare(entry)
        except Exception:
            serial.check_serialisable(None, [entry])
            raise
        with self.lock:
            if self.shutdown_started and self.stop.is_set():
                raise RuntimeError("cannot schedule new futures after shutdown")
            index = self.n
            self.n += 1
            fut._ew_index = index
            self.futures[index] = fut
            self.to_write.put((index, entry, by_value, fut))
        # outside the lock: the controller calls _on_outcome holding its own
        self.link.put(index, entry, prepared)

    def _release(self) -> None:
        """Send held calls while fewer than ``max_calls`` are out (a call just finished);
        after shutdown, the job closes once the last is sent."""
        while True:
            with self.lock:
                if not self.held:
                    last = self.shutdown_started and not self.closing
                    break
                if len(self.futures) >= (self.max_calls or 0):
                    return
                fut, entry = self.held.popleft()
            if fut.done():
                continue
            try:
                self._send(fut, entry)
            except BaseException as exc:  # a call that cannot be sent fails; the others go on
                with contextlib.suppress(cf.InvalidStateError):
                    fut.set_exception(
                        exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
                    )
        if last:  # not in this thread: it may be the controller's, which closing waits for
            threading.Thread(
                target=self._close_job, name="elsewhere-executor-close", daemon=True
            ).start()

    def _count_tasks(self) -> None:
        """The counter thread: count the tasks written in the queue, wake workers."""
        while not self.stop.is_set():
            self.news.wait()
            self.news.clear()
            try:
                self.count_now()
            except BaseException:
                log.exception("cannot count the executor's tasks in job %r", self.job.name)

    def count_now(self) -> None:
        if self.link is not None:
            return
        with self.count_lock:
            with self.lock:
                n = self.n  # every one of them is in the payload
            if n <= self.queued:
                return
            with self.job.store.locked_queue() as q:
                q.grow(n)
                waiting = q.waiting_fifos()
                need = q.live_members() + len(
                    q.dispatched()
                ) < q.max_workers and q.n - q.next > len(waiting)
            self.queued = n
        for fifo in waiting:
            _wake(fifo)
        added = getattr(self.job.cluster, "tasks_added", None)
        if added is not None:
            added(self.job.handle)  # backends that push tasks hear of them at once
        elif need:
            self.job.cluster.poll(self.job.handle)

    def _by_value(self, fn: Any) -> Any:
        """``serial.by_value_for([fn])``, decided once per module (the decision looks
        the module up on ``sys.path``: hundreds of microseconds)."""
        from ..folder import serial

        name = getattr(fn, "__module__", None)
        bv = self.by_value_cache.get(name)
        if bv is None:
            bv = serial.by_value_for([fn], shared_fs=self.job.cluster.shares_filesystem())
            if len(self.by_value_cache) < 256:
                self.by_value_cache[name] = bv
        return bv

    # -- the state of a call -----------------------------------------------------------------
    def taken(self, index: int) -> bool:
        """Whether a worker has taken task ``index`` (it runs, or is about to)."""
        if self.link is not None:
            return bool(self.link.is_running(index))
        try:
            q = self.job.store.queue()
        except Exception:
            return False
        return index < q.next and index not in q.to_rerun

    def withdraw(self, fut: StreamFuture) -> bool:
        """Take ``fut``'s call back, if no worker has taken it: True if it will not run."""
        with self.lock:
            for k, (f, _) in enumerate(self.held):
                if f is fut:
                    del self.held[k]
                    return True
        index = fut._ew_index
        if index < 0:
            return True
        if self.link is not None:
            if not self.link.withdraw(index):
                return False
            with self.job.store.locked_queue() as q:
                q.grow(index + 1)
                q.cancel_task(index)
        else:
            self.count_now()  # the queue knows the task before it is cancelled there
            with self.job.store.locked_queue() as q:
                if index < q.next and index not in q.to_rerun:
                    return False
                q.cancel_task(index)
        with self.lock:
            self.futures.pop(index, None)
        self._release()
        return True

    def kill(self, fut: StreamFuture) -> bool:
        """Stop ``fut``'s call wherever it is, running or not; False if it had ended."""
        if fut.done():
            return False
        if fut.cancel():
            return True
        from ..core import control

        index = fut._ew_index
        if self.link is None:
            self.count_now()
        else:
            with self.job.store.locked_queue() as q:
                q.grow(index + 1)
        control.cancel_task(self.job.cluster, self.job.handle, index)
        with contextlib.suppress(cf.InvalidStateError):
            fut.set_exception(TaskError("the call was killed (Executor.kill)", type_name="Cancelled",
                                        index=index, job=self.job.name, reason="cancelled"))  # fmt: skip
        with self.lock:
            self.futures.pop(index, None)
        self._release()
        return True

    # -- outcomes -----------------------------------------------------------------------------
    def _settle(self, fut: StreamFuture, ok: bool, value: Any) -> None:
        """Complete ``fut`` (outside the lock): with ``value``, or with the exception it gives."""
        try:
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        except cf.InvalidStateError:
            pass
        if self.held:
            self._release()

    def _on_outcome(self, index: int, ok: bool, value: Any, seed: int) -> None:
        """The controller thread: task ``index`` ended with ``value`` (an error description
        unless ``ok``); its record follows in the job folder."""
        with self.lock:
            fut = self.futures.pop(index, None)
        if fut is None or fut.done():
            return
        if not ok:
            value = raised(
                ErrorRecord.from_value(value).task_error(self.job.name, index=index, seed=seed)
            )
        self._settle(fut, ok, value)

    def _collect(self) -> None:
        """The collector thread: resolve futures from the journals until the stream ends."""
        job = self.job
        # With a controller handing values back, the journal is only a fallback: looked
        # at four times a second rather than woken by every result.
        fd = -1
        try:
            if self.link is None:
                fd = os.open(job.store.path / "notify.fifo", os.O_RDWR | os.O_NONBLOCK)
                self.poller = select.poll()
                self.poller.register(fd, select.POLLIN)
            last_poll = time.monotonic()
            said = -1e9
            while True:
                try:
                    if self._turn(fd, last_poll):
                        break
                except BaseException:  # never dies: every later future would hang
                    if time.monotonic() - said > 60:  # the same error each turn: said once a minute
                        said = time.monotonic()
                        log.exception("the executor of job %r met an error; it goes on", job.name)
                    self.stop.wait(0.25)
                now = time.monotonic()
                if now - last_poll > _POLL_S:
                    last_poll = now
                    with contextlib.suppress(Exception):
                        job.cluster.poll(job.handle)
            self._finish()
        finally:
            if fd >= 0:
                os.close(fd)
            self.ended.set()

    def _turn(self, fd: int, last_poll: float) -> bool:
        """One look at the journals; True when the stream has ended."""
        if fd < 0:
            self.stop.wait(0.25)
        else:
            if self.poller.poll(250):  # (poll: any descriptor number, where select stops at 1024)
                with contextlib.suppress(BlockingIOError):
                    while os.read(fd, 4096):
                        pass
        reader = self.job.handle.reader
        reader.refresh()
        self._resolve()
        with self.lock:  # the records of calls whose futures are done: the memory stays flat
            reader.retire_tracked(self.futures)
        with self.lock:
            if not self.stop.is_set():
                return False
            if not self.futures and not self.held:
                return True
        if self.job.store.queue().cancelled:
            with self.lock:
                futs = list(self.futures.values()) + [f for f, _ in self.held]
                self.futures.clear()
                self.held.clear()
            for f in futs:
                if not f.cancel():
                    with contextlib.suppress(cf.InvalidStateError):
                        f.set_exception(
                            TaskError(
                                "the executor's job was cancelled",
                                type_name="Cancelled",
                                index=f._ew_index,
                                job=self.job.name,
                                reason="cancelled",
                            )
                        )
            return True
        return False

    def _resolve(self) -> None:
        job = self.job
        outcomes = job.handle.outcomes
        with self.lock:
            for i in [i for i, f in self.futures.items() if f.cancelled()]:
                del self.futures[i]
            ready = [i for i in self.futures if i in outcomes]
        try:
            for i in ready:
                with self.lock:
                    fut = self.futures.pop(i, None)
                if fut is None or fut.done():
                    continue
                kind = outcomes[i][1].kind
                try:
                    value = value_of(job, i)
                except BaseException as exc:  # a value that cannot be unpickled here
                    err = TaskError(f"the result of task {i} cannot be read here: {type(exc).__name__}: {exc}",
                                    type_name=type(exc).__name__, index=i, job=job.name)  # fmt: skip
                    err.__cause__ = exc
                    self._settle(fut, False, err)
                    continue
                if kind == Kind.OK:
                    self._settle(fut, True, value)
                elif isinstance(value, TaskError):
                    self._settle(fut, False, raised(value))
                else:
                    self._settle(
                        fut,
                        False,
                        TaskError(f"task {i} ended without a value", index=i, job=job.name),
                    )
        finally:
            job._outcomes.cache.clear()  # a body is read once, by the futures of its group

    def _finish(self) -> None:
        """The last future is resolved and the stream closed: purge the job unless kept."""
        if self.link is not None:
            self.link.finished.wait(30)
        if not self.keep and not self.detach:
            try:
                self.job.purge()
            except Exception:
                log.warning(
                    "the executor's job %r could not be purged", self.job.name, exc_info=True
                )

    # -- ending ---------------------------------------------------------------------------------
    def close(self, *, cancel_futures: bool = False, kill: bool = False) -> None:
        """Take no more calls; close the job once the calls held back by ``max_workers`` are
        sent (workers end once it is done). With ``cancel_futures``, calls no worker has
        taken are cancelled; with ``kill``, every unfinished call is stopped."""
        with self.lock:
            if self.shutdown_started:
                return
            self.shutdown_started = True
            pending = list(self.futures.values()) + [f for f, _ in self.held]
        if kill:
            for f in pending:
                try:
                    self.kill(f)
                except Exception:
                    log.warning(
                        "a call of job %r could not be killed", self.job.name, exc_info=True
                    )
        elif cancel_futures:
            for f in pending:
                f.cancel()
        with self.lock:
            if self.held:
                return  # _release closes the job when it sends the last of them
        self._close_job()

    def _close_job(self) -> None:
        with self.lock:
            if self.stop.is_set() or self.closing:
                return
            self.closing = True
        if self.link is not None:
            self.to_write.put(None)
            self.payload_thread.join()
        else:
            self.count_now()  # every task counted before the job is closed
        with self.job.store.locked_queue() as q:
            q.close()
            waiting = q.waiting_fifos()
        for fifo in waiting:
            _wake(fifo)
        self.writer.close()
        if self.link is not None:
            self.link.refresh_queue()  # it sees the job closed now, not at its next look
        self.stop.set()
        if self.link is None:
            self.news.set()  # the counter thread ends

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every future and the job's end (and purge); False on a timeout."""
        return self.ended.wait(timeout)
