"""The error record: what a task that raised (or was lost, killed, refused) leaves behind.

Built in one place, :meth:`ErrorRecord.of_exception` (or the constructor, for a fate that no
exception tells: a lost or killed task, a result too large); every worker, MPI rank, peer task
process, peer daemon and controller writes it with :meth:`ErrorRecord.to_value`, and a
client makes a failed task's :class:`~elsewhere.util.errors.TaskError` from it with
:meth:`ErrorRecord.from_value` and :meth:`ErrorRecord.task_error`.

It is stored as a plain dict, in a result body of the job folder and in a peer's RESULT, so
that any reader, of any version, loads it without elsewhere's classes (and a peer daemon,
which never unpickles, pickles one without importing the task's)::

    key                    value
    "__elsewhere_error__"  1: this dict is an error record
    "type"                 the exception type's qualified name ("ValueError", "mymod.Bad")
    "message"              str() of the exception (with a hint, for a module not found)
    "traceback"            the formatted traceback; "" for a fate
    "host"                 where the task ran
    "pid"                  the process it ran in
    "index"                the task's index in its job
    "seed"                 the seed it ran with
    "exception"            the exception, pickled (protocol 5), if it pickles and loads back;
                           else None
    "bases"                the qualified names of the exception type's bases, nearest first
                           ("Exception", "BaseException" for a ValueError): what
                           ``retries=ew.Retry(on=...)`` matches, where the class itself
                           cannot be imported

Imported by a worker only when a task fails: nothing here is needed before.
"""

from __future__ import annotations

import os
from collections import namedtuple

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from ..util.errors import TaskError

__all__ = ["MARK", "ErrorRecord", "pickle_values"]

MARK = "__elsewhere_error__"
"""The key that marks a stored dict as an error record."""


class ErrorRecord(namedtuple(
    "ErrorRecord", "type_name message traceback host pid index seed exception bases",
    defaults=("", "", 0, -1, 0, None, ()),
)):
    """One failed run of one task: the typed form of the stored dict (see the module).

    Fields: ``type_name`` (the exception type's qualified name, or a fate such as
    ``"WorkerLost"``), ``message``, ``traceback`` (text), ``host``, ``pid``, ``index``,
    ``seed``, ``exception`` (the pickled exception, or None), ``bases`` (the names of the
    type's bases, nearest first; empty for a fate).
    """

    __slots__ = ()
    type_name: str
    message: str
    traceback: str
    host: str
    pid: int
    index: int
    seed: int
    exception: bytes | None
    bases: tuple[str, ...]

    @classmethod
    def of_exception(cls, exc: BaseException, host: str, index: int, seed: int) -> ErrorRecord:
        """The record of task ``index`` (seeded ``seed``) on ``host`` that raised ``exc``."""
        import traceback

        from ..util.retry import exception_name

        t = type(exc)
        name = exception_name(t)
        bases = tuple(exception_name(b) for b in t.__mro__[1:] if b is not object)
        try:
            message = str(exc)
        except Exception:
            message = f"<{name}>"
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            message += (f" (a module a task imports must be importable on {host}: installed there, in a "
                        "folder of the job's sys.path that it shares, or sent with files=[...])")  # fmt: skip
        elif isinstance(exc, KeyboardInterrupt) and not message:
            message = "interrupted"
        tb = "".join(traceback.format_exception(t, exc, exc.__traceback__))
        return cls(name, message, tb, host, os.getpid(), index, seed, _pickled(exc), bases)

    @classmethod
    def from_value(cls, value: Mapping[str, Any]) -> ErrorRecord:
        """The record a stored dict holds (a record of an earlier version lacks some keys: they
        read as empty)."""
        exception = value.get("exception")
        bases = value.get("bases")
        return cls(
            str(value.get("type", "Exception")), str(value.get("message", "")),
            str(value.get("traceback", "") or ""), str(value.get("host", "") or ""),
            _int(value.get("pid"), 0), _int(value.get("index"), -1), _int(value.get("seed"), 0),
            exception if isinstance(exception, (bytes, bytearray)) else None,
            tuple(str(b) for b in bases) if isinstance(bases, (list, tuple)) else (),
        )  # fmt: skip

    def to_value(self) -> dict[str, Any]:
        """The stored form: a plain dict (the module's table)."""
        return {
            MARK: 1,
            "type": self.type_name,
            "message": self.message,
            "traceback": self.traceback,
            "host": self.host,
            "pid": self.pid,
            "index": self.index,
            "seed": self.seed,
            "exception": self.exception,
            "bases": list(self.bases),
        }

    def explained(self, why: str) -> ErrorRecord:
        """This record, its message led by ``why`` ("the result of task 3 cannot be serialised")."""
        return self._replace(message=f"{why}: {self.message}")

    def original(self) -> BaseException | None:
        """The exception the task raised, where it can be loaded here; else None."""
        if not self.exception:
            return None
        import pickle

        try:
            exc = pickle.loads(self.exception)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None

    def task_error(self, job: str, *, index: int | None = None, seed: int | None = None) -> TaskError:
        """The :class:`~elsewhere.util.errors.TaskError` of this record, for job ``job``;
        ``index`` and ``seed`` as the journal tells them, where it does."""
        from ..util.errors import TaskError

        return TaskError(
            self.message, type_name=self.type_name, traceback=self.traceback, host=self.host,
            index=self.index if index is None else index, seed=self.seed if seed is None else seed,
            job=job, reason="error", exception=self.original(),
        )  # fmt: skip


def pickle_values(records: Iterable[ErrorRecord]) -> bytes:
    """A group of values made of error records only, pickled as a result group is (a list):
    a peer daemon writes the outcome of a task it lost or killed this way."""
    import pickle

    return pickle.dumps([r.to_value() for r in records], protocol=5)


def _pickled(exc: BaseException) -> bytes | None:
    """``exc`` pickled, if it loads back; a class of the caller's script or of a module sent by
    value goes by value, and the caller's cloudpickle maps it back to the caller's own class.

    An exception whose ``__init__`` takes other arguments than its ``args`` (a custom class
    whose ``__init__(self, a, b)`` passes one message up) pickles but does not load back the
    usual way: it goes as its type, ``args`` and attributes instead, rebuilt without calling
    ``__init__`` (:func:`rebuild_exception`)."""
    import pickle

    for obj in (exc, _AsState(exc)):
        for dumps in (_plain_dumps, _cloud_dumps):
            try:
                data = dumps(obj)
                pickle.loads(data)
            except Exception:
                continue
            return data
    return None


def _plain_dumps(obj: Any) -> bytes:
    import pickle

    return pickle.dumps(obj, protocol=5)


def _cloud_dumps(obj: Any) -> bytes:
    from .serial import dumps_inband

    return dumps_inband(obj)


class _AsState:
    """Pickles as :func:`rebuild_exception` of an exception's type, ``args`` and attributes."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> Any:
        exc = self.exc
        state = dict(getattr(exc, "__dict__", None) or {})
        return (rebuild_exception, (type(exc), exc.args, state))


def rebuild_exception(cls: type, args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    """An exception of type ``cls`` with ``args`` and attributes ``state``, made without
    calling its ``__init__`` (see :func:`_pickled`)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    if state:
        try:
            exc.__dict__.update(state)
        except AttributeError:  # a type without a __dict__: its args are all it has
            pass
    return exc


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
