"""What a scheduler says about one job or array element, and helpers to read its output.

:class:`NativeStatus` is what every status and accounting parser returns, keyed by native id;
:func:`parse_int` reads the numbers schedulers print (``-``, ``N/A`` and kin are None), and
:func:`protocol_error` is the error for output a parser cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass

from elsewhere.util.errors import SchedulerError
from elsewhere.util.states import TaskState

__all__ = ["NativeStatus", "parse_int", "protocol_error"]


@dataclass(frozen=True)
class NativeStatus:
    """What a scheduler says about one job or array element.

    Attributes:
        native_id: the element's id in the scheduler's own form, e.g. ``"123_4"``
            (SLURM), ``"123.4"`` (SGE task, HTCondor cluster.proc),
            ``"123[4].server"`` (PBS), ``"123[4]"`` (LSF).
        native_state: the raw state text, as printed.
        state: ``native_state`` mapped through the scheduler's table; ``None``
            when the state is unknown (the caller logs it and carries on).
        reason: why, where the scheduler says: ``"Resources"``, ``"TIMEOUT"``,
            ``"OUT_OF_MEMORY"``, a hold reason...
        exit_code: the exit code of the element's script, where known.
        job_id: the parent (array) job id.
        array_index: the element's index in the scheduler's own base, or None
            for a job that is not an array.
    """

    native_id: str
    native_state: str
    state: TaskState | None
    reason: str = ""
    exit_code: int | None = None
    job_id: str = ""
    array_index: int | None = None


def protocol_error(scheduler: str, what: str, text: str) -> SchedulerError:
    """The error for output a parser cannot read (the text is kept in ``stderr``)."""
    if what.startswith(f"{scheduler}: cannot parse "):
        what = what[len(f"{scheduler}: cannot parse ") :]
    return SchedulerError(f"{scheduler}: cannot parse {what}", stderr=text)


def parse_int(text: str) -> int | None:
    """An int, or None for empty / ``-`` / ``undefined`` / ``N/A`` and other non-numbers."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            return None
        return int(f) if f.is_integer() else None
