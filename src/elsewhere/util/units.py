"""Sizes and durations as people write them: ``"8G"``, ``"512M"``, ``"10min"``, ``"1h30m"``.

Pure functions, shared by the peer worker's command line and ``ew.peers()``.
"""

from __future__ import annotations

import math
import re

from .errors import ConfigError

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_SIZE_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?)(i?b?)\s*", re.IGNORECASE)
_SIZE_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_DURATION_RE = re.compile(r"([0-9]*\.?[0-9]+)\s*(ms|secs|sec|s|mins|min|m|hrs|hr|h|days|day|d)?",
                          re.IGNORECASE)  # fmt: skip
_DURATION_UNIT = {
    "ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0,
}  # fmt: skip


def parse_size(value: str | int | float | None, *, what: str = "size") -> int | None:
    """Bytes from ``"8G"`` (GiB: powers of 1024), ``"512M"``, ``"1.5GB"``, or a number of bytes.

    None stays None (no limit). Raises :class:`ConfigError` naming ``what``.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size such as '8G', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or math.isnan(value) or math.isinf(value):
            raise ConfigError(f"{what}: a size must be >= 0 bytes, got {value!r}")
        return int(value)
    m = _SIZE_RE.fullmatch(str(value))
    if m is None:
        raise ConfigError(f"{what}: expected a size such as '8G' or '512M', got {value!r}")
    number, unit, _ = m.groups()
    return int(float(number) * 1024 ** _SIZE_POWER[unit.lower()])


def parse_duration(value: str | int | float | None, *, what: str = "duration") -> float | None:
    """Seconds from ``"10min"``, ``"8h"``, ``"1h30m"``, ``"90"`` (seconds), ``"inf"``, or a number.

    None stays None (no limit). Raises :class:`ConfigError` naming ``what``.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a duration such as '10min', got {value!r}")
    if isinstance(value, (int, float)):
        if math.isnan(value) or value < 0:
            raise ConfigError(f"{what}: a duration must be >= 0 seconds, got {value!r}")
        return float(value)
    text = str(value).strip().lower()
    if text in ("inf", "infinite", "unlimited", "none"):
        return math.inf
    if ":" in text:  # [[d-]hh:]mm:ss, as batch schedulers write it
        try:
            parts = [float(p) for p in text.split(":")]
        except ValueError:
            raise ConfigError(f"{what}: cannot read {value!r} as hh:mm:ss")
        seconds = 0.0
        for p in parts:
            seconds = seconds * 60 + p
        return seconds
    pos, total, found = 0, 0.0, False
    for m in _DURATION_RE.finditer(text):
        if m.start() != pos and text[pos : m.start()].strip():
            break
        number, unit = m.groups()
        total += float(number) * _DURATION_UNIT[(unit or "s").lower()]
        pos, found = m.end(), True
    if not found or text[pos:].strip():
        raise ConfigError(f"{what}: expected a duration such as '10min', '8h' or '1h30m', got {value!r}")
    return total


def format_size(nbytes: float) -> str:
    """``8589934592`` -> ``"8.0 GiB"``."""
    if nbytes != nbytes or nbytes == math.inf:
        return "unlimited"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"  # pragma: no cover - the loop always returns


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1h30m"``; ``inf`` -> ``"unlimited"``."""
    if seconds == math.inf or seconds != seconds:
        return "unlimited"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"
