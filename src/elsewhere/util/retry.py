"""What a job runs again, and when: ``retries=`` of ``ew.submit``, ``ew.map`` and ``ew.create_job``.

``retries=N`` (a whole number) runs a task whose worker was lost (killed, crashed, its
scheduler job ended without a result) up to N times more, at once. :class:`Retry` says more::

    ew.submit(fetch, urls, retries=ew.Retry(times=3, on=(OSError, TimeoutError), lost=True,
                                            delay_s=1, backoff=2.0, max_delay_s=60))

A task that raises an exception of one of the types ``on`` (the class itself or a subclass) is
run again, up to ``times`` more runs in all, the k-th rerun ``delay_s * backoff**(k-1)``
seconds after the failure (at most ``max_delay_s``). Types are matched by name, as the error
record of the failed run names the exception's class and its bases (``folder/errorrecord.py``),
so the process that decides needs no import of them: a class given here is turned into its
name, and a name may be given instead (``"requests.exceptions.ConnectionError"``; a name
without a dot also matches a class of that name in any module).

Stored in ``job.json`` as two keys: ``"retries"``, the reruns of lost tasks (an int, as before
there was this class: ``times`` with ``lost=True``, else 0), and ``"retry"``, the policy for
errors (:meth:`Retry.spec`, a plain dict) when there is one. :func:`rerun_delay` reads that dict:
it is what a worker (and a peer controller) calls when a task fails, without this class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

__all__ = ["Retry", "exception_name", "rerun_delay"]


def exception_name(cls: type) -> str:
    """The name an error record gives the exception class ``cls``: ``"ValueError"`` for a
    builtin (and a class of ``__main__``), ``"module.Qualified.Name"`` for the others."""
    module = getattr(cls, "__module__", "") or ""
    qual = str(getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?"))
    return qual if module in ("builtins", "__main__") else f"{module}.{qual}"


def _names(on: Any) -> tuple[str, ...]:
    """``on=`` as the names of exception types (a class, a name, or an iterable of them)."""
    items = [on] if isinstance(on, (type, str)) else on
    if not isinstance(items, Iterable):
        raise ConfigError(f"Retry(on=...) takes exception classes or their names (OSError, "
                          f"'requests.exceptions.ConnectionError', or a tuple of them), not {on!r}")  # fmt: skip
    out: list[str] = []
    for item in items:
        if isinstance(item, type) and issubclass(item, BaseException):
            name = exception_name(item)
        elif isinstance(item, str) and item.strip() and not any(c.isspace() for c in item.strip()):
            name = item.strip()
        else:
            raise ConfigError(f"Retry(on=...) takes exception classes or their names, not {item!r}")
        if name not in out:
            out.append(name)
    return tuple(out)


@dataclass(frozen=True)
class Retry:
    """What to run again, how often, and how long after: the value of ``retries=``.

    Args:
        times: how many times a task may run again (its runs are then at most ``times + 1``),
            whatever brought each rerun (an error of a type ``on``, a lost worker).
        on: the exception types whose errors are run again: a class, its name
            (``"requests.exceptions.ConnectionError"``, or a bare ``"ConnectionError"``,
            which matches that class name in any module), or a tuple of them. A task's
            exception matches when its class or one of its bases is listed. Default
            ``Exception``: every error (not KeyboardInterrupt or SystemExit); ``()``: none.
        lost: also run again a task whose worker was lost (killed, crashed, out of memory,
            its scheduler job ended without a result), at once, as ``retries=N`` does.
        delay_s: seconds (or a duration, ``"30s"``, ``"2min"``) between a failure and the
            first rerun it brings.
        backoff: each later rerun of the task waits this many times longer (1: always
            ``delay_s``).
        max_delay_s: the longest wait before a rerun.

    ``retries=3`` is ``Retry(times=3, on=(), lost=True)``. An error that is run again leaves
    its record (its attempt number, its traceback) in the job folder; only the last run's
    outcome is the task's result. Where the wait is kept: the job's queue holds the task
    until then (local workers, ssh nodes), an array element of a batch scheduler runs it
    again itself after its other tasks, the peer controller places it again.
    """

    times: int
    #: given as classes or names; kept as the names (``("OSError", "TimeoutError")``)
    on: type[BaseException] | str | tuple[type[BaseException] | str, ...] = field(
        default=(Exception,)
    )
    lost: bool = True
    delay_s: float | str = 1.0
    backoff: float = 2.0
    max_delay_s: float | str = 60.0

    def __post_init__(self) -> None:
        from .units import parse_duration

        times = self.times
        if not isinstance(times, int) or isinstance(times, bool) or times < 0:
            raise ConfigError(f"Retry(times=...) is how many times a task may run again: a whole number "
                              f">= 0, not {times!r}")  # fmt: skip
        object.__setattr__(self, "on", _names(self.on))
        if not isinstance(self.lost, bool):
            raise ConfigError(f"Retry(lost=...) is True or False, not {self.lost!r}")
        delay = parse_duration(self.delay_s, what="Retry(delay_s=...)")
        most = parse_duration(self.max_delay_s, what="Retry(max_delay_s=...)")
        backoff = self.backoff
        if (
            isinstance(backoff, bool)
            or not isinstance(backoff, (int, float))
            or not 1 <= backoff < float("inf")
        ):
            raise ConfigError(
                f"Retry(backoff=...) multiplies each wait: a number >= 1, not {backoff!r}"
            )
        first, longest = float(delay or 0.0), float(most if most is not None else 0.0)
        if longest < first:
            raise ConfigError(f"Retry(max_delay_s={longest:g}) is shorter than delay_s={first:g}")
        object.__setattr__(self, "delay_s", first)
        object.__setattr__(self, "max_delay_s", longest)
        object.__setattr__(self, "backoff", float(backoff))

    @classmethod
    def of(cls, value: int | Retry) -> Retry:
        """The ``retries=`` option as a Retry: a whole number N is ``Retry(times=N, on=(), lost=True)``."""
        if isinstance(value, Retry):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return cls(times=value, on=(), lost=True)
        raise ConfigError(f"retries= takes a whole number (reruns of lost tasks) or an ew.Retry(...) "
                          f"(which errors, how often, how long after), not {value!r}")  # fmt: skip

    @property
    def lost_reruns(self) -> int:
        """How many times a task whose worker was lost runs again (``job.json``'s ``"retries"``)."""
        return self.times if self.lost else 0

    def spec(self) -> dict[str, Any] | None:
        """The policy for errors as ``job.json`` keeps it (``"retry"``); None when no error
        is run again."""
        if not self.on or not self.times:
            return None
        return {"times": self.times, "on": list(_names(self.on)), "delay_s": self.delay_s,
                "backoff": self.backoff, "max_delay_s": self.max_delay_s}  # fmt: skip

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Retry:
        """The policy a job was made with (its ``job.json``)."""
        spec = meta.get("retry")
        lost = int(meta.get("retries", 0) or 0)
        if not isinstance(spec, Mapping):
            return cls(times=lost, on=(), lost=True)
        return cls(times=int(spec.get("times", 0)), on=tuple(spec.get("on", ())), lost=lost > 0,
                   delay_s=float(spec.get("delay_s", 0.0)), backoff=float(spec.get("backoff", 1.0)),
                   max_delay_s=float(spec.get("max_delay_s", 0.0)))  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"Retry(times={self.times}, on={self.on!r}, lost={self.lost}, delay_s={self.delay_s:g}, "
            f"backoff={self.backoff:g}, max_delay_s={self.max_delay_s:g})"
        )


