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
