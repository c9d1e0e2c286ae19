"""Exceptions raised by elsewhere.

Every error elsewhere raises on its own account derives from
:class:`ElsewhereError`::

    ElsewhereError
    ├── ConfigError              bad input: an argument, a profile, a template
    │   ├── ProfileNotFound      on="name" names no profile
    │   └── NoSuchTask           a task index the job does not have (also an IndexError)
    ├── SerializationError       a function or an argument cannot be serialised
    ├── JobError                 a job cannot be created, found or used
    │   ├── JobNotFound          no job of that name or id in the registry
    │   │   └── JobGone          the job was purged under us (also a FileNotFoundError)
    │   ├── NameInUse            a running job already has that name
    │   ├── StateError           a move the state does not allow (cancel a finished task,
    │   │                        retry a running one, add tasks to a closed job)
    │   └── DamagedJob           a file of the job folder is damaged (also a ValueError)
    ├── TimeoutError             wait(timeout=...) ran out (also a builtins.TimeoutError)
    ├── SchedulerError           a scheduler command failed (command, exit code, stderr tail)
    │   └── CommandNotFound      a scheduler or transport command is not installed
    ├── TransportError           a remote host cannot be used (host, command, stderr tail)
    │   ├── HostUnreachable      connection refused, no route, name not known
    │   ├── AuthenticationError  the host refused our user or key
    │   ├── HostKeyError         the host key is unknown or changed
    │   └── RemoteSetupError     no Python / no elsewhere / no writable folder there
    ├── PeerError                the peer network refused or failed
    │   └── ProtocolError        a peer sent bytes that are not a valid, authentic frame
    ├── UnsupportedPlatform      this system lacks what elsewhere needs (fcntl, /proc)
    │                            (also an ImportError)
    └── TaskError                a task raised; carries the remote type, message,
                                 traceback, host, task index and seed

A :class:`TaskError` raised by ``map`` is, where the original exception type
can be rebuilt, an instance of a subclass of both ``TaskError`` and that type,
so ``except ValueError`` catches a task's ``ValueError``.
"""

from __future__ import annotations

import builtins
from typing import Any


class ElsewhereError(Exception):
    """Base of every exception elsewhere raises on its own account."""


class ConfigError(ElsewhereError, ValueError):
    """Bad input: an argument, a profile or a template that cannot be used."""


class ProfileNotFound(ConfigError):
    """``on="name"`` names a profile that no configuration file defines."""


class NoSuchTask(ConfigError, IndexError):
    """A task index that the job does not have (``job.retry([99])`` of a job of 3 tasks)."""


class SerializationError(ElsewhereError, TypeError):
    """A function or argument cannot be serialised; the message names it."""


class JobError(ElsewhereError):
    """A job cannot be created, found or used."""


class JobNotFound(JobError, KeyError):
    """No job of that name or id is in the registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class JobGone(JobNotFound, FileNotFoundError):
    """The job was purged while it was being used (by another process, or earlier by this
    one): its folder is gone. Also a FileNotFoundError, for code that met the folder's files
    vanishing before this class existed."""


class NameInUse(JobError):
    """A job of this name is still running."""


class StateError(JobError):
    """A move that the task and job states do not allow (see :mod:`elsewhere.util.states`):
    cancelling a task that has ended, retrying one that runs, adding tasks to a closed job."""


class DamagedJob(JobError, ValueError):
    """A file of a job folder is damaged: cut, garbage, or a checksum that does not hold.

    Attributes: ``path`` (the file, as the job folder names it: ``results/w3.bin``),
    ``what`` (what is wrong), ``task`` (the task whose data it held, or None). Also a
    ValueError, which is what a damaged folder raised before this class existed.
    """

    def __init__(self, path: str, what: str, *, task: int | None = None) -> None:
        self.path = path
        self.what = what
        self.task = task
        where = f", task {task}" if task is not None else ""
        super().__init__(f"damaged: {path}{where}, {what}")

    def __reduce__(self) -> Any:
        return (_rebuild_damaged, (self.path, self.what, self.task))


def _rebuild_damaged(path: str, what: str, task: int | None) -> DamagedJob:
    return DamagedJob(path, what, task=task)


class TimeoutError(ElsewhereError, builtins.TimeoutError):
    """A wait ran out of time; the job goes on running."""


class SchedulerError(ElsewhereError):
    """A scheduler command failed.

    Attributes: ``command`` (the argv), ``returncode``, ``stderr`` (its tail).
    """

    def __init__(
        self,
        message: str,
        *,
        command: list[str] | None = None,
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.command = command
        self.returncode = returncode
        self.stderr = stderr
        parts = [message]
        if command is not None:
            parts.append(f"command: {' '.join(command)}")
        if returncode is not None:
            parts.append(f"exit code: {returncode}")
        if stderr:
            parts.append("stderr: " + _tail(stderr))
        super().__init__("\n  ".join(parts))


class CommandNotFound(SchedulerError):
    """A command that a cluster needs is not installed or not on PATH."""


class TransportError(ElsewhereError):
    """A remote host cannot be reached or used.

    Attributes: ``host``, ``command`` (the argv that failed), ``returncode``,
    ``stderr`` (its tail).
    """

    def __init__(
        self,
        message: str,
        *,
        host: str = "",
        command: list[str] | None = None,
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.host = host
        self.command = command
        self.returncode = returncode
        self.stderr = stderr
        parts = [message]
        if host:
            parts.append(f"host: {host}")
        if command is not None:
            parts.append(f"command: {' '.join(command)}")
        if returncode is not None:
            parts.append(f"exit code: {returncode}")
        if stderr:
            parts.append("stderr: " + _tail(stderr))
        super().__init__("\n  ".join(parts))


class HostUnreachable(TransportError):
    """The host does not answer: refused, no route, unknown name, timeout."""


class AuthenticationError(TransportError):
    """The host refused the user or key."""


class HostKeyError(TransportError):
    """The host's key is not known, or has changed."""