def matches(wanted: Iterable[str], error: Mapping[str, Any]) -> bool:
    """Whether the error record ``error`` (its stored dict) is of one of the types ``wanted``
    (names): its class or one of its bases, by full name, or by class name for a name
    without a dot."""
    names = [str(error.get("type", ""))]
    bases = error.get("bases")
    if isinstance(bases, (list, tuple)):
        names += [str(b) for b in bases]
    short = {n.rsplit(".", 1)[-1] for n in names}
    return any(w in names or ("." not in w and w in short) for w in wanted)


def rerun_delay(spec: Mapping[str, Any] | None, error: Any, attempt: int) -> float | None:
    """Seconds to wait before running again a task whose run ``attempt`` (0: its first) failed
    with the error record ``error`` (its stored dict), under the policy ``spec`` (``job.json``'s
    ``"retry"``); None when it is not run again (no policy, another type, no reruns left)."""
    if not spec or not isinstance(error, Mapping):
        return None
    try:
        times = int(spec.get("times", 0))
        if attempt >= times or not matches(spec.get("on", ()), error):
            return None
        first = float(spec.get("delay_s", 0.0))
        longest = float(spec.get("max_delay_s", first))
        try:
            delay = first * float(spec.get("backoff", 1.0)) ** attempt
        except OverflowError:  # (a thousandth rerun)
            delay = longest
        return max(0.0, min(delay, longest))
    except (TypeError, ValueError):
        return None  # a policy this version cannot read: the error stands
