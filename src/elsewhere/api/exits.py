"""How the ``elsewhere`` command ends: its exit codes, and the one line each error becomes.

Every command runs inside :func:`run`, the command line's one error boundary. No command
prints a Python traceback: an error becomes one line on stderr, ``elsewhere: ...``, that says
what was wrong and what to do, and one of these exit codes (docs/cli.md):

=====  ==================================================================================
0      done (``wait``: the job finished)
1      a job or a task failed (``wait``: the job ended failed or cancelled; ``doctor``: a
       check failed), or an error on the way: a scheduler, a host, the disk, the registry,
       a damaged job folder, or an unexpected error (a bug: its line says how to see the
       traceback)
2      usage: a bad argument or option; or no such job (never made, or purged, by another
       process meanwhile too: then the line says the job is gone)
124    ``wait --timeout`` ran out; the job goes on running (as ``timeout(1)``)
130    interrupted (Ctrl-C); a job goes on running
=====  ==================================================================================

``ELSEWHERE_DEBUG=1`` (or ``elsewhere --debug ...``) prints the traceback before the line.
The errors of a scheduler or a host keep their detail lines (the command, its exit code and
the tail of its stderr) after the first.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable

from ..util.docsite import page
from ..util.errors import ConfigError, ElsewhereError, JobNotFound, TimeoutError

__all__ = [
    "EPILOG",
    "FAILED",
    "INTERRUPTED",
    "OK",
    "TIMEOUT",
    "USAGE",
    "debugging",
    "describe",
    "run",
]

OK = 0
FAILED = 1
USAGE = 2
TIMEOUT = 124
INTERRUPTED = 130

#: the exit codes, for the end of ``elsewhere --help``
EPILOG = f"""\
exit codes:
  0    done (wait: the job finished)
  1    a job or task failed (wait: it ended failed or cancelled; doctor: a check failed),
       or an error: a scheduler, a host, the disk, the registry, a damaged job folder
  2    usage: a bad argument or option; or no such job (never made, or purged)
  124  wait --timeout ran out (the job goes on running)
  130  interrupted (Ctrl-C)
ELSEWHERE_DEBUG=1 (or --debug) prints the traceback of an error. See {page("cli")}"""

_DEBUG_HINT = "run with ELSEWHERE_DEBUG=1 (or --debug) for the traceback"


def debugging(args: argparse.Namespace | None = None) -> bool:
    """Whether ``--debug`` was given or ``ELSEWHERE_DEBUG`` is set (to anything but 0)."""
    if getattr(args, "debug", False):
        return True
    return os.environ.get("ELSEWHERE_DEBUG", "") not in ("", "0")


def run(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run the command ``func(args)``; its exit code, or the one of the error it raised (which
    is written to stderr as one line, see :func:`describe`)."""
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        name = getattr(args, "name", None)
        hint = (
            f"; job {name!r} goes on running (`elsewhere cancel {name}` stops it)" if name else ""
        )
        print(f"elsewhere: interrupted{hint}", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): not an error of ours; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK
    except Exception as exc:
        code, line = describe(exc)
        if debugging(args):
            import traceback

            traceback.print_exception(exc)
        print(line, file=sys.stderr, flush=True)
        return code


def describe(exc: BaseException) -> tuple[int, str]:
    """The exit code for ``exc`` and the line that tells it (``elsewhere: ...``)."""
    if isinstance(exc, ElsewhereError):
        if isinstance(exc, TimeoutError):
            return TIMEOUT, f"elsewhere: {exc}"
        code = USAGE if isinstance(exc, (ConfigError, JobNotFound)) else FAILED
        return code, f"elsewhere: {exc}"
    if isinstance(exc, OSError):
        return _os_error(exc)
    sqlite3 = sys.modules.get("sqlite3")  # not loaded: not its error
    if sqlite3 is not None and isinstance(exc, sqlite3.Error):
        from ..util import paths

        why = " ".join(str(exc).split())
        return FAILED, (f"elsewhere: the job registry {paths.registry_path()} cannot be used ({why}): "
                        "another process may hold it (try again), or it is damaged")  # fmt: skip
    text = " ".join(str(exc).split())
    return FAILED, f"elsewhere: {type(exc).__name__}{': ' + text if text else ''} ({_DEBUG_HINT})"


def _os_error(exc: OSError) -> tuple[int, str]:
    what = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    where = f": {exc.filename}" if exc.filename else ""
    # (a job purged meanwhile is a JobGone: this is something else missing)
    if isinstance(exc, FileNotFoundError):
        return FAILED, f"elsewhere: no such file or folder{where}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            FAILED,
            f"elsewhere: {what}{where}: free some space there (or raise the quota), then try again",
        )
    if isinstance(exc, PermissionError):
        return (
            FAILED,
            f"elsewhere: {what}{where}: check the owner and mode of that file and its folder",
        )
    return FAILED, f"elsewhere: {what}{where}"
