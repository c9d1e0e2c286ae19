"""A task process's outcomes on their way to its daemon (BatchResults): runs of quiet
successes as one entry each, the tasks with output as items, and the rarer paths (a value
that cannot be pickled, a group sent in parts) that need them task by task."""

from __future__ import annotations

import pickle
import socket
import threading
from typing import Any

from elsewhere.folder.errorrecord import ErrorRecord
from elsewhere.peer.childmsg import MessageReader, Outcome
from elsewhere.peer.childresults import BatchResults, Leases


def _results(group_bytes: int = 64 << 20) -> tuple[BatchResults, MessageReader, socket.socket]:
    a, b = socket.socketpair()

    def error(exc: BaseException, index: int) -> ErrorRecord:
        return ErrorRecord(type(exc).__name__, str(exc), "", "h", 1, index, index)

    out = BatchResults(a, "x", leases=Leases(), error=error, finish=lambda header: None, group_bytes=group_bytes)
    return out, MessageReader(b), a


def _read(reader: MessageReader) -> list[tuple[dict[str, Any], dict[int, tuple[int, Any, bytes]]]]:
    """Each message: its header, and per task (fate, value, output)."""
    got = []
    while True:
        msg = reader.read_one(poll_until=0)
        if msg is None:
            return got
        header, body, _fds = msg
        plen, parts = header["group"]
        oob, pos = [], plen
        for part in parts:
            oob.append(bytes(body[pos : pos + part[0]]))
            pos += part[0]
        values = pickle.loads(bytes(body[:plen]), buffers=oob)
        tasks: dict[int, tuple[int, Any, bytes]] = {}
        for index, _attempt, fate, item, _t0, _t1, _rss, log_len in header["items"]:
            tasks[index] = (fate, values[item], bytes(body[pos : pos + log_len]))
            pos += log_len
        for first, count, item, *_ in header.get("runs", ()):
            for k in range(count):
                tasks[first + k] = (int(Outcome.OK), values[item + k], b"")
        got.append((header, tasks))
        if header["last"]:
            return got


def test_a_run_is_one_entry_a_stretch_between_the_tasks_that_wrote_output() -> None:
    out, reader, _sock = _results()
    out.add_run(0, list(range(100, 110)), 1.0, 1.1, {})
    out.add_run(10, list(range(110, 120)), 1.1, 1.2, {2: b"two\n", 3: b"three\n", 9: b"nine\n"})
    out.send(last=True)
    [(header, tasks)] = _read(reader)
    assert [r[:3] for r in header["runs"]] == [[0, 10, 0], [10, 2, 10], [14, 5, 14]]
    assert [it[0] for it in header["items"]] == [12, 13, 19]
    assert all(r[5] > 0 for r in header["runs"])  # the peak memory, as items get it
    assert tasks == {t: (0, 100 + t, {12: b"two\n", 13: b"three\n", 19: b"nine\n"}.get(t, b"")) for t in range(20)}


def test_a_value_that_cannot_be_pickled_inside_a_run_is_its_own_task_s_error() -> None:
    out, reader, _sock = _results()
    out.add_run(0, [0, 1, 2], 1.0, 1.1, {})
    out.add_run(3, [3, threading.Lock(), 5, 6], 1.1, 1.2, {3: b"out\n"})
    out.send(last=True)
    [(header, tasks)] = _read(reader)
    assert "runs" not in header  # (task by task once a value failed)
    assert tasks[4][0] == int(Outcome.ERROR) and "lock" in str(tasks[4][1]).lower()
    assert tasks[4][1]["index"] == 4  # the error names the task whose value it is
    assert {t: v for t, (f, v, _log) in tasks.items() if t != 4} == {0: 0, 1: 1, 2: 2, 3: 3, 5: 5, 6: 6}
    assert tasks[6][2] == b"out\n" and tasks[5][2] == b""


def test_a_large_group_goes_in_parts_each_task_once_with_its_own_output() -> None:
    out, reader, _sock = _results(group_bytes=3000)
    big = [bytes([k]) * 1000 for k in range(12)]
    out.add_run(0, big[:6], 1.0, 1.1, {})
    out.add_run(6, big[6:], 1.1, 1.2, {1: b"seven\n"})
    out.send(last=True)
    got = _read(reader)
    assert len(got) > 2 and [h["last"] for h, _ in got] == [False] * (len(got) - 1) + [True]
    seen: dict[int, tuple[int, Any, bytes]] = {}
    for _header, tasks in got:
        assert not set(tasks) & set(seen)
        seen.update(tasks)
    assert seen == {t: (0, big[t], b"seven\n" if t == 7 else b"") for t in range(12)}
