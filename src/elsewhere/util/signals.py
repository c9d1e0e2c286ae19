"""Words for how a process ended: one wording for every backend.

A process that exits says its code; one killed by a signal is named by the signal, with what
that signal usually means::

    exit code 2
    killed by SIGSEGV (signal 11: a crash)
    killed by SIGKILL (signal 9: out of memory, or killed by a user or a limit)
    killed by SIGTERM (signal 15)

A signal comes in three forms: a Python return code (``Popen.returncode``, negative: -11), a
shell's exit status (128 + 11 = 139, what batch schedulers report) and the number itself.
"""

from __future__ import annotations

import signal

__all__ = ["CRASHES", "describe_returncode", "describe_status", "ended", "killed_by", "signal_name"]

CRASHES = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
"""The signals a process gets for its own fault (compiled code that crashed, or aborted)."""

_KILL_HINT = "out of memory, or killed by a user or a limit"


def signal_name(number: int) -> str:
    """``"SIGSEGV"``, or ``"signal 99"`` for a number this system does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def killed_by(number: int, why: str = "") -> str:
    """``"killed by SIGSEGV (signal 11: a crash)"``: the signal named, with ``why`` it came
    if the caller knows (else what it usually means: a crash, or out of memory for SIGKILL)."""
    if not why:
        if number == signal.SIGKILL:
            why = _KILL_HINT
        elif number in CRASHES:
            why = "a crash"
    name = signal_name(number)
    if name.startswith("signal "):  # no name: the number alone
        return f"killed by {name}" + (f" ({why})" if why else "")
    return f"killed by {name} (signal {number}" + (f": {why})" if why else ")")


def describe_returncode(returncode: int) -> str:
    """A Python return code in words: ``"exit code 2"``; a negative one is the signal that
    killed the process (``"killed by SIGKILL (signal 9: ...)"``)."""
    if returncode < 0:
        return killed_by(-returncode)
    return f"exit code {returncode}"


def ended(returncode: int) -> str:
    """How a process ended, after its name ("its process ..."): ``"exited with code 3"``, or
    ``"was killed by SIGKILL (signal 9: ...)"`` for a negative Python return code."""
    if returncode < 0:
        return f"was {killed_by(-returncode)}"
    return f"exited with code {returncode}"


def describe_status(status: int) -> str:
    """A shell's exit status in words (what batch schedulers report): above 128 and at most
    192, the process was (most likely) killed by signal ``status - 128``:
    ``"exit code 139: killed by SIGSEGV (signal 11: a crash)"``; else ``"exit code 3"``."""
    if 128 < status <= 192:
        return f"exit code {status}: {killed_by(status - 128)}"
    return f"exit code {status}"
