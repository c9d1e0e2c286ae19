"""The outcome of each task of a job, as the journal reader keeps it: :class:`Outcomes`.

This module is imported by the worker (through ``journal.py``): keep its imports light.
"""

from __future__ import annotations

import bisect

TYPE_CHECKING = False  # typing is not imported at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from .records import Record


class Outcomes:
    """task -> (worker id, record), read like a dict; a range record's tasks are one entry.

    A hundred thousand tiny tasks are a few dozen range records: keeping them as
    ranges (sorted, bisected) instead of one dict entry per task saves the client
    a dict insert per task and the memory of a dict of every task. Single
    records, and tasks of a range that a later attempt overtook, are in a dict,
    which wins over the ranges.
    """

    __slots__ = ("_n", "_ranges", "_single", "_starts")

    def __init__(self) -> None:
        self._single: dict[int, tuple[str, Record]] = {}
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, tuple[str, Record]]] = []  # (first, end, entry)
        self._n = 0

    def _range_index(self, t: int) -> int:
        i = bisect.bisect_right(self._starts, t) - 1
        return i if i >= 0 and t < self._ranges[i][1] else -1

    def get(self, t: int, default: Any = None) -> Any:
        e = self._single.get(t)
        if e is not None:
            return e
        if self._ranges:
            i = bisect.bisect_right(self._starts, t) - 1
            if i >= 0:
                r = self._ranges[i]
                if t < r[1]:
                    return r[2]
        return default

    def __getitem__(self, t: int) -> tuple[str, Record]:
        e = self.get(t)
        if e is None:
            raise KeyError(t)
        return e

    def __contains__(self, t: object) -> bool:
        return isinstance(t, int) and self.get(t) is not None

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        single = self._single
        yield from list(single)
        for first, end, _ in list(self._ranges):
            for t in range(first, end):
                if t not in single:
                    yield t

    def keys(self) -> Iterator[int]:
        return iter(self)

    def values(self) -> Iterator[tuple[str, Record]]:
        return (self[t] for t in self)

    def items(self) -> Iterator[tuple[int, tuple[str, Record]]]:
        return ((t, self[t]) for t in self)

    def by_entry(self) -> dict[tuple[str, Record], list[int]]:
        """The tasks of each entry: a range's tasks (less those a later outcome overtook) under
        one key, so a body shared by many tasks is looked at once."""
        out: dict[tuple[str, Record], list[int]] = {}
        single = self._single
        for t, entry in single.items():
            out.setdefault(entry, []).append(t)
        for first, end, entry in self._ranges:
            tasks = [t for t in range(first, end) if t not in single] if single else list(range(first, end))
            if tasks:
                out.setdefault(entry, []).extend(tasks)
        return out

    def __setitem__(self, t: int, entry: tuple[str, Record]) -> None:
        if t not in self:
            self._n += 1
        self._single[t] = entry

    def __delitem__(self, t: int) -> None:
        i = self._range_index(t)
        if i >= 0:  # rare (a retry forgets an outcome): that range becomes single entries
            first, end, entry = self._ranges.pop(i)
            del self._starts[i]
            for u in range(first, end):
                self._single.setdefault(u, entry)
        del self._single[t]
        self._n -= 1

    def add_range(self, first: int, count: int, entry: tuple[str, Record]) -> bool:
        """Add a range record's tasks as one entry; False (nothing added) if any has an outcome."""
        end = first + count
        i = bisect.bisect_right(self._starts, first) - 1
        if i >= 0 and self._ranges[i][1] > first:
            return False
        if i + 1 < len(self._ranges) and self._ranges[i + 1][0] < end:
            return False
        single = self._single
        if single and (any(first <= t < end for t in single) if len(single) < count
                       else not single.keys().isdisjoint(range(first, end))):
            return False
        self._starts.insert(i + 1, first)
        self._ranges.insert(i + 1, (first, end, entry))
        self._n += count
        return True

    def run_end(self, t: int) -> int:
        """If ``t`` is in a range whose entry no later outcome overtook from ``t`` on,
        the end of that range (tasks ``t .. end-1`` share the entry); else ``t``."""
        i = self._range_index(t)
        if i < 0:
            return t
        end = self._ranges[i][1]
        single = self._single
        if single and any(t <= u < end for u in single):
            return t
        return end
