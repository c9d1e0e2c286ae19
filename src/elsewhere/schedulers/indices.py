"""Index ranges as schedulers print and take them (``"1-10:2"``, ``"[5-9%2]"``, ``"1,3,5-7"``),
and the ``"ID@FIRST"`` job ids of schedulers that number elements by position.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["compress_indices", "expand_indices", "split_array_first"]

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def expand_indices(spec: str) -> list[int]:
    """Indices in a range expression as schedulers print them.

    ``"5"``, ``"1-10"``, ``"1-10:2"`` (SGE/PBS step), ``"[5-9%2]"`` (SLURM
    pending, with throttle), ``"1,3,5-7"``. Raises ValueError on anything else.
    """
    text = spec.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE_RE.match(part.strip())
        if not m:
            raise ValueError(f"not an index range: {spec!r}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first or step < 1:
            raise ValueError(f"not an index range: {spec!r}")
        out.extend(range(first, last + 1, step))
    return out


def compress_indices(indices: Iterable[int]) -> str:
    """The shortest ``"1-3,7,9-10"`` form of a set of indices."""
    values = sorted(set(indices))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def split_array_first(job_id: str) -> tuple[str, int]:
    """Split ``"ID@FIRST"`` into ``("ID", FIRST)``; a plain id has first index 0.

    Schedulers whose elements are numbered by position (HTCondor procs, Flux
    copies) carry the first index of the submission in their job id this way.
    """
    base, sep, first = job_id.rpartition("@")
    if sep and first.isdigit():
        return base, int(first)
    return job_id, 0
