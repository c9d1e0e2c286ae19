"""The TASK encoder reads a batch's inputs from the job's payload: runs of consecutive tasks
are sliced from their chunk at once, and whatever the order of a batch's tasks, each gets
its own inputs (checked against the payload's own reading of every task)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsewhere.folder import payload, serial
from elsewhere.peer.encoder import TaskEncoder


def double(x: int) -> int:
    return 2 * x


@pytest.fixture()
def reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> payload.PayloadReader:
    monkeypatch.setattr(payload, "_MAX_CHUNK_TASKS", 4)  # many chunks: runs that cross them
    path = tmp_path / "payload.log"
    with payload.PayloadWriter(path, compress=False) as w:
        w.write_common(double, None)
        w.write_tasks(0, list(range(10)), form="single")  # tasks 0-9: one argument each
        w.write_tasks(10, [(k, k + 1) for k in range(10, 16)], form="args")  # 10-15: tuples
        w.write_tasks(16, [(None, (k,), {"y": k}) for k in range(16, 20)], form="entries")  # 16-19
    r = payload.PayloadReader(path)
    yield r
    r.close()


@pytest.mark.parametrize("indices", [
    list(range(20)),  # every chunk and form, in order
    [2, 3, 4, 5, 6, 7, 12, 13, 14],  # runs crossing a chunk's end, and a gap
    [9, 10, 11],  # a run crossing from one form into another
    [5, 3, 4],  # not ascending
    [3, 9, 5],  # not a run, though its first and last are two apart
    [3, 4, 9, 10, 5],  # a run, then one out of order
    [17, 16, 18, 19],  # entries of their own
    [7],
])  # fmt: skip
def test_a_batch_carries_each_of_its_tasks_inputs_whatever_their_order(
        reader: payload.PayloadReader, indices: list[int]) -> None:  # fmt: skip
    enc = TaskEncoder(reader, {"id": "j"}, "always", 0.0)
    info, bufs = enc.encode(indices, [0] * len(indices), None, {}, {}, job_part=True)
    entries = serial.loads(bufs[0], bufs[1 : info["ntask"]])
    assert [tuple(e) for e in entries] == [tuple(reader.task(i)) for i in indices]
