"""The tasks of one job as columns: what the Gantt, the task table and the plots are drawn from.

Built from one snapshot (:class:`~elsewhere.folder.snapshot.Snapshot`) and the outcomes the
job's journal reader holds, as spans of tasks that share a record (``Outcomes.spans()``),
without a Python object per task: a range record (fast tasks run as one batch) fills its
tasks with slice assignments, so a job of 100 000 tasks is a few dozen records and a few
arrays. Pure: no files are read here (which worker ran a record, its lane, the caller says).

While a job moves, :class:`ColumnsBuilder` keeps its columns up to date: the spans already
laid out are recognised (the same record object over the same tasks) and only the new ones
are added, so a job of 100 000 single records costs a look at its spans per update, not a
new layout; anything else (a retry that overtook an outcome, a cancel) lays the job out
again.

The timeline sent to the page has one entry per span, not per task (a batch's tasks are
shown as equal shares of the batch's time: only its start and end are known), in a compact
binary form the page reads into typed arrays without parsing (:func:`timeline_bytes`); the
columns are sent as they are kept, so making it copies memory and computes nothing::

    offset       size     field (little-endian)
    0            4        magic b"EWT2"
    4            4        H: the length of the header
    8            H        the header, JSON: {"t0", "now", "n", "lanes", "entries": E}
    8 + H        0-7      zero bytes, to a multiple of 8
    a            8 x E    start, float64: unix time
    a + 8E       8 x E    end, float64: unix time; -1 while the task runs
    a + 16E      4 x E    first task, int32
    a + 20E      4 x E    count of tasks, int32 (first .. first + count - 1)
    a + 24E      4 x E    lane, int32 (an index into the header's lanes: a worker)
    a + 28E      4 x E    attempt, int32
    a + 32E      1 x E    kind, uint8: 0 running, 1 finished, 2 failed, 3 lost, 4 cancelled

Entries come in no set order (the page sorts each lane's by start); ``t0`` is when the
first task started, ``now`` the server's clock (the page draws running tasks up to it).
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Callable, Iterable
from typing import Any

from ...folder.records import Kind
from ...folder.snapshot import Snapshot
from ...folder.store import is_control
from ...util.states import TaskState

#: A task state's code in the columns (its index here).
STATES: tuple[TaskState, ...] = tuple(TaskState)
_CODE = {s: i for i, s in enumerate(STATES)}
_KIND_CODE = {int(Kind.OK): _CODE[TaskState.FINISHED], int(Kind.ERROR): _CODE[TaskState.FAILED],
              int(Kind.LOST): _CODE[TaskState.FAILED], int(Kind.CANCELLED): _CODE[TaskState.CANCELLED]}  # fmt: skip
_KIND_CODES = [0] * 8  # a record's kind -> the state code of its tasks (as a list: the hot loop's)
for _kind, _code in _KIND_CODE.items():
    _KIND_CODES[_kind] = _code
RUNNING_KIND = 0  # a timeline entry of a task still running (records' kinds are 1 to 4)
MAGIC = b"EWT2"

#: The task table's sort keys.
SORTS = ("task", "state", "host", "attempt", "started", "seconds")

Span = tuple[int, int, tuple[str, Any]]  # first task, end, (worker id, record)
LaneOf = Callable[[str, int], int]


class TaskColumns:
    """Per-task arrays of one job at one moment (``state`` holds codes of :data:`STATES`;
    ``lane`` -1 for a task that never ran; ``start``/``end`` unix times, 0 where unknown;
    ``batch`` how many tasks ran in the same batch), and the timeline's entries as columns
    (``e_*``: one per span of tasks that ran as one record, then one per running task)."""

    __slots__ = ("attempt", "batch", "e_attempt", "e_count", "e_end", "e_first", "e_kind", "e_lane",
                 "e_start", "end", "lane", "n", "start", "state")  # fmt: skip

    def __init__(self, n: int) -> None:
        self.n = n
        self.state = bytearray(n)
        self.lane = array("i", [-1]) * n
        self.attempt = array("i", [0]) * n
        self.start = array("d", [0.0]) * n
        self.end = array("d", [0.0]) * n
        self.batch = array("i", [1]) * n
        self.e_start, self.e_end = array("d"), array("d")
        self.e_first, self.e_count = array("i"), array("i")
        self.e_lane, self.e_attempt = array("i"), array("i")
        self.e_kind = bytearray()

    def add_entry(self, lane: int, first: int, count: int, start: float, end: float, kind: int,
                  attempt: int) -> None:  # fmt: skip
        self.e_lane.append(lane)
        self.e_first.append(first)
        self.e_count.append(count)
        self.e_start.append(start)
        self.e_end.append(end)
        self.e_kind.append(kind)
        self.e_attempt.append(attempt)

    def cut_entries(self, keep: int) -> None:
        """Drop the entries after the first ``keep``."""
        for col in (self.e_lane, self.e_first, self.e_count, self.e_start, self.e_end, self.e_kind,
                    self.e_attempt):  # fmt: skip
            del col[keep:]

    # -- what the job overview shows ------------------------------------------------------
    def started(self) -> float | None:
        """When the first task started (None before any did)."""
        return min(self.e_start) if self.e_start else None

    def ended(self) -> float | None:
        """When the last task that ran ended (None if none has)."""
        last = max(self.e_end) if self.e_end else 0.0
        return last if last > 0 else None


def build_columns(snap: Snapshot, spans: Iterable[Span], lane_of: LaneOf) -> TaskColumns:
    """The columns of a job from its snapshot and its outcomes as spans
    (``Outcomes.spans()``); ``lane_of(worker id, task)`` gives a record's lane."""
    return ColumnsBuilder().update(snap, spans, lane_of)


