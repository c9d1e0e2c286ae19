"""The tasks of one job as columns: what the Gantt, the task table and the plots are drawn from.

Built from one snapshot (:class:`~elsewhere.folder.snapshot.Snapshot`) and the outcomes the
job's journal reader holds, without a Python object per task: a range record (fast tasks
run as one batch) fills its tasks with one slice assignment, so a job of 100 000 tasks is a
few dozen records and a few arrays. Pure: no files are read here (the lanes, i.e. which
worker ran a record, are given by the caller).

The timeline sent to the page is one entry per record, not per task (a range record's
tasks are shown as equal shares of the batch's time: only the batch's start and end are
known); the page expands it into per-task arrays and draws them on a canvas.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable
from typing import Any

from ...folder.records import Kind
from ...folder.snapshot import Snapshot
from ...util.states import TaskState

#: A task state's code in the columns (its index here).
STATES: tuple[TaskState, ...] = tuple(TaskState)
_CODE = {s: i for i, s in enumerate(STATES)}
_KIND_CODE = {int(Kind.OK): _CODE[TaskState.FINISHED], int(Kind.ERROR): _CODE[TaskState.FAILED],
              int(Kind.LOST): _CODE[TaskState.FAILED], int(Kind.CANCELLED): _CODE[TaskState.CANCELLED]}  # fmt: skip
RUNNING_KIND = 0  # a timeline entry of a task still running (records' kinds are 1 to 4)

#: The task table's sort keys.
SORTS = ("task", "state", "host", "attempt", "started", "seconds")


#: One timeline entry, a record (or a running task) on one lane:
#: (lane, tasks, start, end (-1: running), kind (a record's, or RUNNING_KIND), attempt).
Entry = tuple[int, list[int], float, float, int, int]


class TaskColumns:
    """Per-task arrays of one job at one moment (``state`` holds codes of :data:`STATES`;
    ``lane`` -1 for a task that never ran; ``start``/``end`` unix times, 0 where unknown;
    ``batch`` how many tasks ran in the same batch) and the timeline ``entries``."""

    __slots__ = ("attempt", "batch", "end", "entries", "lane", "n", "start", "state")

    def __init__(self, n: int) -> None:
        self.n = n
        self.state = bytearray(n)
        self.lane = array("i", [-1]) * n
        self.attempt = array("i", [0]) * n
        self.start = array("d", [0.0]) * n
        self.end = array("d", [0.0]) * n
        self.batch = array("i", [1]) * n
        self.entries: list[Entry] = []

    # -- what the job overview shows ------------------------------------------------------
    def started(self) -> float | None:
        """When the first task started (None before any did)."""
        times = [e[2] for e in self.entries if e[2] > 0]
        return min(times) if times else None

    def ended(self) -> float | None:
        """When the last task that ran ended (None if none has)."""
        times = [e[3] for e in self.entries if e[3] > 0 and e[4] != RUNNING_KIND]
        return max(times) if times else None


def contiguous(tasks: list[int]) -> bool:
    """Whether sorted ``tasks`` are ``first, first + 1, ...``."""
    return tasks[-1] - tasks[0] + 1 == len(tasks)


def build_columns(snap: Snapshot, by_entry: dict[tuple[str, Any], list[int]],
                  lane_of: Callable[[str, int], int]) -> TaskColumns:  # fmt: skip
    """The columns of a job from its snapshot and its outcomes grouped by record
    (``Outcomes.by_entry()``); ``lane_of(worker id, task)`` gives a record's lane (-1: none)."""
    n = snap.n
    cols = TaskColumns(n)
    base = _CODE[TaskState.QUEUED if snap.submitted else TaskState.PENDING]
    state = cols.state
    if base:
        state[:] = bytes([base]) * n
    cancelled = _CODE[TaskState.CANCELLED]
    if snap.cancelled:
        state[:] = bytes([cancelled]) * n
    else:
        for t in snap.cancelled_tasks:
            if 0 <= t < n:
                state[t] = cancelled
    for (wid, rec), tasks in by_entry.items():
        if len(tasks) > 1:
            tasks.sort()
        first = tasks[0]
        if first >= n or tasks[-1] >= n:
            tasks = [t for t in tasks if t < n]
            if not tasks:
                continue
            first = tasks[0]
        lane = lane_of(wid, first)
        code = _KIND_CODE.get(rec.kind, 0)
        count = len(tasks)
        t_start, t_end = float(rec.t_start), float(rec.t_end)
        if count > 1 and contiguous(tasks):
            end = first + count
            state[first:end] = bytes([code]) * count
            cols.lane[first:end] = array("i", [lane]) * count
            cols.attempt[first:end] = array("i", [rec.attempt]) * count
            cols.batch[first:end] = array("i", [rec.count]) * count
            if t_start > 0:
                step = (t_end - t_start) / rec.count
                offset = t_start + (first - rec.task) * step
                cols.start[first:end] = array("d", (offset + k * step for k in range(count)))
                cols.end[first:end] = array("d", (offset + (k + 1) * step for k in range(count)))
                t_start, t_end = (
                    offset,
                    offset + count * step,
                )  # the timeline entry: these tasks only
            else:
                cols.end[first:end] = array("d", [t_end]) * count
        else:
            step = (t_end - t_start) / max(1, rec.count) if t_start > 0 else 0.0
            for t in tasks:
                state[t] = code
                cols.lane[t] = lane
                cols.attempt[t] = rec.attempt
                cols.batch[t] = rec.count
                if t_start > 0:
                    s = t_start + (t - rec.task) * step if rec.count > 1 else t_start
                    cols.start[t] = s
                    cols.end[t] = s + step if rec.count > 1 else t_end
                else:
                    cols.end[t] = t_end
        if t_start > 0 and lane >= 0:
            cols.entries.append((lane, tasks, t_start, t_end, int(rec.kind), int(rec.attempt)))
    running = _CODE[TaskState.RUNNING]
    for t, (wid, since) in snap.running.items():
        if 0 <= t < n and state[t] != cancelled and t not in snap.final:
            state[t] = running
            lane = lane_of(wid, t)
            cols.lane[t] = lane
            cols.start[t] = since
            if since > 0 and lane >= 0:
                cols.entries.append((lane, [t], since, -1.0, RUNNING_KIND, cols.attempt[t]))
    return cols


