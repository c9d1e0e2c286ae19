"""The local backend's worker processes, as its client sees them: those it starts (and reaps,
so they do not stay zombies), those on their way to a job (noted in the job's queue), and
whether one was lost before it joined; taking idle ones, waking, stopping and killing them.
See ``local.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder.journal import lock_is_free, reap
from ..run.kit import remove_kit
from ..util.system import process_alive

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ..folder.handle import JobHandle
    from ..folder.queue import Queue

__all__ = [
    "ended_badly",
    "kill",
    "killed_by_signal",
    "lost_at_start",
    "note_dispatched",
    "note_spawned",
    "reap_children",
    "stop_idle_workers",
    "take_idle",
    "take_idle_or_returning",
    "tell_to_exit",
    "wake",
]

_spawned: list[int] = []  # workers this process started and has not reaped yet
_ended: dict[int, int] = {}  # the wait status of the last of them that ended (pid -> status)


def note_spawned(pid: int) -> None:
    """This process started worker ``pid``: :func:`reap_children` collects it once it ends."""
    _spawned.append(pid)


def note_dispatched(q: Queue, use: list[tuple[str, int]], count: int) -> list[str]:
    """Record in queue ``q`` that the idle workers ``use`` and ``count - len(use)`` new ones
    are on their way; returns the new ones' ids."""
    new = [
        f"{os.uname().nodename}-{os.getpid()}-{os.urandom(4).hex()}"
        for _ in range(count - len(use))
    ]
    q.note_dispatched([w for w, _ in use] + new, time.time())
    return new


def lost_at_start(job: JobHandle, q: Queue, wid: str, late: bool) -> bool:
    """Whether worker ``wid``, on its way to ``job``, ended before it joined: it took its lock
    and let it go; or the process started for it (which forks it) ended by a signal or an
    error and this process saw it (:func:`ended_badly`); or, ``late`` (on its way for seconds),
    that process has ended and it never took its lock. Not sooner in that last case: on a
    busy machine a worker's interpreter may take seconds to start, after the process that
    forked it has ended."""
    cur = job.store._p("workers", f"{wid}.cur")
    if os.path.exists(cur):
        return lock_is_free(cur)
    by = q.started_by(wid)
    if by is None or by[1] != os.uname().nodename:
        return False
    if ended_badly(by[0]):
        return True  # this process started it and saw it fail or be killed: no need to wait
    return late and not process_alive(by[0])


def reap_children() -> None:
    """Collect the exit status of workers this process started that have ended, so
    they do not stay zombies while it lives (a notebook may run for days)."""
    for pid in list(_spawned):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, -1  # not ours to wait for any more (reaped elsewhere)
        if done:
            _spawned.remove(pid)
            if status >= 0:
                _ended[pid] = status
                while len(_ended) > 256:
                    del _ended[next(iter(_ended))]


def ended_badly(pid: int) -> bool:
    """Whether worker ``pid``, which this process started, has ended by a signal or with an
    error status (an interpreter that cannot start exits at once, with an error). False if
    unknown (not ours, or not ended) or if it exited cleanly."""
    reap_children()
    status = _ended.get(pid)
    return status is not None and (os.WIFSIGNALED(status) or os.waitstatus_to_exitcode(status) != 0)


def killed_by_signal(pid: int) -> bool:
    """Whether worker ``pid``, which this process started, was ended by a signal (killed from
    outside: a kill, the OOM killer) rather than exiting by itself, as a worker whose
    interpreter cannot start does. False if unknown (not ours, or not ended)."""
    reap_children()
    status = _ended.get(pid)
    return status is not None and os.WIFSIGNALED(status)


def take_idle(pool: Path, limit: int | None = None) -> list[tuple[str, int]]:
    """Take idle workers of the pool folder ``pool`` (at most ``limit``): [(wid, fifo fd)];
    each is ours alone (the rename of its marker ``idle/<wid>`` to ``taken/<wid>`` succeeded here
    only; the worker renames it back when it is idle again: ``run/idlecore.py``)."""
    taken: list[tuple[str, int]] = []
    idle, fifos = os.path.join(pool, "idle"), os.path.join(pool, "fifo")  # (strings: a Path a name costs)
    took = os.path.join(pool, "taken")
    try:
        names = os.listdir(idle)
    except FileNotFoundError:
        return []
    for wid in names:
        if limit is not None and len(taken) >= limit:
            break
        if not _take(os.path.join(idle, wid), took, wid):
            continue  # another client, or the worker itself, was first
        fifo = os.path.join(fifos, wid)
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            # No reader: the worker died. Clean up after it.
            forget_worker(pool, wid)
            continue
        taken.append((wid, fd))
    return taken


def _take(marker: str, took: str, wid: str) -> bool:
    """Rename ``marker`` into the folder ``took``; False if it is gone (taken by another)."""
    for first in (True, False):
        try:
            os.rename(marker, os.path.join(took, wid))
            return True
        except FileNotFoundError:
            if not first or not os.path.exists(marker):
                return False
            os.makedirs(took, mode=0o700, exist_ok=True)  # a pool folder of before taken/
    return False


