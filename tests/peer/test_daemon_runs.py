"""The daemon's side of runs (a run of quiet successes as one entry): what its RESULT says to a
controller that reads runs and to one that does not, and the paths that need tasks one by one
(a batch cut short, a RESULT too large for a frame), each task reported exactly once."""

from __future__ import annotations

import pickle
import types
from typing import Any

import pytest

from elsewhere.peer.childmsg import Outcome
from elsewhere.peer.messages import Ask
from elsewhere.peer.runs import (
    Run,
    build_result,
    cap_result,
    fill_unfinished,
    run_tasks,
    take_results,
)


def _run(n: int) -> Run:
    """A batch of tasks 100..100+n-1: tasks 100..109 and 112..n reported in two runs, 110 and
    111 as rows (111 with output); one group holding all their values."""
    run = Run(1, "c", "t-1", Ask("t-1"), {"items": [[100 + k, 0] for k in range(n)], "job": {"seed": 3}})
    run.groups.append((pickle.dumps([f"v{k}" for k in range(n)]), []))
    run.runs = [[100, 10, 0, 0, 0, 1.0, 1.1, 7], [112, n - 12, 0, 0, 12, 1.1, 1.2, 7]]
    run.outcomes[110] = ([110, 0, int(Outcome.OK), 0, 10, 1.0, 1.0, 7, 0], b"")
    run.outcomes[111] = ([111, 0, int(Outcome.ERROR), 0, 11, 1.0, 1.0, 7, 4], b"oops")
    return run


def _tasks(info: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """task -> (fate, item) from a RESULT's info, each task once."""
    got: dict[int, tuple[int, int]] = {}
    entries = [(it[0], it[2], it[4]) for it in info["items"]] + [
        (first + k, int(Outcome.OK), item + k) for first, count, _a, _g, item, *_ in info.get("runs", ())
        for k in range(count)]  # fmt: skip
    for task, fate, item in entries:
        assert task not in got, f"task {task} twice"
        got[task] = (fate, item)
    return got


def test_a_controller_that_reads_runs_gets_them_one_that_does_not_gets_rows() -> None:
    want = {100 + k: (int(Outcome.ERROR) if k == 11 else int(Outcome.OK), k) for k in range(30)}
    info, buffers = build_result(_run(30), "h", 0.5, runs=True)
    assert len(info["items"]) == 2 and len(info["runs"]) == 2 and _tasks(info) == want
    assert bytes(buffers[1]) == b"oops"
    info, buffers = build_result(_run(30), "h", 0.5, runs=False)
    assert "runs" not in info and len(info["items"]) == 30 and _tasks(info) == want
    assert [it[0] for it in info["items"]] == list(range(100, 130))  # in the batch's order
    assert bytes(buffers[1]) == b"oops"


def test_a_batch_cut_short_hands_back_only_the_tasks_no_run_reported() -> None:
    run = _run(30)
    run.info["items"] += [[130, 0], [131, 0]]  # two more that never ran
    assert run_tasks(run) == 30
    fill_unfinished(run, -1, None, "", b"", 0.0, 0, "h")
    got = _tasks(build_result(run, "h", 0.5, runs=True)[0])
    assert sorted(got) == list(range(100, 132))
    assert got[130][0] == got[131][0] == int(Outcome.REQUEUE) and got[129] == (int(Outcome.OK), 29)


def test_a_result_too_large_for_a_frame_keeps_each_task_once() -> None:
    run = _run(30)
    run.groups.append((b"x" * 10_000, []))  # a second group, too large alone
    run.outcomes[130] = ([130, 0, int(Outcome.OK), 1, 0, 1.0, 1.0, 7, 0], b"")
    run.info["items"].append([130, 0])
    assert cap_result(run, 12_000, "h") == 1  # (room for group 0 and an error each)
    got = _tasks(build_result(run, "h", 0.5, runs=True)[0])
    assert sorted(got) == list(range(100, 131)) and got[130][0] == int(Outcome.ERROR)
    assert got[105] == (int(Outcome.OK), 5)


def test_a_run_larger_than_its_batch_is_garbage_from_the_child() -> None:
    run = Run(1, "c", "t-1", Ask("t-1"), {"items": [[k, 0] for k in range(10)]})
    child = types.SimpleNamespace(run=run)
    pickled = pickle.dumps(list(range(10)))
    header = {"op": "results", "items": [], "runs": [[0, 10, 0, 1.0, 1.1, 7]], "group": [len(pickled), []]}
    take_results(child, header, memoryview(pickled), [])  # type: ignore[arg-type]
    assert run.runs == [[0, 10, 0, 0, 0, 1.0, 1.1, 7]] and run_tasks(run) == 10
    for count in (11, 0, 10**12):  # (the daemon replaces a child that sends such a thing)
        header["runs"] = [[0, count, 0, 1.0, 1.1, 7]]
        with pytest.raises(ValueError, match="a run of"):
            take_results(child, header, memoryview(pickled), [])  # type: ignore[arg-type]


def _daemon_of(caps: tuple[str, ...]) -> Any:
    """What :meth:`Dispatch._several` looks at: the controller's connection and its caps."""
    peer = types.SimpleNamespace(conn=types.SimpleNamespace(peer=types.SimpleNamespace(caps=caps)))
    return types.SimpleNamespace(by_controller={"c": peer})


def test_a_child_that_died_for_several_tasks_charges_none_to_a_controller_that_sends_them_alone() -> None:
    from elsewhere.peer.dispatch import Dispatch

    run = Run(1, "c", "t-1", Ask("t-1"), {"items": [[100 + k, 0] for k in range(4)], "job": {"seed": 3}})
    run.outcomes[100] = ([100, 0, int(Outcome.OK), 0, 0, 1.0, 1.0, 7, 0], b"")
    assert Dispatch._several(_daemon_of(("alone", "runs")), run, Outcome.LOST) == -1
    assert run.alone == [101, 102, 103]
    fill_unfinished(run, -1, Outcome.LOST, "died", b"", 1.0, 9, "h")
    info, _ = build_result(run, "h", 0.1)
    assert info["alone"] == [101, 102, 103]
    assert {t: fate for t, (fate, _item) in _tasks(info).items()} == {
        100: int(Outcome.OK), 101: int(Outcome.REQUEUE), 102: int(Outcome.REQUEUE), 103: int(Outcome.REQUEUE)}


def test_to_a_controller_that_cannot_send_tasks_alone_the_first_unfinished_is_charged() -> None:
    # as before the cap: otherwise they would run together, and kill a child, for ever
    from elsewhere.peer.dispatch import Dispatch

    run = Run(1, "c", "t-1", Ask("t-1"), {"items": [[100 + k, 0] for k in range(4)], "job": {"seed": 3}})
    run.outcomes[100] = ([100, 0, int(Outcome.OK), 0, 0, 1.0, 1.0, 7, 0], b"")
    assert Dispatch._several(_daemon_of(("runs",)), run, Outcome.LOST) == 101
    assert run.alone == []
    # a death the daemon asked for, to hand the batch back: no one is charged
    assert Dispatch._several(_daemon_of(("alone",)), run, Outcome.REQUEUE) == -1 and run.alone == []