class ColumnsBuilder:
    """A job's columns kept up to date from snapshot to snapshot (see the module doc):
    :meth:`update` lays out only the spans that are new since the last call when it can.
    ``full_builds`` counts the complete layouts (for tests)."""

    def __init__(self) -> None:
        self.cols: TaskColumns | None = None
        self.full_builds = 0
        self._laid: dict[int, tuple[int, tuple[str, Any]]] = {}  # first task -> (end, entry)
        self._key: tuple[Any, ...] = ()
        self._final_entries = 0  # entries of ended spans; the running tasks' follow
        self._running: list[int] = []
        self._lanes: dict[str, int] = {}  # lane_of's answers (but for records written off)

    def update(self, snap: Snapshot, spans: Iterable[Span], lane_of: LaneOf) -> TaskColumns:
        """The columns as of ``snap`` (the same object as before, changed, when only new spans
        came)."""
        key = (snap.n, snap.submitted, snap.cancelled, frozenset(snap.cancelled_tasks))
        cols, laid = self.cols, self._laid
        new: list[Span] = []
        if cols is not None and key == self._key:
            kept = 0
            get = laid.get
            for span in spans:
                was = get(span[0])
                if was is None:
                    new.append(span)
                elif was[0] == span[1] and was[1] is span[2]:
                    kept += 1
                else:  # an outcome overtaken (a retry), a batch cut in two: lay out again
                    cols = None
                    break
            if kept != len(laid):  # an outcome forgotten (a retry of a failed task)
                cols = None
        else:
            cols = None
        if cols is None:
            self.full_builds += 1
            self._key = key
            cols = self.cols = _empty(snap)
            laid.clear()
            self._lanes.clear()
            self._running = []
            self._final_entries = 0
            new = list(spans)
        else:
            cols.cut_entries(self._final_entries)
            base = _CODE[TaskState.QUEUED if snap.submitted else TaskState.PENDING]
            running = _CODE[TaskState.RUNNING]
            for t in self._running:  # as if they never ran: the new spans and marks say now
                if cols.state[t] == running:
                    cols.state[t] = base
                    cols.lane[t] = -1
                    cols.start[t] = 0.0
        _lay_out(cols, new, self._lanes, lane_of)
        for first, end, entry in new:
            laid[first] = (end, entry)
        self._final_entries = len(cols.e_first)
        self._running = _mark_running(cols, snap, lane_of)
        return cols


def _empty(snap: Snapshot) -> TaskColumns:
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
    return cols


