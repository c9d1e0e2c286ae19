"""columns.py: a job's tasks as columns, the timeline the page draws, the task table's order.
Pure: snapshots and outcomes made here, no files."""

from __future__ import annotations

import pytest

from elsewhere.api.web import columns as C
from elsewhere.folder.records import Kind, make_record
from elsewhere.folder.snapshot import Snapshot
from elsewhere.folder.taskmap import Outcomes


def _snap(n, final, running=None, cancelled_tasks=(), cancelled=False):
    return Snapshot(n=n, submitted=True, cancelled=cancelled, final=final, running=running or {},
                    cancelled_tasks=set(cancelled_tasks))  # fmt: skip


def _lanes():
    lanes: list[str] = []

    def lane_of(wid, task):
        if wid not in lanes:
            lanes.append(wid)
        return lanes.index(wid)

    return lanes, lane_of


def _states(cols):
    return [C.STATES[s].value for s in cols.state]


def test_a_range_record_is_its_tasks_with_equal_shares_of_the_batch():
    final = Outcomes()
    final.add_range(0, 4, ("w1", make_record(Kind.OK, 0, count=4, t_start=100.0, t_end=104.0)))
    final[4] = ("w2", make_record(Kind.ERROR, 4, t_start=100.5, t_end=103.0))
    lanes, lane_of = _lanes()
    cols = C.build_columns(_snap(6, final), final.spans(), lane_of)
    assert _states(cols) == ["finished"] * 4 + ["failed", "queued"]
    assert list(cols.start[:4]) == [100.0, 101.0, 102.0, 103.0]
    assert list(cols.end[:4]) == [101.0, 102.0, 103.0, 104.0]
    assert [lanes[i] for i in cols.lane[:5]] == ["w1"] * 4 + ["w2"] and cols.lane[5] == -1
    assert list(cols.batch[:5]) == [4, 4, 4, 4, 1]
    assert cols.started() == 100.0 and cols.ended() == 104.0
    assert C.counts_of(cols) == {"pending": 0, "queued": 1, "running": 0, "finished": 4, "failed": 1,
                                 "cancelled": 0}  # fmt: skip


def test_a_task_retried_out_of_a_range_keeps_its_neighbours_times():
    final = Outcomes()
    final.add_range(0, 4, ("w1", make_record(Kind.OK, 0, count=4, t_start=10.0, t_end=14.0)))
    final[2] = ("w2", make_record(Kind.OK, 2, attempt=1, t_start=20.0, t_end=21.0))
    _, lane_of = _lanes()
    cols = C.build_columns(_snap(4, final), final.spans(), lane_of)
    assert list(cols.start) == [10.0, 11.0, 20.0, 13.0] and list(cols.attempt) == [0, 0, 1, 0]
    tl = C.read_timeline(C.timeline_bytes(cols, [{"id": "w1"}, {"id": "w2"}], now=30.0))
    assert sum(tl["count"]) == 4  # one bar per task, whatever the records
    spans = sorted(zip(tl["first"], tl["count"], tl["start"], tl["end"]))
    assert spans == [(0, 2, 0.0, 2.0), (2, 1, 10.0, 11.0), (3, 1, 3.0, 4.0)]  # the batch in two


def test_running_cancelled_and_never_started_tasks():
    final = Outcomes()
    final[0] = ("w1", make_record(Kind.OK, 0, t_start=5.0, t_end=6.0))
    final[1] = ("_control", make_record(Kind.CANCELLED, 1, t_end=7.0))  # before it ran: no bar
    _, lane_of = _lanes()
    snap = _snap(5, final, running={2: ("w1", 6.5)}, cancelled_tasks={3})
    cols = C.build_columns(snap, final.spans(), lane_of)
    assert _states(cols) == ["finished", "cancelled", "running", "cancelled", "queued"]
    tl = C.read_timeline(C.timeline_bytes(cols, [{"id": "w1"}], now=8.0))
    assert (
        tl["t0"] == 5.0 and tl["first"] == [0, 2] and tl["kind"] == [int(Kind.OK), C.RUNNING_KIND]
    )
    assert tl["start"] == [0.0, 1.5] and tl["end"] == [1.0, -1.0] and tl["entries"] == 2
    assert tl["lanes"] == [{"id": "w1"}] and tl["n"] == 5
    assert (
        _states(C.build_columns(_snap(3, Outcomes(), cancelled=True), [], lane_of))
        == ["cancelled"] * 3
    )
    with pytest.raises(ValueError, match="not a timeline"):
        C.read_timeline(b"{}")


