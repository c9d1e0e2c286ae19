"""A worker given its tasks runs them in a child process it watches, so that a task that
kills its process takes no other task with it.

An array element of a batch scheduler, or a process of a user's scheduler plugin, is given
a list of tasks (``--tasks``, or its chunk of a submission). Unwatched, a task that crashed
its process (a segfault, the kernel's OOM killer, ``os._exit``, a value whose pickling
dies) ended the element, and every task of the list without an outcome was reported lost
with it, those never started included. Here the element's process forks a worker for the
list and waits for it (:func:`supervise`). When that worker dies (by a signal, or with an
exit code no worker gives itself), the watcher reads what it left (its journal, and its
map ``workers/<w>.cur``, which names the task it was running or pickling the value of),
writing nothing:

- the task its map names is the culprit: it stays without an outcome, for what reports
  the element's end to report lost (the backend's poll with the scheduler's reason, or the
  library for a worker of this machine: :meth:`FolderHandle.vanished`, which leaves a
  watched worker alone while its watcher lives), and it runs again as any lost task does
  (``retries=``, a new submission);
- the tasks with an outcome in its journal are done;
- the others run in a new worker (``<w>.1``, ``<w>.2``...), which writes each outcome
  alone: values that were to be pickled together, one of which killed the worker, then
  come back one at a time, and the one that kills again is named.

Once the rest has run, the watcher ends as the culprit's process did (killed by the same
signal, SIGKILL or SIGTERM; else its exit code), so its scheduler sees what it saw before.
A death that names no task and leaves no new outcome is not a task's doing (the worker
cannot start, the node is failing): the watcher stops there and ends as its worker did.
Signals sent to the watcher (a scheduler's cancel, its walltime) go to the worker, which is
not started again after them; a watcher killed outright takes its worker with it
(``PR_SET_PDEATHSIG``, on Linux). Nothing it does writes to the job folder: with remote
storage the folder it reads is a copy whose shared files the client keeps.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from ..folder import records
from ..folder.journal import finished_by
from ..folder.records import FLAG_RERUN, Kind
from ..folder.store import SEVERAL, JobStore
from ..util.signals import ended

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
    or killed its worker (see the module): ``run(worker_id, tasks, alone)`` runs them in the
    child and returns its exit code (``alone``: each outcome written alone). Returns this
    process's exit code, when it does not end by the signal that ended a culprit."""
    store = JobStore(job_dir)
    rest, alone, n, failed = list(tasks), False, 0, False
    culprit_death = 0  # how the last worker that a task killed ended (0: none was)
    child = 0
    signalled: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        signalled.append(signum)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    before = {s: signal.signal(s, forward) for s in _FORWARDED}
    watcher = os.getpid()
    try:
        while True:
            name = wid if n == 0 else f"{wid}.{n}"
            child = os.fork()
            if child == 0:
                _child(name, rest, alone, run, before, watcher)
            code = _wait(child)
            if signalled:  # (its worker ended with it): end as a process that got it would
                _die_by(signalled[0], before)
                return _exit_code(code)
            if code in _OWN_CODES:
                return _end_as(culprit_death) if culprit_death else (1 if failed and code == 0 else code)
            left, culprit, progress = _after_death(store, name, rest, alone)
            failed = failed or _raised(store, name, rest)  # (it would have ended 1)
            if culprit >= 0:
                culprit_death = code
            elif not progress:
                print(f"elsewhere worker {name}: {_death(code)} before any task of its own did: not started again",
                      file=sys.stderr, flush=True)  # fmt: skip
                return _end_as(culprit_death or code)
            if not left:
                return _end_as(culprit_death) if culprit_death else (1 if failed else 0)
            print(f"elsewhere worker {name}: {_death(code)}" + (f" in task {culprit}" if culprit >= 0 else "")
                  + f"; {len(left)} of its tasks go on in a new worker", file=sys.stderr, flush=True)  # fmt: skip
            rest, alone, n = left, True, n + 1
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _child(name: str, tasks: list[int], alone: bool, run: Callable[[str, list[int], bool], int],
           handlers: Mapping[signal.Signals, Any], watcher: int) -> None:  # fmt: skip
    """The forked worker: never returns."""
    code = 1
    try:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        _die_with_parent()
        if os.getppid() != watcher:  # the watcher died before that took hold: nobody to run for
            os._exit(1)
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
    """End this process by ``signum``, which it was sent (its scheduler sees a job killed by
    that signal, as without a watcher), unless its handler before :func:`supervise` was not
    the default one (Python's, for SIGINT)."""
    if handlers.get(signal.Signals(signum)) in (signal.SIG_DFL, signal.default_int_handler):
        _kill_self(signum)


def _kill_self(signum: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if signum != signal.SIGKILL:  # (whose handler cannot be set)
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


def _end_as(code: int) -> int:
    """End as a worker that ended with ``code`` did: killed by SIGKILL or SIGTERM, by the
    same (what schedulers and plugins read a lost task's cause from); else the exit code
    (another signal re-raised here would write a core or a traceback of this process)."""
    if code in (-signal.SIGKILL, -signal.SIGTERM):
        _kill_self(-code)
    return _exit_code(code)


def _death(code: int) -> str:
    return f"its process {ended(code)}"  # (SIGKILL: what a memory limit does, the kernel's or a scheduler's)


def _raised(store: JobStore, wid: str, tasks: list[int]) -> bool:
    """Whether dead worker ``wid`` wrote an error as the outcome of one of ``tasks``."""
    try:
        with open(store.journal_path(wid), "rb") as f:
            recs, _ = records.parse_frames(f.read())
    except OSError:
        return False
    given = set(tasks)
    return any(r.kind == Kind.ERROR and not r.flags & FLAG_RERUN and r.task in given for r in recs)


def _after_death(store: JobStore, wid: str, rest: list[int], alone: bool) -> tuple[list[int], int, bool]:
    """What worker ``wid``, dead, given ``rest``, left: (the tasks still to run, the task its
    map names or -1, whether it left an outcome or named a task, or died pickling the values
    of several together, which they each alone tell apart (not again once ``alone``)). Read only."""
    q = store.queue()
    done = finished_by(store, wid, q)
    idx, _, _ = store.read_running(wid)
    left = [t for t in rest if t not in done]
    culprit = idx if idx in left else -1
    progress = culprit >= 0 or len(left) < len(rest) or (idx == SEVERAL and not alone)
    skip = q.cancelled_tasks
    left = [t for t in left if t != culprit and t not in skip] if not q.cancelled else []
    return left, culprit, progress
