"""A worker given its tasks runs them in a child process it watches, so that a task that
kills its process costs that task alone.

An array element of a batch scheduler, or a process of a user's scheduler plugin, is given
a list of tasks (``--tasks``, or its chunk of a submission). Unwatched, a task that crashed
its process (a segfault, the kernel's OOM killer, ``os._exit``, a value whose pickling
dies) ended the element, and every task of the list without an outcome was reported lost
with it, those never started included. Here the element's process forks a worker for the
list and waits for it (:func:`supervise`). When that worker dies (by a signal, or with an
exit code no worker gives itself), the watcher reads, under the job's queue lock, what it
left, as the local reaper does for a claiming worker (``journal.reap``):

- the task its map (``workers/<w>.cur``) names was running, or having its value pickled:
  it is failed as lost, with the end of its output, or runs again while the job's
  ``retries=`` last;
- the tasks with an outcome in its journal are done;
- the others run in a new worker (``<w>.1``, ``<w>.2``...), which writes each outcome
  alone: values that were to be pickled together, one of which killed the worker, then
  come back one at a time, and the one that kills again is named.

A death that names no task and leaves no new outcome is not a task's doing (the worker
cannot start, the node is failing): the watcher stops there and ends as its worker did,
and the backend reports the tasks as before. Signals sent to the watcher (a scheduler's
cancel, its walltime warning) go to the worker, which is not started again after them; a
watcher killed outright takes its worker with it (``PR_SET_PDEATHSIG``, on Linux).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from ..folder import records
from ..folder.journal import finished_by
from ..folder.records import Kind
from ..folder.store import CUR, JobStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["supervise"]

_OWN_CODES = (0, 1, 2, 75)  # what a worker exits with by itself (worker._main)
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def supervise(job_dir: str, wid: str, tasks: list[int], run: Callable[[str, list[int], bool], int]) -> int:
    """Run ``tasks`` of the job in ``job_dir`` in forked workers until each has an outcome
    (see the module): ``run(worker_id, tasks, alone)`` runs them in the child and returns its
    exit code (``alone``: each outcome written alone). Returns this process's exit code:
    0, or 1 when a task failed or was lost, or the last worker's when it was not restarted."""
    store = JobStore(job_dir)
    rest, alone, n, failed = list(tasks), False, 0, False
    child = 0
    signalled: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        signalled.append(signum)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    before = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        while True:
            name = wid if n == 0 else f"{wid}.{n}"
            child = os.fork()
            if child == 0:
                _child(name, rest, alone, run, before)
            code = _wait(child)
            if signalled:  # (its worker ended with it): end as a process that got it would
                _die_by(signalled[0], before)
                return _exit_code(code)
            if code in _OWN_CODES:
                return 1 if failed and code == 0 else code
            rest, lost, progress = _after_death(store, name, rest, _death(code))
            failed = failed or lost
            if not rest:
                return 1 if failed else 0
            if not lost and not progress:
                print(f"elsewhere worker {name}: {_death(code)} before any task of its own did: not started again",
                      file=sys.stderr, flush=True)  # fmt: skip
                return _exit_code(code)
            print(f"elsewhere worker {name}: {_death(code)}; {len(rest)} of its tasks go on in a new worker",
                  file=sys.stderr, flush=True)  # fmt: skip
            alone, n = True, n + 1
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _child(name: str, tasks: list[int], alone: bool, run: Callable[[str, list[int], bool], int],
           handlers: Mapping[signal.Signals, Any]) -> None:  # fmt: skip
    """The forked worker: never returns."""
    code = 1
    try:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        _die_with_parent()
        code = run(name, tasks, alone)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _die_by(signum: int, handlers: Mapping[signal.Signals, Any]) -> None:
    """End this process by ``signum`` (its scheduler sees a job killed by that signal, as
    without a watcher), unless its handler before :func:`supervise` was one of Python's."""
    if handlers.get(signal.Signals(signum)) not in (signal.SIG_DFL, signal.default_int_handler):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1)  # (delivered at once; should it be blocked, the caller returns a code)


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere nothing)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _wait(pid: int) -> int:
    """``pid``'s end as ``os.waitstatus_to_exitcode`` gives it (-N: killed by signal N)."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return 1
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return os.waitstatus_to_exitcode(status)


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _death(code: int) -> str:
    if code == -signal.SIGKILL:  # what a memory limit does, the kernel's or the scheduler's
        return "its process was killed by SIGKILL (out of memory, most likely: the element's limit or the kernel's)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"its process was killed by {signal.Signals(-code).name}"
        return f"its process was killed by signal {-code}"
    return f"its process exited with code {code}"


def _after_death(store: JobStore, wid: str, rest: list[int], why: str) -> tuple[list[int], bool, bool]:
    """Account for worker ``wid``, dead, given ``rest``: (the tasks still to run, whether one
    was failed as lost, whether it left an outcome or named a task)."""
    with store.locked_queue() as q:
        if q.cancelled:
            return [], False, True
        done = finished_by(store, wid, q)
        idx, since, log_off = store.read_running(wid)
        left = [t for t in rest if t not in done]
        lost = False
        named = idx in left
        if named:
            now = time.time()
            if idx in q.cancelled_tasks:  # stopped because it was cancelled: that is its outcome
                store.append_control([records.make_record(Kind.CANCELLED, idx, q.attempt(idx), t_start=since,
                                                          t_end=now)])  # fmt: skip
                left.remove(idx)
            else:
                used = q.count_attempt(idx)
                if used > q.retries:
                    log_len = max(0, _size(store.log_path(wid)) - log_off)
                    store.append_control([records.make_record(Kind.LOST, idx, used - 1, log_off=log_off,
                                                              log_len=log_len, t_start=since, t_end=now)])  # fmt: skip
                    q.lose(idx, reason=f"task {idx} was lost: {why}", by=wid)
                    left.remove(idx)
                    lost = True
        skip = q.cancelled_tasks
        left = [t for t in left if t not in skip]
    _settle(store, wid)
    return left, lost, named or len(left) < len(rest)


def _settle(store: JobStore, wid: str) -> None:
    """The dead worker's map says it runs nothing (its task is accounted for, once)."""
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(store.dir, "workers", f"{wid}.cur"), os.O_WRONLY)
        try:
            os.pwrite(fd, CUR.pack(-1, 0.0, 0), 0)
        finally:
            os.close(fd)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
