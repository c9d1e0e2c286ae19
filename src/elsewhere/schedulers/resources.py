"""Time limits and memory in the units batch schedulers take: whole seconds and whole MiB.

A user's value is read once, by the one grammar of :mod:`elsewhere.util.units` (a bare number
of memory is MiB, of time seconds; docs/units.md), and converted here to the two numbers a
:class:`~elsewhere.schedulers.context.ScriptContext` carries: ``walltime_s`` and
``mem_per_core_mb``. Each scheduler's template writes those numbers in its own syntax, with the
formatters below where a number alone will not do::

    "90min", 5400, timedelta  --parse_walltime-->  5400  --format_walltime------->  01:30:00  (SLURM, SGE, PBS)
                                                         --format_walltime_hm---->  1:30      (LSF -W)
                                                         --as is----------------->  5400s     (Flux), 5400 (HTCondor)
    "4G", "4096M", 4096       --parse_memory_mb-->  4096  --as is, with a suffix-->  4096M (SLURM, SGE), 4096mb (PBS),
                                                                                     4096MB (LSF), 4096 (HTCondor)

Both round up: a limit is never shortened, memory never cut below what was asked.
"""

from __future__ import annotations

import datetime
import math

from elsewhere.util.errors import ConfigError
from elsewhere.util.units import DURATION_FORMS, MIB, SIZE_FORMS, parse_duration, parse_size

__all__ = ["format_walltime", "format_walltime_hm", "parse_memory_mb", "parse_walltime"]


def parse_walltime(value: str | int | float | datetime.timedelta, *, what: str = "walltime") -> int:
    """Whole seconds (rounded up) in a time limit, read by :func:`~elsewhere.util.units.parse_duration`.

    ``"90min"``, ``"1h30m"``, ``"01:30:00"``, ``"1-12:00:00"``, ``5400`` (seconds), a
    ``timedelta``... The limit must be above 0 and finite (leave the option out for the site's
    default). Raises :class:`ConfigError` naming ``what``.
    """
    seconds = parse_duration(value, what=what)
    if seconds is None:
        raise ConfigError(
            f"{what}: expected a duration, got None; accepted forms: {DURATION_FORMS}"
        )
    if seconds == math.inf:
        raise ConfigError(f"{what}: a time limit must be finite, got {value!r} "
                          "(leave it out for the site's default)")  # fmt: skip
    if seconds <= 0:
        raise ConfigError(f"{what}: a time limit must be above 0, got {value!r}")
    return math.ceil(seconds)


def parse_memory_mb(value: str | int | float, *, what: str = "mem") -> int:
    """Whole MiB (rounded up) in a memory size, read by :func:`~elsewhere.util.units.parse_size`.

    ``"4G"``, ``"512M"``, ``"1.5GiB"``, ``4096`` (a bare number is MiB)... The size must be
    above 0. Raises :class:`ConfigError` naming ``what``.
    """
    nbytes = parse_size(value, what=what)
    if nbytes is None:
        raise ConfigError(f"{what}: expected a size, got None; accepted forms: {SIZE_FORMS}")
    if nbytes <= 0:
        raise ConfigError(f"{what}: memory must be above 0, got {value!r}")
    return -(-nbytes // MIB)


def format_walltime(seconds: int) -> str:
    """``HH:MM:SS`` for a number of seconds; hours may exceed 24 (``"36:00:00"``).

    What SLURM's ``--time``, SGE's ``h_rt`` and PBS's ``walltime`` take.
    """
    if seconds < 0:
        raise ConfigError(f"walltime: {seconds} seconds must not be negative")
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def format_walltime_hm(seconds: int) -> str:
    """``H:MM`` for a number of seconds, rounded up to a whole minute (LSF's ``bsub -W``)."""
    if seconds < 0:
        raise ConfigError(f"walltime: {seconds} seconds must not be negative")
    minutes = -(-int(seconds) // 60)
    return f"{minutes // 60}:{minutes % 60:02d}"