def forget_worker(pool: str | os.PathLike[str], wid: str) -> None:
    """Remove what worker ``wid`` of pool folder ``pool`` left, found dead (killed): its FIFO, its
    marker, its kit of files for a next job."""
    for path in (os.path.join(pool, "fifo", wid), os.path.join(pool, "taken", wid)):
        try:
            os.unlink(path)
        except OSError:
            pass
    remove_kit(pool, wid)


RETURNING_S = 0.05
"""How long a client waits for busy workers of the pool to come back idle before it starts new
ones: a worker that has just left a finished job (the one before, submitted back to back) is
idle again within a few ms, where a new worker costs tens of ms and stays until its idle
timeout, one more than the cores it was meant for."""


def _any_busy(pool: Path, taken: list[tuple[str, int]], exclude: Callable[[], Iterable[str]]) -> bool:
    """Whether a live worker of the pool is neither idle nor among ``taken`` nor ``exclude()``
    (asked only if some FIFO is not idle: the job's own workers, say, which do not come back for
    it). A FIFO that no process reads is no worker's (one starting opens its own at once): it
    does not count, and goes once it is a minute old (its worker was killed)."""
    try:
        fifos = os.listdir(pool / "fifo")
        idle = set(os.listdir(pool / "idle"))
    except FileNotFoundError:
        return False
    mine = {wid for wid, _ in taken}
    others = [wid for wid in fifos if wid not in idle and wid not in mine]
    skip = set(exclude()) if others else set()
    for wid in others:
        if wid in skip:
            continue
        path = pool / "fifo" / wid
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # (opened and closed: nothing sent)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                with contextlib.suppress(OSError):
                    if time.time() - os.stat(path).st_ctime > 60:
                        forget_worker(pool, wid)
            continue
        return True
    return False


def take_idle_or_returning(pool: Path, limit: int, wait_s: float = RETURNING_S,
                           exclude: Callable[[], Iterable[str]] = tuple) -> list[tuple[str, int]]:  # fmt: skip
    """:func:`take_idle`, and while fewer than ``limit`` were taken and other workers of the pool
    are busy, the ones that come back idle within ``wait_s``; busy workers named by ``exclude()``
    (the job's own) are not waited for."""
    taken = take_idle(pool, limit)
    if len(taken) >= limit:
        return taken
    busy = _any_busy(pool, taken, exclude)
    taken += take_idle(pool, limit - len(taken))  # (any that came back while that was looked at)
    if not busy:
        return taken
    deadline = time.monotonic() + wait_s
    while len(taken) < limit and time.monotonic() < deadline:
        time.sleep(0.0005)
        taken += take_idle(pool, limit - len(taken))
    return taken


def stop_idle_workers(home: Path) -> int:
    """Ask the idle workers of every pool under ``home`` to exit; how many were asked.

    Every pool: one per interpreter *as it was named* (``.venv/bin/python`` and
    ``.venv/bin/python3`` are two pools of one interpreter), per ``python=`` and per version
    of elsewhere; ``elsewhere workers stop`` means them all. Busy workers are left alone."""
    reap_children()
    try:
        pools = [home / "local" / name for name in os.listdir(home / "local")]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return sum(tell_to_exit(take_idle(pool)) for pool in pools)


def tell_to_exit(idle: list[tuple[str, int]]) -> int:
    """Ask the idle workers ``idle`` (taken: ``[(wid, fifo fd)]``) to exit; how many were asked."""
    asked = 0
    for _wid, fd in idle:
        try:
            os.write(fd, b"exit\n")
            asked += 1
        except OSError:
            pass
        os.close(fd)
    return asked


def wake(fifo: str | None) -> None:
    """Wake a worker that waits on its FIFO (a newline is "look again")."""
    if not fifo:
        return
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def kill(member: dict[str, Any]) -> None:
    """Kill a worker and everything it started (it leads its own session; one a plugin
    started may lead none: then itself)."""
    pid = int(member.get("pid", 0))
    if pid <= 0 or lock_is_free(member.get("lock", "")):
        return  # already gone; its pid may belong to someone else by now
    for signal_it in (os.killpg, os.kill):
        try:
            signal_it(pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


def stop_running_here(job: JobHandle, index: int) -> None:
    """Kill the worker of this machine that claimed task ``index`` from the job's queue and
    runs it now, whoever started it (the local backend, or a plugin's processes, which cannot
    tell which of them runs a task); the rest of its claim goes back to the queue. A worker of
    another machine is its backend's to stop."""
    here = os.uname().nodename
    with job.store.locked_queue() as q:
        hit = [m for wid, m in q.members.items() if m.get("state") == "active" and m.get("host") == here
               and job.store.runs_task(wid, m, index)]  # fmt: skip
        for m in hit:
            kill(m)
        if hit:
            reap(job.store, q)