def _lay_out(
    cols: TaskColumns, spans: Iterable[Span], lanes: dict[str, int], lane_of: LaneOf
) -> None:
    """Fill the columns of the tasks of ``spans`` and add their entries."""
    n = cols.n
    state, lane_col, attempt_col, batch_col = cols.state, cols.lane, cols.attempt, cols.batch
    start_col, end_col = cols.start, cols.end
    # the entries' columns, appended to by bound methods: a slow job has one per task
    e_lane, e_first, e_count = cols.e_lane.append, cols.e_first.append, cols.e_count.append
    e_start, e_end, e_kind, e_attempt = (cols.e_start.append, cols.e_end.append, cols.e_kind.append,
                                         cols.e_attempt.append)  # fmt: skip
    codes = _KIND_CODES
    for first, end, (wid, rec) in spans:
        if first >= n:
            continue
        if end > n:
            end = n
        kind, _, attempt, task, _, per, _, _, _, _, t_start, t_end, _, _ = rec
        code = codes[kind]
        lane = -1
        if t_start > 0:  # (a task cancelled before it started has no lane)
            lane = lanes.get(wid, -2)
            if lane == -2:
                lane = lane_of(wid, first)
                if not is_control(wid):  # a worker's lane is its own; written-off records' their task's
                    lanes[wid] = lane
        if per == 1 and end - first == 1:  # one task, one record: most of a slow job's
            state[first] = code
            if attempt:
                attempt_col[first] = attempt
            end_col[first] = t_end
            if t_start > 0:
                lane_col[first] = lane
                start_col[first] = t_start
                e_lane(lane), e_first(first), e_count(1), e_start(t_start), e_end(t_end)
                e_kind(kind), e_attempt(attempt)
            continue
        count = end - first
        state[first:end] = bytes([code]) * count
        attempt_col[first:end] = array("i", [attempt]) * count
        batch_col[first:end] = array("i", [per]) * count
        if t_start > 0:
            step = (t_end - t_start) / per
            offset = t_start + (first - task) * step
            lane_col[first:end] = array("i", [lane]) * count
            start_col[first:end] = array("d", [offset + k * step for k in range(count)])
            end_col[first:end] = array("d", [offset + (k + 1) * step for k in range(count)])
            cols.add_entry(lane, first, count, offset, offset + count * step, kind, attempt)
        else:
            end_col[first:end] = array("d", [t_end]) * count


def _mark_running(cols: TaskColumns, snap: Snapshot, lane_of: LaneOf) -> list[int]:
    """Mark the snapshot's running tasks (and add their entries); returns them."""
    n, state = cols.n, cols.state
    running, cancelled = _CODE[TaskState.RUNNING], _CODE[TaskState.CANCELLED]
    marked = []
    for t, (wid, since) in snap.running.items():
        if 0 <= t < n and state[t] != cancelled and t not in snap.final:
            state[t] = running
            lane = lane_of(wid, t)
            cols.lane[t] = lane
            cols.start[t] = since
            marked.append(t)
            if since > 0:
                cols.add_entry(lane, t, 1, since, -1.0, RUNNING_KIND, cols.attempt[t])
    return marked


def timeline_bytes(cols: TaskColumns, lanes: list[dict[str, Any]], now: float) -> bytes:
    """The timeline in the binary form of the module's table."""
    head = json.dumps({"t0": cols.started() or now, "now": now, "n": cols.n, "lanes": lanes,
                       "entries": len(cols.e_first)}, separators=(",", ":")).encode()  # fmt: skip
    pad = b"\0" * (-(8 + len(head)) % 8)
    parts: list[array[Any]] = [cols.e_start, cols.e_end, cols.e_first, cols.e_count, cols.e_lane,
                               cols.e_attempt]  # fmt: skip
    if sys.byteorder != "little":
        parts = [array(p.typecode, p) for p in parts]
        for p in parts:
            p.byteswap()
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, pad, *(p.tobytes() for p in parts),
                     bytes(cols.e_kind)])  # fmt: skip


def read_timeline(data: bytes) -> dict[str, Any]:
    """The timeline back from :func:`timeline_bytes` (for tests and scripts): the header's
    fields and one list per column, ``start`` and ``end`` in seconds after ``t0`` (``end``
    -1 while the task runs)."""
    if data[:4] != MAGIC:
        raise ValueError(f"not a timeline (its magic is not {MAGIC.decode()})")
    (h,) = struct.unpack_from("<I", data, 4)
    out: dict[str, Any] = json.loads(data[8 : 8 + h])
    e = out["entries"]
    pos = 8 + h + (-(8 + h) % 8)
    for name, code, size in (("start", "d", 8), ("end", "d", 8), ("first", "i", 4), ("count", "i", 4),
                             ("lane", "i", 4), ("attempt", "i", 4), ("kind", "B", 1)):  # fmt: skip
        col = array(code)
        col.frombytes(data[pos : pos + size * e])
        if sys.byteorder != "little" and size > 1:
            col.byteswap()
        out[name] = col.tolist()
        pos += size * e
    t0 = out["t0"]
    out["start"] = [t - t0 for t in out["start"]]
    out["end"] = [t - t0 if t >= 0 else -1.0 for t in out["end"]]
    return out


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
