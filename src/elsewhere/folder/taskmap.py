"""The outcome of each task of a job, as the journal reader keeps it: :class:`Outcomes`;
and a set of task numbers kept as runs, :class:`TaskSet`.

This module is imported by the worker (through ``journal.py``): keep its imports light.
"""

from __future__ import annotations

import bisect

TYPE_CHECKING = False  # typing is not imported at run time: the worker imports this module
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any

    from .records import Record


class TaskSet:
    """A set of task numbers kept as sorted runs ``[first, end)``: a million tasks that end in
    about their order are a handful of runs, not a million set entries (60 MB).

    ``add``, ``discard`` and ``in`` cost a bisection; adding the task after the last run's end
    (the common case) extends that run in place.
    """

    __slots__ = ("_ends", "_n", "_starts")

    def __init__(self, tasks: Any = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._n = 0
        self.update(sorted(set(tasks)))

    def __contains__(self, t: object) -> bool:
        if not isinstance(t, int):
            return False
        i = bisect.bisect_right(self._starts, t) - 1
        return i >= 0 and t < self._ends[i]

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[int]:
        for a, b in list(zip(self._starts, self._ends)):
            yield from range(a, b)

    def runs(self) -> list[tuple[int, int]]:
        """The runs, ``[(first, end), ...]`` in order."""
        return list(zip(self._starts, self._ends))

    def copy(self) -> TaskSet:
        out = TaskSet()
        out._starts, out._ends, out._n = list(self._starts), list(self._ends), self._n
        return out

    def difference(self, other: TaskSet) -> list[int]:
        """The tasks of this set that are not in ``other``, in order: a walk over the runs of
        both, so two sets of a million tasks in a few runs each differ in microseconds."""
        out: list[int] = []
        theirs = list(zip(other._starts, other._ends))
        j, m = 0, len(theirs)
        for a, b in zip(self._starts, self._ends):
            while a < b:
                while j < m and theirs[j][1] <= a:
                    j += 1
                if j == m or theirs[j][0] >= b:  # none of theirs in [a, b)
                    out.extend(range(a, b))
                    break
                c, d = theirs[j]
                if a < c:
                    out.extend(range(a, c))
                a = max(a, d)
        return out

    def add(self, t: int) -> None:
        starts, ends = self._starts, self._ends
        if ends and t == ends[-1]:  # just after the last run: the usual order
            ends[-1] = t + 1
            self._n += 1
            return
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t < ends[i]:
            return  # in already
        joins_left = i >= 0 and ends[i] == t
        joins_right = i + 1 < len(starts) and starts[i + 1] == t + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = t + 1
        elif joins_right:
            starts[i + 1] = t
        else:
            starts.insert(i + 1, t)
            ends.insert(i + 1, t + 1)
        self._n += 1

    def gaps(self, first: int, end: int) -> list[tuple[int, int]]:
        """The runs of ``range(first, end)`` that are not in the set, ``[(a, b), ...]`` in order."""
        out: list[tuple[int, int]] = []
        starts, ends = self._starts, self._ends
        i = max(0, bisect.bisect_right(starts, first) - 1)
        a = first
        while a < end and i < len(starts):
            if ends[i] <= a:
                i += 1
                continue
            if starts[i] > a:
                out.append((a, min(starts[i], end)))
            a = max(a, ends[i])
            i += 1
        if a < end:
            out.append((a, end))
        return out

    def overlaps(self, first: int, end: int) -> bool:
        """Whether any task of ``range(first, end)`` is in."""
        i = bisect.bisect_right(self._starts, end - 1) - 1
        return i >= 0 and self._ends[i] > first

    def add_run(self, first: int, end: int) -> None:
        """Add tasks ``first .. end - 1``: one merge, not a bisection per task."""
        if first >= end:
            return
        starts, ends = self._starts, self._ends
        lo = bisect.bisect_left(ends, first)  # the first run that ends at or after first
        hi = bisect.bisect_right(starts, end)  # the runs from lo up to here touch [first, end)
        if lo >= hi:
            starts.insert(lo, first)
            ends.insert(lo, end)
            self._n += end - first
            return
        a, b = min(first, starts[lo]), max(end, ends[hi - 1])
        held = sum(ends[k] - starts[k] for k in range(lo, hi))
        starts[lo:hi], ends[lo:hi] = [a], [b]
        self._n += b - a - held

    def update(self, tasks: Any) -> None:
        """Add ``tasks``; each run of consecutive numbers in them is added at once."""
        first = end = 0
        for t in tasks:
            if t == end and end > first:
                end += 1
                continue
            self.add_run(first, end)
            first, end = t, t + 1
        self.add_run(first, end)

    def discard(self, t: int) -> None:
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t >= ends[i]:
            return
        a, b = starts[i], ends[i]
        if a == t and b == t + 1:
            del starts[i], ends[i]
        elif a == t:
            starts[i] = t + 1
        elif b == t + 1:
            ends[i] = t
        else:  # in the middle: two runs
            ends[i] = t
            starts.insert(i + 1, t + 1)
            ends.insert(i + 1, b)
        self._n -= 1


class Outcomes:
    """task -> (worker id, record), read like a dict; a range record's tasks are one entry.

    A hundred thousand tiny tasks are a few dozen range records: keeping them as
    ranges (sorted, bisected) instead of one dict entry per task saves the client
    a dict insert per task and the memory of a dict of every task. Single
    records, and tasks of a range that a later attempt overtook, are in a dict,
    which wins over the ranges.
    """

    __slots__ = ("_n", "_over", "_ranges", "_retired", "_single", "_starts")

    def __init__(self) -> None:
        self._single: dict[int, tuple[str, Record]] = {}
        self._over: set[int] = set()  # the single records inside a range (they overtook it)
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, tuple[str, Record]]] = []  # (first, end, entry)
        self._retired = TaskSet()
        self._n = 0

    def retire(self, tasks: Any) -> None:
        """Drop the records of ``tasks`` (delivered, never read again: an Executor's calls),
        keeping only that they ended: a stream of a million calls holds a few runs, not a
        million records. A retired task is ``in`` the outcomes, counted by ``len``, and
        :meth:`get` gives :data:`RETIRED` (an attempt no later outcome overtakes); iterating
        leaves it out. Only single records retire (a range is one entry already)."""
        single = self._single
        retired = self._retired
        over = self._over
        for t in tasks:
            if single.pop(t, None) is not None:
                retired.add(t)
                over.discard(t)

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
        if self._retired and t in self._retired:
            return RETIRED
        return default

    def __getitem__(self, t: int) -> tuple[str, Record]:
        e = self.get(t)
        if e is None:
            raise KeyError(t)
        return e

    def __contains__(self, t: object) -> bool:
        # get() inlined: the filters of running tasks against the outcomes call this per task
        if t in self._single:
            return True
        if not isinstance(t, int):
            return False
        if self._ranges:
            i = bisect.bisect_right(self._starts, t) - 1
            if i >= 0 and t < self._ranges[i][1]:
                return True
        return bool(self._retired) and t in self._retired

    def absent(self, tasks: Iterable[int]) -> list[int]:
        """The tasks of ``tasks`` without an outcome, in their order (``t not in self`` for
        each: a look at a job filters thousands of running tasks this way). Many tasks are
        sorted once and cut by the runs of outcomes (a slice per run), not looked up one by one."""
        asked = tasks if isinstance(tasks, list) else list(tasks)
        try:
            ints = sorted(asked) if len(asked) >= 64 else None
        except TypeError:  # (not task numbers)
            ints = None
        if not ints:
            return [t for t in asked if t not in self]
        lo, hi = ints[0], ints[-1]
        left = bisect.bisect_left
        gone: set[int] = self._single.keys() & ints if self._single else set()
        runs = [(self._starts, [r[1] for r in self._ranges])] if self._ranges else []
        if self._retired:
            runs.append((self._retired._starts, self._retired._ends))
        for starts, ends in runs:
            k = max(0, bisect.bisect_right(starts, lo) - 1)
            while k < len(starts) and starts[k] <= hi:
                gone.update(ints[left(ints, starts[k]) : left(ints, ends[k])])
                k += 1
        return [t for t in asked if t not in gone] if gone else list(asked)

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

    def spans(self) -> list[tuple[int, int, tuple[str, Record]]]:
        """Every outcome as ``(first, end, entry)``: tasks ``first .. end - 1`` share ``entry``
        (a single task's is ``(t, t + 1, entry)``; a range's, less the tasks a later outcome
        overtook, one span per unbroken run). In no set order; unlike :meth:`by_entry` it
        hashes no entry, so a job of 100 000 single records is walked in milliseconds."""
        single = self._single
        out = [(t, t + 1, entry) for t, entry in single.items()]
        for first, end, entry in self._ranges:
            start = first
            if single:
                for t in range(first, end):
                    if t in single:
                        if start < t:
                            out.append((start, t, entry))
                        start = t + 1
            if start < end:
                out.append((start, end, entry))
        return out

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
        elif t in self._retired:
            self._retired.discard(t)
        if self._ranges and self._range_index(t) >= 0:
            self._over.add(t)
        self._single[t] = entry

    def __delitem__(self, t: int) -> None:
        if t in self._retired:
            self._retired.discard(t)
            self._n -= 1
            return
        i = self._range_index(t)
        if i >= 0:  # rare (a retry forgets an outcome): that range becomes single entries
            first, end, entry = self._ranges.pop(i)
            del self._starts[i]
            for u in range(first, end):
                self._single.setdefault(u, entry)
                self._over.discard(u)
        del self._single[t]
        self._over.discard(t)
        self._n -= 1

    def add_range(self, first: int, count: int, entry: tuple[str, Record]) -> bool:
        """Add a range record's tasks as one entry; False (nothing added) if any has an outcome."""
        end = first + count
        i = bisect.bisect_right(self._starts, first) - 1
        if i >= 0 and self._ranges[i][1] > first:
            return False
        if i + 1 < len(self._ranges) and self._ranges[i + 1][0] < end:
            return False
        if self._retired and self._retired.overlaps(first, end):
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
        over = self._over  # (the single records in ranges: rare, where all of them are many)
        if over and any(t <= u < end for u in over):
            return t
        return end


def _retired_entry() -> tuple[str, Any]:
    from .records import Kind, Record

    return ("", Record(int(Kind.OK), 0, 1 << 62, -1))


RETIRED = _retired_entry()
"""What :meth:`Outcomes.get` gives for a retired task: no worker, an OK record of an attempt
that no later outcome overtakes, no body."""
