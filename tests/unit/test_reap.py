"""journal.reap: a vanished worker's claim goes back to the queue or fails as lost, and only an
outcome of the attempt now due counts as done (a task retried and claimed again by the same
worker is not done by its earlier outcome)."""

from __future__ import annotations

import os
import time

import pytest

from elsewhere.folder import records
from elsewhere.folder.journal import JournalReader, reap
from elsewhere.folder.queue import new_queue, write_queue
from elsewhere.folder.records import Kind
from elsewhere.folder.store import CUR, SEVERAL, JobStore


@pytest.fixture
def store(tmp_path):
    for sub in ("journal", "results", "logs", "workers"):
        os.makedirs(tmp_path / sub)
    (tmp_path / "queue.lock").touch()
    s = JobStore(tmp_path)
    write_queue(s, new_queue(3, max_workers=1), 1, 0)
    return s


def _journal(store: JobStore, wid: str, recs: list[records.Record]) -> None:
    with open(store.journal_path(wid), "ab") as f:
        f.write(records.pack_frame(recs))


def _running(store: JobStore, wid: str, task: int) -> None:
    with open(os.path.join(store.dir, "workers", f"{wid}.cur"), "wb") as f:
        f.write(CUR.pack(task, time.time(), 0))


def test_a_retried_task_whose_worker_dies_again_is_lost_not_queued_for_ever(store):
    with store.locked_queue() as q:
        q.submit()
        q.join("w1", {"pid": 1, "host": "h", "lock": ""})
        q.set_member("w1", "active", [q.take_next(3), 3])
    # w1 runs the three tasks: 0 and 1 fail, 2 succeeds (attempt 0)
    _journal(store, "w1", [records.make_record(Kind.ERROR, 0), records.make_record(Kind.ERROR, 1),
                           records.make_record(Kind.OK, 2)])  # fmt: skip
    with store.locked_queue() as q:
        q.set_member("w1", "waiting", [])
        q.retry({0: 1, 1: 1})  # the user retries 0 and 1: attempt 1 is due
        take, _ = q.take_reruns(2)
        q.set_member("w1", "active", [-1, *take])  # the same worker claims them again ...
    _running(store, "w1", 0)  # ... and dies while it runs task 0
    with store.locked_queue() as q:
        assert reap(store, q, dead={"w1"}) == ["w1"]
        # task 1 (not started) goes back; task 0 (running, no retries left) is lost
        assert q.to_rerun == [1]
        assert q.lost_by(0) == "w1"
    reader = JournalReader(store)
    reader.refresh()
    reader.forget(store.queue().reruns)
    wid, rec = reader.final[0]
    assert (wid, rec.kind, rec.attempt) == ("_control", Kind.LOST, 1)
    assert 1 not in reader.final  # queued again: the old failure is void
    assert reader.final[2][1].kind == Kind.OK


def test_an_outcome_of_the_attempt_due_still_counts_as_done(store):
    with store.locked_queue() as q:
        q.submit()
        q.join("w1", {"pid": 1, "host": "h", "lock": ""})
        q.set_member("w1", "active", [q.take_next(3), 3])
    _journal(store, "w1", [records.make_record(Kind.OK, 0), records.make_record(Kind.OK, 1)])
    _running(store, "w1", 2)
    with store.locked_queue() as q:
        reap(store, q, dead={"w1"})
        assert q.to_rerun == [] and q.lost_by(2) == "w1"  # 0 and 1 done: not run again


def test_in_a_copy_of_the_folder_the_reapers_write_under_its_own_name_and_are_read_as_control(store):
    # (copies on several hosts come back side by side: none overwrites another's, nor the client's)
    from elsewhere.folder.store import is_control

    tmp = store.dir
    with open(os.path.join(tmp, "control-id"), "w") as f:
        f.write("_control.ab12cd34\n")
    with store.locked_queue() as q:
        q.submit()
        q.join("w1", {"pid": 1, "host": "h", "lock": ""})
        q.set_member("w1", "active", [q.take_next(3), 3])
    _running(store, "w1", 1)
    with store.locked_queue() as q:
        reap(store, q, dead={"w1"})
    assert sorted(os.listdir(os.path.join(tmp, "journal"))) == ["_control.ab12cd34.rec"]
    reader = JournalReader(store)
    reader.refresh()
    wid, rec = reader.final[1]
    assert (wid, rec.kind) == ("_control.ab12cd34", Kind.LOST) and is_control(wid)
    assert reader.body_end.get(wid) is None  # its records point to no result body
    assert is_control("_control") and not is_control("_controller-7") and not is_control("w1")


def test_what_comes_back_from_a_copy_holds_its_journals_but_never_this_sides_control_journal():
    from elsewhere.hosts.sync import WORKER_OUTPUT
    from elsewhere.hosts.tree import tree_functions

    tree = tree_functions()  # (the patterns of the tar path and of local copies; rsync reads them alike)
    compiled, matches = tree["compile_patterns"](WORKER_OUTPUT), tree["matches"]
    for rel in ("journal/w1-123-ab.rec", "journal/c0.3-h-9-ff.rec", "journal/_control.ab12cd34.rec",
                "results/w1-123-ab.bin", "logs/w1-123-ab.log", "workers/w1.cur", "damage.txt"):
        assert matches(rel, compiled), rel
    assert not matches("journal/_control.rec", compiled)
    assert not matches("queue.json", compiled)


def test_a_worker_dead_inside_a_flood_s_loop_costs_no_task_and_its_claim_goes_back_whole(store):
    # The map says SEVERAL while a flood's loop runs in C: which task killed the worker is not
    # known, so none is charged (no attempt counted); all go back, to be run each alone. The
    # worker counts as running every task of its claim, for a cancel that stops it.
    with store.locked_queue() as q:
        q.submit()
        q.join("w1", {"pid": 1, "host": "h", "lock": ""})
        q.set_member("w1", "active", [q.take_next(3), 3])
    _running(store, "w1", SEVERAL)
    member = store.queue().members["w1"]
    assert [store.runs_task("w1", member, t) for t in (0, 2, 3)] == [True, True, False]
    _journal(store, "w1", [records.make_record(Kind.OK, 0)])  # (task 0 ran, its value written)
    with store.locked_queue() as q:
        assert reap(store, q, dead={"w1"}) == ["w1"]
        assert q.to_rerun == [1, 2] and q.lost_by(1) is None and q.lost_by(2) is None
        assert q.attempt(1) == 0 and q.attempt(2) == 0
    _running(store, "w2", 1)
    assert [store.runs_task("w2", member, t) for t in (0, 1, 2)] == [False, True, False]