class RemoteSetupError(TransportError):
    """The host lacks what a worker needs: Python, elsewhere, a writable folder."""


class PeerError(ElsewhereError):
    """The peer network refused a task or failed."""


class ProtocolError(PeerError):
    """Bytes from a peer that are not a valid, authentic frame or datagram."""


class UnsupportedPlatform(ElsewhereError, ImportError):
    """This system lacks what elsewhere (or the part of it in use) needs: POSIX file locks
    (``fcntl``; not on Windows) or Linux's ``/proc`` (a peer worker). The message says what
    is missing and what to do (``elsewhere.util.system``)."""


def _tail(text: str, lines: int = 12, chars: int = 2000) -> str:
    tail = "\n".join(text.strip().splitlines()[-lines:])
    return tail[-chars:]


class RemoteTraceback(Exception):
    """The traceback of a task, as text; set as ``__cause__`` of a TaskError."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb.rstrip()


class TaskError(ElsewhereError):
    """A task raised an exception (or was lost or cancelled).

    Attributes:
        type_name: qualified name of the original exception type ("ValueError").
        message: ``str()`` of the original exception.
        traceback: the remote traceback, as text.
        host: where the task ran.
        index: the task's 0-based index in its job.
        seed: the seed the task ran with.
        job: the job's name.
        reason: ``"error"`` for an exception, ``"lost"`` when the worker vanished,
            ``"cancelled"``, or a scheduler's reason (``"timeout"``, ``"memory"``).
        exception: the original exception object when it could be unpickled, else None.
    """

    def __init__(
        self,
        message: str = "",
        *,
        type_name: str = "Exception",
        traceback: str = "",
        host: str = "",
        index: int = -1,
        seed: int | None = None,
        job: str = "",
        reason: str = "error",
        exception: BaseException | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
        self.host = host
        self.index = index
        self.seed = seed
        self.job = job
        self.reason = reason
        self.exception = exception
        if traceback:
            self.__cause__ = RemoteTraceback(traceback)

    def __str__(self) -> str:
        where = f" on {self.host}" if self.host else ""
        job = f" of job {self.job!r}" if self.job else ""
        who = f"rank {self.rank}" if self.rank is not None else f"task {self.index}"
        if self.reason == "error":
            return f"{who}{job} raised {self.type_name}{where}: {self.message}"
        return f"{who}{job} {self.reason}{where}: {self.message}"

    def __repr__(self) -> str:
        return f"TaskError(index={self.index}, type={self.type_name!r}, message={self.message!r})"

    def _repr_html_(self) -> str:
        """The error as HTML, for Jupyter: what happened, then the remote traceback (all
        escaped: a message is the task's text, not markup)."""
        from html import escape

        tb = ""
        if self.traceback:
            tb = ('<details open><summary>remote traceback</summary><pre style="white-space:pre-wrap">'
                  f"{escape(self.traceback.rstrip())}</pre></details>")  # fmt: skip
        return (f'<div class="elsewhere-task-error"><b style="color:#c62828">TaskError ({escape(self.type_name)})'
                f"</b>: {escape(str(self))}{tb}</div>")  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TaskError):
            return NotImplemented
        return (self.index, self.type_name, self.message, self.reason) == (
            other.index,
            other.type_name,
            other.message,
            other.reason,
        )

    def __hash__(self) -> int:
        return hash((self.index, self.type_name, self.message, self.reason))

    def _fields(self) -> dict[str, Any]:
        return {
            "type_name": self.type_name,
            "traceback": self.traceback,
            "host": self.host,
            "index": self.index,
            "seed": self.seed,
            "job": self.job,
            "reason": self.reason,
            "rank": self.rank,
        }

    def __reduce__(self) -> Any:
        return (_rebuild_task_error, (self.message, self._fields()))

    def reraise(self) -> None:
        """Raise this error as the original exception type where possible."""
        raise self.as_original_type() from self.__cause__

    def as_original_type(self) -> TaskError:
        """This error as an instance of ``TaskError`` *and* the original type.

        Falls back to ``self`` where the original type cannot be combined
        (unknown, or a type whose layout forbids it).
        """
        exc = self.exception
        if exc is None or isinstance(exc, TaskError):
            return self
        base = type(exc)
        try:
            cls: Any = type(f"TaskError[{base.__name__}]", (TaskError, base), {"__module__": __name__})
            err = cls.__new__(cls)
            Exception.__init__(err, self.message)
            TaskError.__init__(err, self.message, exception=exc, **self._fields())
            err.__dict__.update({k: v for k, v in getattr(exc, "__dict__", {}).items() if k not in err.__dict__})
        except Exception:
            return self
        return err


def _rebuild_task_error(message: str, fields: dict[str, Any]) -> TaskError:
    return TaskError(message, **fields)
