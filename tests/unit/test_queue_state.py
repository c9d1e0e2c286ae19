"""The typed queue state and its named transitions; the snapshot's job state; check_move.

Pure: a Queue over a dict, a Snapshot over made-up outcomes; no processes, no files."""

from __future__ import annotations

import pytest

import elsewhere as ew
from elsewhere.folder.journal import Outcomes
from elsewhere.folder.queue import Queue, new_queue
from elsewhere.folder.records import Kind, Record
from elsewhere.folder.snapshot import Snapshot
from elsewhere.util.states import JobState, TaskState, check_move


def q(n=5, **kw):
    return Queue(new_queue(n, **kw))


def test_submit_marks_the_queue_and_assigned_tasks_are_not_claimed():
    s = q(5)
    assert not s.submitted and s.unclaimed() == 5
    s.submit(assigned=5, max_workers=5)
    assert s.submitted and s.next == 5 and s.max_workers == 5 and s.unclaimed() == 0
    with pytest.raises(ew.StateError, match="cannot assign 6 tasks of a job of 5"):
        s.submit(assigned=6)


def test_cancel_task_is_checked_and_leaves_the_reruns():
    s = q(5)
    s.retry({2: 1, 3: 1})
    s.cancel_task(3)
    assert s.cancelled_tasks == {3} and s.to_rerun == [2]
    with pytest.raises(ew.StateError, match=r"cannot cancel task 5: the job has tasks 0..4"):
        s.cancel_task(5)
    with pytest.raises(ew.StateError):
        s.cancel_task(True)


def test_retry_uncancels_counts_attempts_and_forgets_lost_reasons():
    s = q(4)
    s.cancel_job()
    s.cancel_task(1)
    s.lose(2, reason="node failed")
    s.retry({1: 1, 2: 3})
    assert not s.cancelled and s.cancelled_tasks == frozenset()
    assert s.attempt(1) == 1 and s.attempt(2) == 3 and s.reruns == {1: 1, 2: 3}
    assert s.lost_reason(2) is None and s.retried_at(2) > 0 and s.retried_at(0) == 0
    assert s.to_rerun == [1, 2]
    s.retry({2: 4})
    assert s.to_rerun == [1, 2]  # not twice


def test_cancel_job_returns_the_members_at_work():
    s = q(3)
    s.members.update({"a": {"state": "active"}, "b": {"state": "left"}, "c": {"state": "waiting"}})
    s.requeue([0])
    assert [m["state"] for m in s.cancel_job()] == ["active", "waiting"]
    assert s.cancelled and s.to_rerun == []


def test_a_stream_grows_until_it_is_closed():
    s = q(0, closed=False)
    s.grow(3)
    s.grow(2)  # never fewer
    assert s.n == 3
    s.close()
    with pytest.raises(ew.StateError, match="closed job"):
        s.grow(4)


def test_lost_attempts_and_requeue():
    s = q(3, retries=1)
    assert s.count_attempt(1) == 1 and s.count_attempt(1) == 2
    s.requeue([2, 0])
    assert s.to_rerun == [2, 0]
    s.lose(1, by="w1")
    assert s.lost_by(1) == "w1" and s.lost_reason(1) is None


def test_halt_writes_off_what_nobody_claimed_and_a_retry_takes_it_back():
    s = q(10)
    s.submit()
    assert s.take_next(3) == 0
    s.requeue([1])
    s.lose_all([2, 0], "disk full")  # a failed worker's claim: one run, one reason
    again, rest = s.halt("disk full")
    assert again == [1] and rest == range(3, 10) and s.unclaimed() == 0 and s.next == 10
    assert all(s.lost_reason(t) == "disk full" for t in range(10))
    s.retry({4: 1, 5: 1})
    assert s.lost_reason(4) is None and s.lost_reason(5) is None and s.to_rerun == [4, 5]
    assert s.lost_reason(3) == s.lost_reason(6) == "disk full"


def test_workers_lost_at_start_are_counted_until_one_joins():
    s = q(4)
    s.note_dispatched(["a", "b"], 1.0)
    s.note_started(["a", "b", "late"], 123, "host")
    assert s.started_by("a") == (123, "host") and s.started_by("late") is None
    assert s.lost_at_start("a") == 1 and s.lost_at_start("b") == 2
    assert s.dispatched() == {} and s.started_by("a") is None
    s.join("c", {"pid": 1})
    s.note_dispatched(["d"], 2.0)
    assert s.lost_at_start("d") == 1


def _snap(n, final=(), cancelled=False, cancelled_tasks=(), running=()):
    o = Outcomes()
    counts: dict[int, int] = {}
    for t, kind in final:
        o[t] = ("w", Record(int(kind), 0, 0, t, 0, 1))
        counts[int(kind)] = counts.get(int(kind), 0) + 1
    return Snapshot(n=n, submitted=True, cancelled=cancelled, final=o, running=dict.fromkeys(running, ("w", 0.0)),
                    cancelled_tasks=set(cancelled_tasks), kind_counts=counts)


def test_a_job_with_tasks_cancelled_one_by_one_ends_by_the_others():
    ok, err = Kind.OK, Kind.ERROR
    assert _snap(3, [(0, ok), (2, ok)], cancelled_tasks=[1]).job_state() is JobState.FINISHED
    assert _snap(3, [(0, err), (2, ok)], cancelled_tasks=[1]).job_state() is JobState.FAILED
    assert _snap(2, [], cancelled_tasks=[0, 1]).job_state() is JobState.CANCELLED
    assert _snap(3, [(0, ok)], cancelled=True).job_state() is JobState.CANCELLED
    assert _snap(3, [(0, ok)], cancelled_tasks=[1], running=[2]).job_state() is JobState.RUNNING


def test_but_copies_and_leaves_the_snapshot_given():
    s = _snap(2, running=[0])
    t = s.but(note="2 pending: Resources", running={})
    assert s.note == "" and s.running and t.note == "2 pending: Resources" and not t.running
    assert t.final is s.final and t.n == 2
    # counts are worked out once per snapshot; a copy counts its own, a caller's changes stay its own
    assert s.counts()[TaskState.RUNNING] == 1 and t.counts()[TaskState.RUNNING] == 0
    mine = s.counts()
    mine[TaskState.RUNNING] = 7
    assert s.counts()[TaskState.RUNNING] == 1 and s.but(running={}).counts()[TaskState.RUNNING] == 0


def test_check_move_names_the_job_the_task_and_both_states():
    check_move(TaskState.FAILED, TaskState.QUEUED, task=1, retry=True)
    with pytest.raises(ew.StateError, match=r"task 3 of job 'fits' cannot move from finished to queued"):
        check_move(TaskState.FINISHED, TaskState.QUEUED, task=3, job="fits", retry=True)
    with pytest.raises(ew.StateError, match=r"finished to cancelled"):
        check_move(TaskState.FINISHED, TaskState.CANCELLED, task=0)
