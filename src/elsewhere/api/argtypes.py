"""The command line's parser and the types of its values.

:class:`Parser` is ``argparse.ArgumentParser`` whose usage errors are one line on stderr (what
was wrong, and the ``--help`` that says how to do it right) and exit code 2; its sub-parsers
are of the same class. The value types (``port``, ``count``, ``task_index``, ``seconds``) refuse
a bad value while the arguments are read, so that nothing fails later with a raw error
(``--tcp-port 99999`` was an OverflowError inside the socket call).
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

__all__ = ["Parser", "count", "nonnegative", "port", "positive", "seconds", "task_index"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``elsewhere logs: argument task: a task
    index must be a whole number, not 'x' (see `elsewhere logs --help`)``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        self.exit(2, f"{self.prog}: {line} (see `{self.prog} --help`)\n")


def _integer(text: str, what: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a whole number, not {text!r}") from None


def port(text: str) -> int:
    """A TCP or UDP port, 0 to 65535 (0: any free one)."""
    n = _integer(text, "a port")
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535 (0: any free one), not {n}")
    return n


def count(text: str) -> int:
    """A whole number of at least 1 (tasks, slots, samples)."""
    n = _integer(text, "a count")
    if n < 1:
        raise argparse.ArgumentTypeError(f"a count must be 1 or more, not {n}")
    return n


def task_index(text: str) -> int:
    """A task's index in its job: 0 or more (the job's tasks are 0 to n-1)."""
    n = _integer(text, "a task index")
    if n < 0:
        raise argparse.ArgumentTypeError(
            f"a task index is 0 or more (the first task is 0), not {n}"
        )
    return n


def seconds(text: str) -> float:
    """A duration, in the grammar of every duration (docs/units.md): ``90``, ``2.5``, ``90s``,
    ``5min``, ``1h30m``, ``01:00:00``; ``unlimited`` is math.inf."""
    from ..util.errors import ConfigError
    from ..util.units import parse_duration

    try:
        value = parse_duration(text, what="a duration")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return math.inf if value is None else value


def positive(text: str) -> float:
    """A number above 0 (a half-life in seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text!r}")
    return value


def nonnegative(text: str) -> float:
    """A finite number of 0 or more (milliseconds of busy polling)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, not {text!r}")
    return value