def test_the_task_table_sorts_and_filters():
    final = Outcomes()
    for t, (start, secs) in enumerate([(1.0, 3.0), (2.0, 1.0), (3.0, 2.0)]):
        kind = Kind.ERROR if t == 1 else Kind.OK
        final[t] = (f"w{t % 2}", make_record(kind, t, t_start=start, t_end=start + secs))
    _, lane_of = _lanes()
    cols = C.build_columns(_snap(4, final), final.spans(), lane_of)
    hosts = ["alpha", "beta"]
    assert C.order(cols, "seconds", True, hosts) == [0, 2, 1, 3]  # never ran: last
    assert C.order(cols, "task", True, hosts) == [3, 2, 1, 0]
    assert C.order(cols, "host", False, hosts) == [3, 0, 2, 1]
    assert C.select(cols, "failed", None, hosts) == [1]
    assert C.select(cols, None, "ALP", hosts) == [0, 2]
    assert C.select(cols, None, None, hosts) is None
    with pytest.raises(ValueError, match="unknown sort"):
        C.order(cols, "colour", False, hosts)


def test_spans_are_the_outcomes_in_runs():
    final = Outcomes()
    batch = ("w1", make_record(Kind.OK, 0, count=6))
    final.add_range(0, 6, batch)
    final[2] = final[4] = ("w2", make_record(Kind.OK, 2, attempt=1))
    spans = sorted((first, end, entry[0]) for first, end, entry in final.spans())
    assert spans == [(0, 2, "w1"), (2, 3, "w2"), (3, 4, "w1"), (4, 5, "w2"), (5, 6, "w1")]


def _same(a: C.TaskColumns, b: C.TaskColumns) -> None:
    """Two layouts of one job agree, task by task and entry by entry (in any order)."""
    for name in ("state", "lane", "attempt", "start", "end", "batch"):
        assert list(getattr(a, name)) == list(getattr(b, name)), name

    def entries(c):
        return sorted(
            zip(c.e_first, c.e_count, c.e_lane, c.e_start, c.e_end, c.e_kind, c.e_attempt)
        )

    assert entries(a) == entries(b)


def test_the_builder_lays_out_only_what_is_new_and_agrees_with_a_full_layout():
    final = Outcomes()
    lanes, lane_of = _lanes()
    builder = C.ColumnsBuilder()
    final.add_range(0, 3, ("w1", make_record(Kind.OK, 0, count=3, t_start=10.0, t_end=13.0)))
    cols = builder.update(
        _snap(8, final, running={3: ("w2", 11.0), 4: ("w1", 13.0)}), final.spans(), lane_of
    )
    assert _states(cols)[:5] == ["finished"] * 3 + ["running"] * 2
    # task 3 ended (task 4 still runs), task 5 started: only the new outcome is laid out
    final[3] = ("w2", make_record(Kind.ERROR, 3, t_start=11.0, t_end=14.0))
    snap = _snap(8, final, running={4: ("w1", 13.0), 5: ("w2", 14.0)})
    same = builder.update(snap, final.spans(), lane_of)
    assert same is cols and builder.full_builds == 1
    assert _states(cols)[:6] == ["finished"] * 3 + ["failed", "running", "running"]
    assert list(cols.e_kind).count(C.RUNNING_KIND) == 2  # the old running entry of task 3 is gone
    _same(cols, C.build_columns(snap, final.spans(), lane_of))
    # task 4 ended, nothing runs: a running mark is undone where no outcome replaced it
    final[4] = ("w1", make_record(Kind.OK, 4, t_start=13.0, t_end=15.0))
    snap = _snap(8, final)
    builder.update(snap, final.spans(), lane_of)
    assert builder.full_builds == 1 and _states(cols)[3:6] == ["failed", "finished", "queued"]
    assert cols.lane[5] == -1 and cols.start[5] == 0.0
    _same(cols, C.build_columns(snap, final.spans(), lane_of))
    # a retry overtook a task of the batch: the batch is cut in two, so all is laid out again
    final[1] = ("w2", make_record(Kind.OK, 1, attempt=1, t_start=20.0, t_end=21.0))
    snap = _snap(8, final)
    cols = builder.update(snap, final.spans(), lane_of)
    assert builder.full_builds == 2 and list(cols.attempt[:3]) == [0, 1, 0]
    _same(cols, C.build_columns(snap, final.spans(), lane_of))
    # a task cancelled: laid out again too
    snap = _snap(8, final, cancelled_tasks={7})
    cols = builder.update(snap, final.spans(), lane_of)
    assert builder.full_builds == 3 and _states(cols)[7] == "cancelled"
    tl = C.read_timeline(C.timeline_bytes(cols, [{"id": w} for w in lanes], now=30.0))
    assert tl["t0"] == 10.0 and sum(tl["count"]) == 5 and min(tl["start"]) == 0.0
