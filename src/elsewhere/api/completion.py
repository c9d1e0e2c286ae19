"""Results as they finish: ``job.as_completed()``, ``async for ... in job`` and ``await job``.

Who talks to whom::

    for i, r in job.as_completed():          async for i, r in job:        await job
                 |                                   |                         |
           Completed.__next__            Completed.__anext__         Job._wait_stoppable
                 |                                   |                         |
                 |                      in_thread: one step in a thread, a stop event
                 |                      set when the awaiting task is cancelled
                 +---------------+-------------------+-------------------------+
                                 |
        waiting.wait_for(until=...): the job's own waiter (the notify FIFO, polls on a
        growing interval), ended early by new outcomes or by the stop event
                                 |
        the job's journal reader (``handle.reader``): which tasks have an outcome

A step takes, in one go, every task whose outcome the reader holds and that was not handed
out yet (sorted by when they ended), then hands them out one by one, reading each value as it
goes; only when none is left does it wait. A value is read as ``job.results()`` reads it (one ``OutcomeReader``): a failed
task's entry is its :class:`~elsewhere.TaskError`, a lost one's says why, and once the job has
ended, the tasks without an outcome are its cancelled ones.

Cancel-safety: a thread is never left waiting for ever. The stop event is asked at every
wake-up of the waiter (at least every ``waiting.LOOK_S``; for ``await`` on an open
``Executor`` job, at every poll interval, 5 s at most), and an outcome that a step found for
an awaiting task cancelled meanwhile is put back, to be handed out by the next step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..core import control, waiting
from ..folder.records import Kind
from ..util.errors import ConfigError, JobError, TaskError, TimeoutError
from ..util.states import JobState, TaskState

if TYPE_CHECKING:
    from ..backends.base import Cluster
    from ..folder.handle import JobHandle
    from ..folder.outcomes import OutcomeReader
    from ..folder.snapshot import Snapshot

T = TypeVar("T")
R = TypeVar("R")

_END = object()  # what a step returns once every task has been handed out
#: At most this share of the time goes to looking for new outcomes (a look walks the tasks
#: still to come or those with an outcome, whichever are fewer: a job of a million tasks
#: is looked at about twice a second, a job of thousands at every wake-up).
SCAN_SHARE = 0.1

#: One task's outcome as a step hands it out: (index, value or TaskError, whether it failed).
Item = tuple[int, Any, bool]
#: A task found with an outcome, its value not read yet: (index, its entry in the reader's
#: outcomes or None, the snapshot to read it with or None).
Found = tuple[int, Any, "Snapshot | None"]


class Completed(Generic[T]):
    """``(index, result)`` of each task of a job as it finishes: what
    :meth:`Job.as_completed <elsewhere.Job.as_completed>` returns.

    An iterator (``for i, r in ...``) and an asynchronous iterator (``async for i, r in
    ...``), the latter waiting in a thread so that the event loop runs on. Use one way at a
    time. ``remaining`` tells how many tasks are still to come.
    """

    def __init__(self, handle: JobHandle, cluster: Cluster, outcomes: OutcomeReader, *,
                 timeout: float | None, errors: str, poll_interval_s: float) -> None:  # fmt: skip
        if errors not in ("raise", "return"):
            raise ConfigError(f'errors must be "raise" or "return", not {errors!r}')
        self._handle = handle
        self._cluster = cluster
        self._outcomes = outcomes
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._errors = errors
        self._poll_interval_s = poll_interval_s
        if handle.stream:  # its calls are retired from the reader once their futures have them
            raise ConfigError(f"job {handle.name!r} is an ew.Executor's: its results come as the "
                              "futures' (concurrent.futures.as_completed(futures))")  # fmt: skip
        self._left = set(range(handle.n_tasks))  # not handed out, nor found and queued in _ready
        self._ready: deque[Found] = deque()  # found, to be read and handed out in this order
        self._back: deque[Item] = deque()  # read for an awaiter cancelled meanwhile: first out
        self._scanned = -1  # the reader's count of changes at the last look for new outcomes
        self._scan_after = 0.0  # no look before (monotonic time): see SCAN_SHARE
        self._ended = False
        self._lock = threading.Lock()  # one step at a time (a cancelled awaiter's thread ending)

    @property
    def remaining(self) -> int:
        """How many tasks have not been handed out yet."""
        return len(self._left) + len(self._ready) + len(self._back)

    def __repr__(self) -> str:
        return f"<results of job {self._handle.name!r} as they finish: {self.remaining} to come>"

    # -- the two ways to iterate --------------------------------------------------------
    def __iter__(self) -> Completed[T]:
        return self

    def __next__(self) -> tuple[int, T | TaskError]:
        item = self._step(None)
        if item is _END or item is None:
            raise StopIteration
        return self._deliver(item)

    def __aiter__(self) -> Completed[T]:
        return self

    async def __anext__(self) -> tuple[int, T | TaskError]:
        item = await in_thread(self._step, put_back=self._put_back)
        if item is _END or item is None:
            raise StopAsyncIteration
        return self._deliver(item)

    # -- one step -------------------------------------------------------------------------
    def _deliver(self, item: Item) -> tuple[int, Any]:
        index, value, failed = item
        if failed and self._errors == "raise":
            raise value.as_original_type() from value.__cause__
        return index, value

    def _put_back(self, item: Any) -> None:
        """An item a step found for an awaiter that was cancelled meanwhile: the next step
        hands it out (called on the event loop's thread: it never waits for the lock)."""
        if isinstance(item, tuple):
            self._back.appendleft(item)

    def _step(self, stop: threading.Event | None) -> Any:
        """The next item; ``_END`` once every task was handed out; None if ``stop`` was set
        before one came. Raises TimeoutError when the deadline passes first."""
        with self._lock:
            while True:
                if self._back:
                    return self._back.popleft()
                if self._ready:
                    item = self._read(*self._ready.popleft())
                    if item is not None:
                        return item
                    continue
                if self._ended:
                    return _END
                if stop is not None and stop.is_set():
                    return None
                self._take_new()
                if self._ready:
                    continue
                if self._wait(stop):
                    snap = control.snapshot(self._cluster, self._handle)
                    self._take_new(force=True)
                    self._take_rest(snap)
                    self._ended = True

    def _wait(self, stop: threading.Event | None) -> bool:
        """Wait for new outcomes, the job's end or ``stop``; True if the job has ended."""
        reader = self._handle.reader
        back = self._back

        def news() -> bool:
            if back or (stop is not None and stop.is_set()):
                return True
            return reader.changes != self._scanned and time.monotonic() >= self._scan_after

        left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            waiting.wait_for(self._cluster, self._handle, JobState.FINISHED, timeout=left, progress=False,
                             poll_interval_s=self._poll_interval_s,
                             n_known=self._handle.n_tasks, until=news)  # fmt: skip
        except TimeoutError:
            self._take_new(force=True)  # what came in at the last moment goes first
            if self._ready or self._back:
                return False
            raise self._timed_out() from None
        return not news()

    def _timed_out(self) -> TimeoutError:
        snap = control.snapshot(self._cluster, self._handle)
        counts = ", ".join(f"{n} {s.value}" for s, n in snap.counts().items() if n) or "no tasks"
        left = self.remaining
        return TimeoutError(
            f"{left} of {snap.n} task{'s' if snap.n != 1 else ''} of job {self._handle.name!r} "
            f"{'have' if left != 1 else 'has'} not finished within {self._timeout} s (now {counts}); "
            "the job goes on running"
        )

    def _take_new(self, force: bool = False) -> None:
        """Queue the tasks whose outcome the journal reader holds and that were not handed out,
        in the order they ended (unless the last look was too recent, see SCAN_SHARE, and not
        ``force``)."""
        reader = self._handle.reader
        reader.refresh()
        t0 = time.monotonic()
        if reader.changes == self._scanned or (t0 < self._scan_after and not force):
            return
        self._scanned = reader.changes
        final = reader.final
        left = self._left
        # the shorter of the two: the tasks still to come, or those with an outcome (by entry:
        # the tasks of a range record at once)
        if len(left) <= len(final):
            get = final.get
            new = [(t, e) for t in left if (e := get(t)) is not None]
        else:
            new = [(t, e) for e, tasks in final.by_entry().items() for t in tasks if t in left]
        self._scan_after = t0 + (time.monotonic() - t0) / SCAN_SHARE
        new.sort(key=lambda te: (te[1][1].t_end, te[0]))
        for t, entry in new:
            left.discard(t)
            self._ready.append((t, entry, None))

    def _take_rest(self, snap: Snapshot) -> None:
        """The job has ended: queue the tasks without an outcome (its cancelled ones); a task
        without one that was not cancelled raises JobError, as ``job.results()`` does."""
        missing = 0
        for t in sorted(self._left):
            entry = snap.final.get(t)
            if entry is None and snap.task_state(t) is not TaskState.CANCELLED:
                missing += 1
                continue
            self._ready.append((t, entry, snap))
        self._left.clear()
        if missing:
            raise JobError(f"job {self._handle.name!r} has ended with {missing} of {snap.n} tasks without a "
                           "result (its folder may be damaged: `elsewhere status` says more)")  # fmt: skip

    def _read(self, t: int, entry: Any, snap: Snapshot | None) -> Item | None:
        """Task ``t``'s value, as ``job.results()`` reads it; None if its outcome was forgotten
        meanwhile (``job.retry()`` runs it again: it comes when that run ends)."""
        try:
            value = self._outcomes.value(t, snap)
        except JobError:
            self._left.add(t)
            return None
        failed = isinstance(value, TaskError) and (
            entry is None or entry[1].kind != Kind.OK or value.reason == "damaged"
        )  # (a TaskError a task returned as its value is a value)
        if failed and self._handle.communicating:
            value.rank = t
        return t, value, failed


async def in_thread(
    fn: Callable[[threading.Event], R], *, put_back: Callable[[R], None] | None = None
) -> R:
    """``fn(stop)`` run in a thread of its own, awaited without blocking the event loop.

    Cancelling the awaiting task sets ``stop``, which ``fn`` must heed soon (every wait here
    asks it at each wake-up), so no thread is left behind; a value ``fn`` returns for a task
    cancelled meanwhile goes to ``put_back`` rather than being lost. The thread is a daemon:
    an interpreter that exits does not wait for it.
    """
    import asyncio  # (here: the command line, which never awaits, does not pay its import)

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[R] = loop.create_future()
    stop = threading.Event()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.cancelled():
            if exc is None and put_back is not None:
                put_back(value)
        elif exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def run() -> None:
        value: Any = None
        exc: BaseException | None = None
        try:
            value = fn(stop)
        except BaseException as e:  # handed to the awaiter, whatever it is
            exc = e
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:  # the loop has closed: no one awaits this any more
            if exc is None and put_back is not None:
                put_back(value)

    threading.Thread(target=run, name="elsewhere-await", daemon=True).start()
    try:
        return await fut
    except asyncio.CancelledError:
        stop.set()
        if fut.done() and not fut.cancelled() and fut.exception() is None and put_back is not None:
            put_back(fut.result())  # it came just as the awaiter was cancelled
        raise
