"""Sizes and durations as people write them: ``"4G"``, ``"512M"``, ``"90min"``, ``"1-12:00:00"``.

The one grammar of every option that takes a size or a duration (docs/units.md): the batch
clusters' ``mem``, ``mem_per_core`` and ``walltime`` (and ``job.retry``'s), ``ew.peers``'
``memory`` and ``time``, ``job.wait``'s and ``ew.map``'s ``timeout``, the peer worker's
``--memavail``, ``--timavail``, ``--maxtime``, ``--maxidle`` and ``--grace``. A size is read
as bytes, a duration as seconds; whoever needs another unit converts that one value (a
scheduler's MiB and ``HH:MM:SS``: :mod:`elsewhere.schedulers.resources`).

A bare number means the same everywhere: **MiB** for a size (as SLURM's ``--mem=512``, and what
people mean by ``mem=4096``: nobody asks for 512 bytes), **seconds** for a duration (as Python's
``timeout=`` and ``time.sleep``). Prefixes are binary whether written ``G``, ``GB`` or ``GiB``,
as schedulers read them.

Pure functions; a bad value raises :class:`ConfigError` that names the option and lists the
accepted forms.
"""

from __future__ import annotations

import datetime
import math
import re

from .errors import ConfigError

__all__ = [
    "DURATION_FORMS",
    "MIB",
    "SIZE_FORMS",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_size",
]

#: bytes in a MiB: the unit of a bare number given as a size
MIB = 1 << 20

#: the accepted forms of a size, as error messages list them
SIZE_FORMS = "'512M', '4G', '1.5GiB', '800K', '2T', '4096B', or a bare number of MiB (512)"
#: the accepted forms of a duration, as error messages list them
DURATION_FORMS = (
    "seconds (90, 2.5, '90'), '90s', '90min', '1h30m', '2d', '500ms', 'HH:MM:SS' ('01:00:00'), "
    "'MM:SS', 'D-HH[:MM[:SS]]' ('1-12:00:00'), 'unlimited', or a datetime.timedelta"
)

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# a number, then an optional unit: B, or K/M/G/T/P followed by nothing, B, i or iB
_SIZE_RE = re.compile(rf"\s*({_NUMBER})\s*(?:([kmgtp])(?:i?b|i)?|(b))?\s*", re.IGNORECASE)
_SIZE_POWER = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}

_SECONDS_RE = re.compile(rf"\s*({_NUMBER})\s*")
# [D-]HH:MM:SS, MM:SS, D-HH, D-HH:MM: the forms batch schedulers print and take
_CLOCK_RE = re.compile(r"\s*(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\s*")
_PART_RE = re.compile(rf"\s*({_NUMBER})\s*([a-z]+)", re.IGNORECASE)
_DURATION_UNIT = {
    "ms": 0.001,
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
    **dict.fromkeys(("w", "week", "weeks"), 604800.0),
}
_UNLIMITED = frozenset({"inf", "infinity", "infinite", "unlimited"})


