"""The controller's handling of a RESULT, driven in-process on a real job folder (no sockets):
which outcomes it keeps, and that a task already ended (it ran twice: on a worker thought lost
and on another) is dropped, whether its RESULT holds only such tasks or mixes them with new."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from elsewhere.folder import serial
from elsewhere.folder.lifecycle import create_store
from elsewhere.folder.payload import PayloadWriter
from elsewhere.peer.announce import Announcement, PeerState
from elsewhere.peer.childmsg import Outcome
from elsewhere.peer.controller import Controller
from elsewhere.peer.messages import Result
from elsewhere.peer.peertable import PeerInfo
from elsewhere.peer.placement import ControllerSettings, Worker


class _Job:
    def __init__(self, store: object) -> None:
        self.store = store


def _controller(tmp_path: Path, n: int) -> Controller:
    store = create_store(tmp_path, {"id": "j", "name": "j", "n_tasks": n, "seed": 5}, retries=0,
                         stream=False, n_tasks=n)  # fmt: skip
    with PayloadWriter(store.path / "payload.log") as w:
        w.write_common(abs, None)
        w.write_tasks(0, list(range(n)), form="single")
    c = Controller(_Job(store), ControllerSettings())  # type: ignore[arg-type]
    c._load_state()
    return c


def _worker(i: int) -> Worker:
    ann = Announcement(peer_id=f"{i:032x}", group="lab", address="127.0.0.1", port=7000 + i, user="u",
                       host="h", state=PeerState.IDLE, slots=1, slots_free=1, mem_bytes=1 << 30,
                       time_s=math.inf)  # fmt: skip
    return Worker(ann.peer_id, PeerInfo(ann, ("127.0.0.1", 7000 + i), 0.0, 0.0))


def _result(bid: str, tasks: list[int], status: Outcome = Outcome.OK) -> tuple[Result, tuple[Any, ...]]:
    pickled, oob = serial.dumps([f"v{t}" for t in tasks])
    items = [[t, 0, int(status), 0, k, 1.0, 1.0, 100, 0] for k, t in enumerate(tasks)]
    return Result(bid, {"items": items, "groups": [[len(pickled), len(oob)]], "seconds": 0.01}), (
        pickled, b"", *oob)


def _stored(c: Controller) -> list[int]:
    return [row[0] for _w, parts, _ack, _bufs in c.to_record for _p, _o, rows in parts for row in rows]


def test_a_result_for_tasks_that_ended_already_is_dropped_task_by_task(tmp_path: Path) -> None:
    c = _controller(tmp_path, 8)
    a, b = _worker(1), _worker(2)
    c._on_result(a, *_result("a-1", [0, 1, 2, 3]))
    assert set(c.final) == {0, 1, 2, 3} and _stored(c) == [0, 1, 2, 3]
    c._on_result(b, *_result("b-1", [2, 3, 4, 5]))  # 2 and 3 ran twice: the first result counts
    assert _stored(c) == [0, 1, 2, 3, 4, 5] and c.stats["duplicates"] == 2
    assert set(c.final) == set(range(6))
    c._on_result(b, *_result("b-2", [1, 0]))  # nothing new in it
    assert _stored(c) == [0, 1, 2, 3, 4, 5] and c.stats["duplicates"] == 4
    c.cancelled.add(7)
    c._on_result(a, *_result("a-2", [6, 7, 6]))  # a cancelled task, and one twice in a RESULT
    assert _stored(c) == [0, 1, 2, 3, 4, 5, 6] and c.stats["duplicates"] == 6
    assert set(c.final) == set(range(7))


def test_the_tasks_of_a_batch_that_its_result_does_not_report_are_placed_again(tmp_path: Path) -> None:
    from elsewhere.peer.placement import Batch

    c = _controller(tmp_path, 8)
    c.pending.clear()
    w = _worker(1)
    for bid, tasks in (("a-1", [0, 1, 2, 3]), ("a-2", [4, 5, 6, 7])):
        b = Batch(bid, w, list(tasks), [0] * len(tasks), 0.0)
        c.batches[bid] = w.batches[bid] = b
        for i in tasks:
            c.inflight[i] = {bid}
    c._on_result(w, *_result("a-1", [0, 2]))  # 1 and 3 unreported (a worker of another version?)
    assert sorted(c.pending) == [1, 3] and set(c.final) == {0, 2}
    c._on_result(w, *_result("a-2", [4, 5, 6, 7]))  # all reported: nothing placed again
    assert sorted(c.pending) == [1, 3] and set(c.final) == {0, 2, 4, 5, 6, 7}
    assert not c.batches and not c.inflight


def _runs_result(bid: str, runs: list[tuple[int, int]], singles: list[int] = ()) -> tuple[Result, tuple[Any, ...]]:
    """A RESULT with ``runs`` (first, count) of successes as one entry each, then ``singles``
    as items; the values of the runs' tasks first, in one group."""
    tasks = [first + k for first, count in runs for k in range(count)] + list(singles)
    pickled, oob = serial.dumps([f"v{t}" for t in tasks])
    entries, at = [], 0
    for first, count in runs:
        entries.append([first, count, 0, 0, at, 1.0, 1.001, 100])
        at += count
    items = [[t, 0, int(Outcome.OK), 0, at + k, 1.0, 1.0, 100, 0] for k, t in enumerate(singles)]
    info = {"items": items, "runs": entries, "groups": [[len(pickled), len(oob)]], "seconds": 0.01}
    return Result(bid, info), (pickled, b"", *oob)


