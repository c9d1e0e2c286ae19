"""Waiting for a job to reach a state: ``job.wait()``, ``ew.map``, ``elsewhere wait``.

The waiter sleeps on the job's ``notify.fifo`` (a worker writes a byte there after new
results), not on a timer, and looks at the backend (``poll``) on a growing interval: often
at first, at most every 5 s where workers share the file system (results arrive there by
themselves) and every second where results come by polling. Waiting for the end of a job of
known size, a wake-up that leaves tasks without an outcome cannot end the wait: only the
journals are read then, the whole state (queue, running tasks, the progress bar) at most
every ``LOOK_S``. A caller may also end the wait at any wake-up (``until``): ``job.as_completed``
ends it when new outcomes are in, an asyncio waiter when its task is cancelled.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..folder.handle import JobHandle
from ..util.errors import TimeoutError
from ..util.states import JobState, TaskState
from . import control

if TYPE_CHECKING:
    from ..backends.base import Cluster
    from ..folder.snapshot import Snapshot

LOOK_S = 0.1  # the whole state is read at least this often


def wait_for(cluster: Cluster, handle: JobHandle, target: JobState, *, timeout: float | None,
             progress: bool | None, poll_interval_s: float, n_known: int = 0,
             until: Callable[[], bool] | None = None) -> Snapshot | None:  # fmt: skip
    """Block until the job of ``handle`` reaches ``target`` (any end, for FINISHED); raise
    :class:`~elsewhere.TimeoutError` after ``timeout`` seconds (the job goes on running) and
    JobError if the job is purged meanwhile. ``n_known``: the job's task count when the wait
    is for its end (0: unknown, an open stream). ``until``: also return as soon as it is true,
    asked at every wake-up just after the journals were read (``handle.reader`` is fresh):
    at least every ``LOOK_S`` when ``n_known`` is given, else at every poll interval.
    Returns the snapshot that saw ``target`` reached (None when ``until`` ended the wait)."""
    from ..util.progress import Progress

    deadline = None if timeout is None else time.monotonic() + timeout
    fd = _open_notify(handle)
    bar = Progress(handle.name, enabled=progress)
    looked = time.monotonic() if n_known else 0.0  # just submitted: the journals first
    try:
        return _loop(cluster, handle, target, timeout, deadline, fd, bar, n_known, looked, poll_interval_s,
                     until)  # fmt: skip
    except FileNotFoundError:
        if handle.path.is_dir():
            raise
        raise control.gone(handle) from None
    finally:
        bar.close()
        if fd >= 0:
            os.close(fd)


def _loop(cluster: Cluster, handle: JobHandle, target: JobState, timeout: float | None,
          deadline: float | None, fd: int, bar: Any, n_known: int, looked: float,
          poll_interval_s: float, until: Callable[[], bool] | None = None) -> Snapshot | None:  # fmt: skip
    last_poll = time.monotonic()
    interval = poll_interval_s
    reader = handle.reader
    while True:
        now = time.monotonic()
        look = True
        if n_known and now - looked < LOOK_S:
            reader.refresh()
            look = len(reader.final) >= n_known
        if look:
            if not handle.path.is_dir():  # purged meanwhile (by another process)
                raise control.gone(handle)
            snap = control.snapshot(cluster, handle)
            st = snap.job_state()
            bar.update(snap.counts(), snap.n, snap.note)
            if st.rank >= target.rank:
                if snap.cancelled:  # perhaps by another process: the cluster acts on it
                    control.poll(cluster, handle)  # (a peer controller here tells its workers)
                return snap
            looked = now = time.monotonic()
        if until is not None and until():
            return None
        if deadline is not None and now >= deadline:
            snap = control.snapshot(cluster, handle)  # the last word, and the message's
            st = snap.job_state()
            if st.rank >= target.rank:
                return snap
            held = f"; {snap.note}" if snap.note else ""
            raise TimeoutError(
                f"job {handle.name!r} did not reach {target.value} within {timeout} s "
                f"(now {st.value}: {_fmt_counts(snap.counts())}{held}); it goes on running"
            )
        if now - last_poll >= interval:
            control.poll(cluster, handle)
            last_poll = now
            # Results from other machines arrive by polling: poll often there.
            interval = min(interval * 1.5, 5.0 if cluster.shares_filesystem() else 1.0)
        left = interval - (now - last_poll)
        if n_known:
            left = min(left, looked + LOOK_S - now)
        if deadline is not None:
            left = min(left, deadline - now)
        if fd >= 0:
            if _readable(fd, max(0.0, left)):
                _drain(fd)
                interval = poll_interval_s
        else:
            time.sleep(min(max(0.0, left), 0.05))


def _open_notify(handle: JobHandle) -> int:
    try:
        return os.open(handle.path / "notify.fifo", os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return -1


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _fmt_counts(counts: dict[TaskState, int]) -> str:
    return ", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no tasks"


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable within ``timeout`` seconds (poll: any descriptor
    number, where select stops at 1024)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(timeout * 1000))
