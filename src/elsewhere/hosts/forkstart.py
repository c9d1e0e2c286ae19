"""Starting a local worker as a fork of its starter, where that is safe: no new interpreter.

A new interpreter and the worker's imports take some 80-100 ms on a small machine, far more than
the whole of ProcessPoolExecutor's cold ``map`` of 10 000 no-ops, whose workers are forks. A
worker forked from the client that needs it skips both; :func:`can_fork` says when that is
safe, and :func:`fork_python_pid` starts it, detached the way
:func:`~.spawn.spawn_python_pid` starts one (its own session, stdin from ``/dev/null``, stdout
and stderr to the log, the environment a spawned worker gets, no descriptor of the starter's).

Safe means (else the worker is spawned, as always before):

- Linux, and the cluster's interpreter is this one (``python=`` left as it is: the same
  executable, no wrapper command, no setup lines);
- this process runs no thread but the calling one and elsewhere's housekeeping thread (whose
  state a child starts afresh), counted by the kernel (``/proc/self/task``): a fork copies
  only the thread that calls it, and a lock another thread held (a library's, a C library's,
  a BLAS pool's) would stay locked in the child forever;
- it has not loaded ``random`` nor ``numpy.random``: a worker that has loaded them seeds them
  before every task (per-task seeds, ``run/seeding.py``: some 9 us a task on a small machine,
  more than a no-op task costs), and a fork would carry them into the pool, where a worker
  started afresh loads them only for a task that uses them (``tempfile`` loads ``random``);
- its resident memory is at most :data:`FORK_RSS_MAX` (copying the page tables of a large
  client costs milliseconds, and the worker would carry its pages while it stays warm);
- ``ELSEWHERE_WORKER_START`` is not ``spawn`` (the way to turn it off).

In the child, before the worker runs: a session of its own; the cyclic garbage collector no
longer looks at the starter's objects (``gc.freeze``: the descriptors they hold are closed
below, and a file object finalised there would close a number the worker uses by then); the
signal handlers the starter set and its wakeup descriptor (an asyncio loop's) are undone; every
descriptor but 0, 1 and 2 is closed, and those three go to ``/dev/null`` and the log; the
environment is the one a spawned worker gets. The starter's stack is never unwound there: the
worker ends with ``os._exit``, so no ``atexit`` handler or ``finally`` of the starter runs twice.

Such a worker's command line is its starter's (``ps`` shows the client's); its name
(``/proc/PID/comm``) is ``ew-worker``.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence

from elsewhere.util.command import PythonCommand

from .spawn import _open_log, python_env, python_path

__all__ = ["FORK_RSS_MAX", "WORKER_NAME", "can_fork", "fork_python_pid"]

FORK_RSS_MAX = 512 << 20
"""The most resident memory a client may hold for its workers to start as its forks (bytes)."""

WORKER_NAME = b"ew-worker"
"""The process name (``/proc/PID/comm``) of a worker started as a fork."""


def can_fork(python: str | os.PathLike[str] | PythonCommand | None) -> bool:
    """Whether a worker of interpreter ``python`` may start as a fork of this process (see the
    module docstring)."""
    if os.environ.get("ELSEWHERE_WORKER_START", "") == "spawn":
        return False
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if isinstance(python, PythonCommand):
        if python.setup or len(python.words) != 1:
            return False
        python = python.words[0]
    if python_path(python) != sys.executable:
        return False
    from ..run.seeding import SEEDED_MODULES

    if any(name in sys.modules for name in SEEDED_MODULES):
        return False  # carried into the pool, they would be seeded before every task
    if not _threads_allow_fork():
        return False
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return False
    return rss <= FORK_RSS_MAX


def _threads_allow_fork() -> bool:
    """Whether this process runs no thread but the calling one and elsewhere's own that a fork
    may leave behind (the housekeeping's, whose state a child starts afresh), counted by the
    kernel, so that threads of C libraries (a BLAS pool) count too."""
    import threading

    from ..folder.housekeeping import FORK_SAFE_THREAD

    me = threading.current_thread()
    ours = [t for t in threading.enumerate() if t is not me]
    if any(t.name != FORK_SAFE_THREAD for t in ours):
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1 + len(ours)
    except OSError:
        return False


def fork_python_pid(
    main: Callable[[list[str]], int],
    args: Sequence[str],
    *,
    log: str | os.PathLike[str] | int | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run ``main(list(args))`` in a detached fork of this process (check :func:`can_fork`
    first) and return its pid, which the caller reaps as a spawned one's. ``args`` are what a
    spawned worker's interpreter would get after ``-c CODE`` (its ``sys.argv[1:]``)."""
    full_env = python_env(env)
    fd, owned = _open_log(log)
    for stream in (sys.stdout, sys.stderr):  # what the starter wrote is out before the fork
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    try:
        pid = os.fork()
        if pid == 0:  # the worker: it never returns from here
            code = 70
            try:
                _become_worker(fd, full_env, list(args))
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                try:
                    traceback.print_exc()
                    sys.stderr.flush()
                except BaseException:
                    pass
            finally:
                os._exit(code)
        return pid
    finally:
        if owned:
            os.close(fd)


def _become_worker(log_fd: int, env: Mapping[str, str], args: list[str]) -> None:
    """Leave the starter behind, in the forked child (see the module docstring)."""
    os.setsid()
    gc.freeze()
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread: none was set from here
        pass
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for name in os.listdir("/proc/self/fd"):  # (the listing's own descriptor is closed by then)
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:
                pass
    sys.stdin = open(0, closefd=False, encoding="utf-8")  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    sys.excepthook = sys.__excepthook__
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c", *args]
    try:
        with open("/proc/self/comm", "wb") as f:
            f.write(WORKER_NAME)
    except OSError:
        pass