def _rows(c: Controller) -> list[tuple[int, int, int]]:
    """(task, item, count) of each row handed to the recorder."""
    return [(row[0], row[2], row[10]) for _w, parts, _ack, _bufs in c.to_record for _p, _o, rows in parts
            for row in rows]  # fmt: skip


def test_a_run_of_successes_is_one_row_and_finalises_each_of_its_tasks(tmp_path: Path) -> None:
    c = _controller(tmp_path, 100)
    got: list[tuple[int, bool, Any, int]] = []
    c.on_outcome = lambda *a: got.append(a)
    w = _worker(1)
    c._on_result(w, *_runs_result("a-1", [(0, 40), (50, 10)], singles=[45]))
    assert _rows(c) == [(0, 0, 40), (50, 40, 10), (45, 50, 1)]
    assert set(c.final) == {*range(40), *range(50, 60), 45} and c.n_measured == 51
    row = c.to_record[0][1][0][2][0]
    assert row[1] is True and row[8] == 5 and row[5:7] == (1.0, 1.001)  # seed of its first task
    c._deliver_outcomes()  # an Executor gets each task's value and seed
    assert sorted(got) == sorted((t, True, f"v{t}", 5 + t) for t in [*range(40), *range(50, 60), 45])
    # a run holding a task that ended already: its tasks one by one, the ended one dropped
    c._on_result(w, *_runs_result("a-2", [(38, 5)]))
    assert _rows(c)[3:] == [(40, 2, 1), (41, 3, 1), (42, 4, 1)] and c.stats["duplicates"] == 2
    # two runs of one RESULT that overlap: one by one too, each task stored once
    c._on_result(w, *_runs_result("a-3", [(60, 5), (63, 4)]))
    assert [r[0] for r in _rows(c)[6:]] == [60, 61, 62, 63, 64, 65, 66] and c.stats["duplicates"] == 4
    # a cancelled task inside a run
    c.cancelled.add(71)
    c._on_result(w, *_runs_result("a-4", [(70, 3)]))
    assert [r[0] for r in _rows(c)[13:]] == [70, 72] and 71 not in c.final


def test_a_run_outside_the_job_is_a_malformed_result(tmp_path: Path) -> None:
    c = _controller(tmp_path, 10)
    w = _worker(1)
    why: list[str] = []
    c._disconnected = lambda worker, reason: why.append(reason)  # type: ignore[method-assign]
    c._on_result(w, *_runs_result("a-1", [(8, 3)]))  # tasks 8, 9, 10: there is no task 10
    assert why and "malformed RESULT" in why[0] and "is not one of this job's 10 tasks" in why[0]
    assert not c.final and not c.to_record


def test_a_workers_record_names_no_task_process_of_it(tmp_path: Path) -> None:
    # Before: the pid of the task process that sent a daemon's last RESULT went into the
    # daemon's record, which says who runs its tasks; on a daemon of several slots another of
    # its task processes runs the next task: the record named the wrong process (the
    # conformance suite's "who ran the task" check failed on a loaded machine)
    import json

    c = _controller(tmp_path, 4)
    w = _worker(1)
    w.wid, w.host = "peer-h-00000001-j", "h"
    c._write_worker_info(w)  # as when it connected
    msg, buffers = _result("a-1", [0])
    c._on_result(w, Result(msg.task_id, {**msg.info, "host": "h", "pid": 4242}), buffers)
    info = json.loads((c.store.path / "workers" / f"{w.wid}.json").read_text())
    assert info["peer_id"] == w.peer_id and info["host"] == "h"
    assert "pid" not in info, info


def test_tasks_a_worker_asks_to_get_back_alone_go_each_in_a_batch_of_its_own(tmp_path: Path) -> None:
    c = _controller(tmp_path, 8)
    a = _worker(1)
    c.pending.clear()
    c._on_result(a, *_result("a-1", [0, 1]))
    back, _ = _result("a-1", [2, 3, 4], Outcome.REQUEUE)
    c._on_result(a, Result("a-1", {**back.info, "alone": [3, 4]}), (b"", b""))
    assert c.alone == {3, 4}
    assert set(c.pending) == {2, 3, 4}  # placed again
    c.pending.clear()
    c.pending.extend([2, 5, 3, 6, 7])
    assert c._alone_cut(4) == 2  # 2 and 5 together, up to 3
    c.pending.popleft(), c.pending.popleft()
    assert c._alone_cut(4) == 1  # 3 alone
    c.pending.popleft()
    assert c._alone_cut(4) == 4  # 6 and 7: nothing alone among them (the batch takes what is left)
    c._on_result(a, *_result("a-2", [3]))  # an outcome: no longer to be sent alone
    assert c.alone == {4}
