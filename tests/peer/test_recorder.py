"""The peer controller's recorder: a RESULT's group of outcomes written to the job folder as
the journal reader reads it back."""

from __future__ import annotations

import os
from pathlib import Path

from elsewhere.folder import serial
from elsewhere.folder.journal import JournalReader, read_body
from elsewhere.folder.records import Kind, scan_frames
from elsewhere.folder.store import JobStore
from elsewhere.peer.recorder import RANGE_SPAN_S, GroupWriter


def _records(store: JobStore, wid: str) -> list:
    data = Path(store.journal_path(wid)).read_bytes()
    return scan_frames(data)[0]


def _folder(tmp_path: Path, n: int) -> tuple[JobStore, bytes, list]:
    """A job folder, and ``n`` values ("v0"...) pickled as one group."""
    for sub in ("journal", "results", "logs"):
        os.makedirs(tmp_path / sub, exist_ok=True)
    pickled, oob = serial.dumps([f"v{t}" for t in range(n)])
    return JobStore(tmp_path), pickled, oob


def test_tiny_successes_of_consecutive_tasks_are_one_range_record_and_read_back_each(tmp_path: Path) -> None:
    # Before: one record per task, which the caller's wait parsed again record by record (a job of
    # 10 000 no-ops: 10 000 records, a quarter of the caller's CPU with the reading of results).
    store, pickled, oob = _folder(tmp_path, 300)
    t = 100.0
    rows = []
    for task in range(300):
        ok = task != 150
        log = b"hello\n" if task == 100 else b""
        # tasks 200.. take 4 ms each: a range holds what ran within RANGE_SPAN_S
        t0 = t if task < 200 else t + (task - 200) * 0.004
        rows.append((1000 + task, ok, task, 0, log, t0, t0 + 1e-5, 1000 + task, 5 + 1000 + task, 0, 1))
    w = GroupWriter(store, "peer-x")
    w.write_group(pickled, oob, rows)
    w.sync()
    recs = _records(store, "peer-x")
    spans = [(r.task, r.count) for r in recs]
    # (1151 .. 1202: the first of the slower tasks began within RANGE_SPAN_S of 1151)
    assert spans[:5] == [(1000, 100), (1100, 1), (1101, 49), (1150, 1), (1151, 52)]
    assert recs[1].log_len == 6 and recs[3].kind == Kind.ERROR
    per = int(RANGE_SPAN_S / 0.004) + 1  # tasks a range of the slower ones holds
    assert all(c <= per for _, c in spans[5:]) and sum(c for _, c in spans) == 300
    assert recs[0].peak_rss == 1099 and recs[0].seed == 1005
    reader = JournalReader(store)
    reader.refresh()
    assert len(reader.final) == 300
    cache: dict = {}
    for task in (1000, 1042, 1099, 1100, 1120, 1199, 1234, 1299):
        wid, rec = reader.final[task]
        assert read_body(store, wid, rec, cache, task) == f"v{task - 1000}"


def test_a_run_reported_as_one_entry_is_one_record_and_joins_the_rows_beside_it(tmp_path: Path) -> None:
    store, pickled, oob = _folder(tmp_path, 100)
    rows = [
        (0, True, 0, 0, b"", 1.0, 1.005, 10, 7, 0, 40),  # tasks 0..39: one entry
        (40, True, 40, 0, b"", 1.005, 1.005, 30, 47, 0, 1),  # joins it (within RANGE_SPAN_S)
        (41, True, 41, 0, b"", 1.006, 1.008, 20, 48, 0, 9),  # and so does this run (41..49)
        (50, True, 50, 0, b"out\n", 1.06, 1.06, 10, 57, 0, 1),  # output: alone
        (51, True, 51, 0, b"", 1.07, 1.08, 10, 58, 0, 20),  # 51..70
        (72, True, 71, 0, b"", 1.08, 1.08, 10, 79, 0, 1),  # not the next task: a record of its own
        (73, True, 72, 0, b"", 1.08, 1.095, 10, 80, 0, 28),  # 73..100: beyond the span of 72's
    ]
    w = GroupWriter(store, "peer-x")
    w.write_group(pickled, oob, rows)
    w.sync()
    recs = _records(store, "peer-x")
    assert [(r.task, r.item, r.count) for r in recs] == [(0, 0, 50), (50, 50, 1), (51, 51, 20), (72, 71, 1), (73, 72, 28)]
    assert (recs[0].t_start, recs[0].t_end, recs[0].peak_rss, recs[0].seed) == (1.0, 1.008, 30, 7)
    reader = JournalReader(store)
    reader.refresh()
    assert sorted(reader.final) == [*range(71), *range(72, 101)]
    cache: dict = {}
    for task, item in ((0, 0), (39, 39), (49, 49), (70, 70), (72, 71), (100, 99)):
        wid, rec = reader.final[task]
        assert read_body(store, wid, rec, cache, task) == f"v{item}"


def test_the_output_file_is_synced_only_when_a_task_wrote_to_it(tmp_path: Path, monkeypatch) -> None:
    """Each RESULT's sync made three files durable; the tasks' output file rarely grows, and an
    fsync with nothing to write still costs tens of microseconds: it is left out then."""
    store, pickled, oob = _folder(tmp_path, 2)
    w = GroupWriter(store, "peer-x")
    synced: list[int] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd)))

    def group(log: bytes) -> list[int]:
        synced.clear()
        rows = [(t, True, t, 0, log if t else b"", 1.0, 1.1, 0, t, 0, 1) for t in range(2)]
        w.write_group(pickled, oob, rows)
        w.sync()
        return sorted(synced)

    everything = sorted((w.res_fd, w.jfd, w.log_fd))
    assert group(b"") == everything  # the first sync: all three
    assert group(b"") == sorted((w.res_fd, w.jfd))  # no output since: not the output file
    assert group(b"printed\n") == everything
    assert Path(store.log_path("peer-x")).read_bytes() == b"printed\n"