def timeline_json(cols: TaskColumns, lanes: list[dict[str, Any]], now: float) -> bytes:
    """The timeline as compact JSON: one column per field, times in microseconds after
    ``t0`` (an end of -1: still running); a record whose tasks are not one run of indices
    lists them in ``lists`` (by entry position)."""
    entries = cols.entries
    t0 = min((e[2] for e in entries), default=now)
    us = 1e6
    first, count, lists = [], [], {}
    for i, e in enumerate(entries):
        tasks = e[1]
        first.append(tasks[0])
        count.append(len(tasks))
        if len(tasks) > 1 and not contiguous(tasks):
            lists[str(i)] = tasks
    out = {
        "t0": t0, "now": now, "n": cols.n, "lanes": lanes,
        "lane": [e[0] for e in entries], "first": first, "count": count,
        "start": [round((e[2] - t0) * us) for e in entries],
        "end": [round((e[3] - t0) * us) if e[3] >= 0 else -1 for e in entries],
        "kind": [e[4] for e in entries], "attempt": [e[5] for e in entries], "lists": lists,
    }  # fmt: skip
    return json.dumps(out, separators=(",", ":")).encode()


def order(cols: TaskColumns, sort: str, desc: bool, hosts: list[str],
          keep: Iterable[int] | None = None) -> list[int]:  # fmt: skip
    """The task indices (those of ``keep``, default all) in the order of ``sort`` (one of
    :data:`SORTS`), ties in task order. ``hosts``: each lane's host."""
    start, end, lane = cols.start, cols.end, cols.lane
    keys: dict[str, Callable[[int], Any] | None] = {
        "task": None,
        "state": cols.state.__getitem__,
        "attempt": cols.attempt.__getitem__,
        "started": start.__getitem__,
        "seconds": lambda t: end[t] - start[t] if start[t] > 0 and end[t] > 0 else -1.0,
        "host": lambda t: hosts[lane[t]] if lane[t] >= 0 else "",
    }
    if sort not in keys:
        raise ValueError(f"unknown sort {sort!r}: one of {', '.join(SORTS)}")
    idx = list(range(cols.n)) if keep is None else list(keep)
    idx.sort(key=keys[sort], reverse=desc)  # stable both ways: ties stay in task order
    return idx


def select(
    cols: TaskColumns, state: str | None, host: str | None, hosts: list[str]
) -> list[int] | None:
    """The tasks in ``state`` (a state name) and on a host containing ``host``; None for all."""
    if not state and not host:
        return None
    code = _CODE[TaskState(state)] if state else -1
    st, lane = cols.state, cols.lane
    needle = (host or "").lower()
    on = {i for i, h in enumerate(hosts) if needle in h.lower()} if needle else None
    return [
        t for t in range(cols.n) if (code < 0 or st[t] == code) and (on is None or lane[t] in on)
    ]


def counts_of(cols: TaskColumns) -> dict[str, int]:
    """Tasks per state name."""
    c = [0] * len(STATES)
    for code in range(len(STATES)):
        c[code] = cols.state.count(code)
    return {s.value: c[i] for i, s in enumerate(STATES)}