def parse_size(value: str | int | float | None, *, what: str = "size") -> int | None:
    """Bytes in a size: ``"512M"``, ``"4G"``, ``"1.5GiB"``, ``"800K"``, ``"4096B"``, or MiB.

    A bare number (``512``, ``0.5``, ``"512"``) is MiB; ``K``, ``M``, ``G``, ``T``, ``P`` are
    powers of 1024, with or without ``B``, ``iB`` or ``i`` after them, in either case. A
    fraction of a byte is rounded up. None stays None (not given). Raises
    :class:`ConfigError` naming ``what`` (the option) and listing the accepted forms.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isnan(value) or math.isinf(value) or value < 0:
            raise ConfigError(f"{what}: a size must be a finite number >= 0, got {value!r}; "
                              f"accepted forms: {SIZE_FORMS}")  # fmt: skip
        return math.ceil(value * MIB)
    if not isinstance(value, str):
        raise ConfigError(f"{what}: expected a size, got {value!r} ({type(value).__name__}); "
                          f"accepted forms: {SIZE_FORMS}")  # fmt: skip
    m = _SIZE_RE.fullmatch(value)
    if m is None:
        raise ConfigError(f"{what}: cannot read {value!r} as a size; accepted forms: {SIZE_FORMS}")
    number, prefix, byte = m.groups()
    if byte:
        return math.ceil(float(number))
    scale = 1024 ** _SIZE_POWER[prefix.lower()] if prefix else MIB
    return math.ceil(float(number) * scale)


def parse_duration(
    value: str | int | float | datetime.timedelta | None, *, what: str = "duration"
) -> float | None:
    """Seconds in a duration.

    Accepts a number of seconds (``90``, ``2.5``, ``"90"``), a :class:`datetime.timedelta`,
    numbers with units (``"90s"``, ``"90min"``, ``"1h30m"``, ``"1.5h"``, ``"2d"``,
    ``"500ms"``, ``"1w"``; every number of several needs its unit), clock forms as batch
    schedulers write them (``"01:00:00"``, ``"90:00"`` (MM:SS), ``"1-12:00:00"``,
    ``"2-12"`` (D-HH), ``"1-12:30"``) and ``"unlimited"`` / ``"inf"`` (``math.inf``). None
    stays None (not given). Raises :class:`ConfigError` naming ``what`` (the option) and
    listing the accepted forms.
    """
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _duration_text(value, what)
    else:
        raise ConfigError(f"{what}: expected a duration, got {value!r} ({type(value).__name__}); "
                          f"accepted forms: {DURATION_FORMS}")  # fmt: skip
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError(
            f"{what}: a duration must be >= 0 seconds, got {value!r}; accepted forms: {DURATION_FORMS}"
        )
    return seconds


def _duration_text(text: str, what: str) -> float:
    if text.strip().lower() in _UNLIMITED:
        return math.inf
    if m := _SECONDS_RE.fullmatch(text):
        return float(m.group(1))
    if m := _CLOCK_RE.fullmatch(text):
        days, first, *rest = m.groups()
        if days is not None or rest[0] is not None:
            return _clock(text, days, first, rest[0], rest[1], what)
    total, pos = 0.0, 0
    while pos < len(text) and (part := _PART_RE.match(text, pos)):
        factor = _DURATION_UNIT.get(part.group(2).lower())
        if factor is None:
            break
        total += float(part.group(1)) * factor
        pos = part.end()
    if pos and not text[pos:].strip():
        return total
    raise ConfigError(
        f"{what}: cannot read {text!r} as a duration; accepted forms: {DURATION_FORMS}"
    )


def _clock(text: str, days: str | None, first: str, second: str | None, third: str | None,
           what: str) -> float:  # fmt: skip
    """Seconds in ``D-HH[:MM[:SS]]``, ``HH:MM:SS`` or ``MM:SS``."""
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, s = int(first), int(second or 0), int(third or 0)
        fields_ok = h < 24 and mi < 60 and s < 60
        seconds = int(days) * 86400 + h * 3600 + mi * 60 + s
    elif third is not None:  # HH:MM:SS (hours may exceed 24)
        mi, s = int(second or 0), int(third)
        fields_ok = mi < 60 and s < 60
        seconds = int(first) * 3600 + mi * 60 + s
    else:  # MM:SS (minutes may exceed 60)
        s = int(second or 0)
        fields_ok = s < 60
        seconds = int(first) * 60 + s
    if not fields_ok:
        raise ConfigError(f"{what}: {text!r} has a field out of range (hours 0-23 after a day, "
                          f"minutes and seconds 0-59); accepted forms: {DURATION_FORMS}")  # fmt: skip
    return float(seconds)


def format_size(nbytes: float) -> str:
    """``8589934592`` -> ``"8.0 GiB"`` (which :func:`parse_size` reads back)."""
    if nbytes != nbytes or nbytes == math.inf:
        return "unlimited"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"  # pragma: no cover - the loop always returns


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1h30m"``; ``inf`` -> ``"unlimited"`` (which :func:`parse_duration` reads back)."""
    if seconds == math.inf or seconds != seconds:
        return "unlimited"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"
