"""Damage in a job folder's files costs only what it touched: journal frames are found again
after damage (the next magic whose head checksum holds), a tail being written is not damage,
result bodies (their out-of-band buffers included), payload chunks and sealed JSON are checked."""

from __future__ import annotations

import json
import os
import random
import struct
import zlib

import pytest

from elsewhere.folder import records
from elsewhere.folder.journal import JournalReader
from elsewhere.folder.payload import PayloadReader, PayloadWriter
from elsewhere.folder.records import Kind
from elsewhere.folder.store import JobStore
from elsewhere.util.errors import DamagedJob

np = pytest.importorskip("numpy")


def frames(n_frames: int, per: int = 2) -> tuple[bytes, list[tuple[int, int, list[int]]]]:
    """A journal of ``n_frames`` frames; and each frame's (start, end, tasks)."""
    data = b""
    layout = []
    for k in range(n_frames):
        tasks = list(range(k * per, k * per + per))
        frame = records.pack_frame(
            [records.make_record(Kind.OK, t, item=t, t_start=1.5) for t in tasks]
        )
        layout.append((len(data), len(data) + len(frame), tasks))
        data += frame
    return data, layout


def tasks_of(recs: list[records.Record]) -> list[int]:
    return [r.task for r in recs]


def test_every_cut_is_a_tail_not_damage():
    data, layout = frames(4)
    for cut in range(len(data) + 1):
        recs, used, damaged = records.scan_frames(data[:cut])
        whole = [t for a, b, ts in layout if b <= cut for t in ts]
        assert tasks_of(recs) == whole and not damaged
        assert used == max([b for a, b, _ in layout if b <= cut], default=0)


def test_a_flipped_bit_costs_its_own_frame_only():
    data, layout = frames(5)
    rng = random.Random(1)
    for _ in range(500):
        pos = rng.randrange(len(data))
        broken = bytearray(data)
        broken[pos] ^= 1 << rng.randrange(8)
        recs, used, damaged = records.scan_frames(broken)
        ((a, b, hit),) = [f for f in layout if f[0] <= pos < f[1]]
        assert tasks_of(recs) == [t for _, _, ts in layout if ts != hit for t in ts]
        assert used == len(data)
        assert len(damaged) == 1 and damaged[0][0] == a and damaged[0][1] >= b - 3


def test_garbage_anywhere_is_skipped_to_the_next_frame():
    data, layout = frames(5)
    rng = random.Random(2)
    for _ in range(500):
        pos = rng.randrange(len(data) + 1)
        junk = rng.randbytes(rng.randrange(1, 400))
        broken = data[:pos] + junk + data[pos:]
        recs, used, damaged = records.scan_frames(broken)
        cut = [ts for a, b, ts in layout if a < pos < b]  # a frame split by the garbage is lost
        assert tasks_of(recs) == [t for _, _, ts in layout if ts not in cut for t in ts]
        assert damaged and used == len(broken)
        assert sum(b - a for a, b, _ in damaged) >= len(junk)


def test_damage_then_a_frame_being_written():
    data, _ = frames(3)
    junk = b"\x00garbage!" * 5
    nxt = records.pack_frame([records.make_record(Kind.OK, 99)])
    stream = data + junk + nxt
    for cut in range(len(data) + len(junk), len(stream)):
        recs, used, damaged = records.scan_frames(stream[:cut])
        assert tasks_of(recs) == [0, 1, 2, 3, 4, 5]
        assert damaged == [(len(data), len(data) + len(junk), "bytes that are not a frame")] or (
            damaged and damaged[0][0] == len(data) and used == len(data) + len(junk)
        )
        rest, _, later = records.scan_frames(stream[used:])  # the reader goes on from ``used``
        assert tasks_of(rest) == [99] and not later


def test_reading_in_pieces_finds_what_reading_at_once_finds():
    data, layout = frames(6)
    broken = bytearray(data)
    broken[layout[2][0] + 30] ^= 4
    broken[layout[4][0] : layout[4][0]] = b"noise" * 7
    whole, _, dmg_whole = records.scan_frames(broken)
    rng = random.Random(3)
    for _ in range(50):
        got, spans, off, size = [], [], 0, 0
        while off < len(broken):
            size = min(len(broken), size + rng.randrange(1, 90))
            recs, used, damaged = records.scan_frames(broken[off:size])
            got += recs
            spans += [(off + a, off + b) for a, b, _ in damaged]
            off += used
            if size == len(broken) and not used:
                break
        assert tasks_of(got) == tasks_of(whole)
        merged = []
        for a, b in spans:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        assert merged == [(a, b) for a, b, _ in dmg_whole]


def test_format_1_frames_are_still_read():
    recs = [records.make_record(Kind.OK, t) for t in range(3)]
    body = b"".join(struct.pack("<BBHIIIqqqqddqq", *r) for r in recs)
    old = struct.pack("<III", 0x45574A31, 3, zlib.crc32(body)) + body
    got, _, damaged = records.scan_frames(
        old + records.pack_frame([records.make_record(Kind.OK, 3)])
    )
    assert tasks_of(got) == [0, 1, 2, 3] and not damaged


def test_out_of_band_buffers_are_checked():
    from elsewhere.folder import serial

    arr = np.arange(20000, dtype=np.float64)  # 160 kB: out of band
    pickled, bufs = serial.dumps_plain([arr, "x"])
    assert bufs
    blob = b"".join(bytes(p) for p in records.pack_body(pickled, bufs))
    p, b = records.unpack_body(blob)
    assert np.array_equal(serial.loads(p, b)[0], arr)
    start = len(blob) - sum(x.nbytes for x in bufs)
    rng = random.Random(4)
    for _ in range(200):
        broken = bytearray(blob)
        broken[rng.randrange(start, len(blob))] ^= 1 << rng.randrange(8)  # inside the array's bytes
        with pytest.raises(ValueError, match="checksum mismatch"):
            records.unpack_body(broken)


def test_sealed_json_every_bit_flip_is_found():
    body = json.dumps({"name": "j", "n_tasks": 60, "seed": 7}, separators=(",", ":")).encode()
    sealed = records.seal_json(body)
    assert json.loads(sealed)["n_tasks"] == 60 and records.open_json(sealed) == body
    assert records.open_json(body) == body  # written before seals: as it is
    for i in range(len(sealed)):
        for bit in range(8):
            broken = bytearray(sealed)
            broken[i] ^= 1 << bit
            try:
                json.loads(records.open_json(bytes(broken)))
            except ValueError:
                continue
            pytest.fail(f"a flip of bit {bit} of byte {i} went unseen: {bytes(broken)!r}")


def _payload(tmp_path, n=40):
    path = tmp_path / "payload.log"
    (tmp_path / "job.json").write_text("{}")
    with PayloadWriter(path, compress=True) as w:
        w.write_common(len, None)
        for k in range(0, n, 5):  # chunks of five tasks, each with an array out of band
            w.write_tasks(k, [(None, (np.full(9000, float(t)),), {}) for t in range(k, k + 5)])
    return path


def _chunk_starts(path):
    data = path.read_bytes()
    return [i for i in range(len(data)) if data[i : i + 4] in records.PAYLOAD_MAGICS]


def test_a_damaged_payload_chunk_costs_its_own_tasks(tmp_path):
    path = _payload(tmp_path)
    starts = _chunk_starts(path) + [path.stat().st_size]
    data = path.read_bytes()
    rng = random.Random(5)
    for trial in range(60):
        k = rng.randrange(1, len(starts) - 1)  # a chunk of tasks (0 is the common one)
        pos = rng.randrange(starts[k], starts[k + 1])
        broken = bytearray(data)
        broken[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(broken)
        reader = PayloadReader(path)
        hit = range((k - 1) * 5, k * 5)
        for t in range(40):
            if t in hit:
                with pytest.raises(DamagedJob, match=rf"payload.log, task {t}, "):
                    reader.task(t)
            else:
                assert reader.task(t)[1][0][0] == float(t)
        reader.close()
    assert (tmp_path / "damage.txt").exists()  # said in the job's damage log
    path.write_bytes(data[: starts[3] + 10])  # cut inside a chunk
    reader = PayloadReader(path)
    assert reader.task(9)[1][0][0] == 9.0
    with pytest.raises(DamagedJob, match=r"task 12, .*cut short"):
        reader.task(12)


def test_journal_reader_reports_damage_and_reads_past_it(tmp_path):
    os.makedirs(tmp_path / "journal")
    store = JobStore(tmp_path)
    data, layout = frames(4)
    broken = bytearray(data)
    broken[layout[1][0] + 40] ^= 2
    (tmp_path / "journal" / "w3.rec").write_bytes(bytes(broken[: layout[1][0] + 50]))
    reader = JournalReader(store)
    reader.refresh()
    assert sorted(reader.final) == [0, 1] and not reader.damage_notes()  # a tail so far
    (tmp_path / "journal" / "w3.rec").write_bytes(bytes(broken))
    reader.refresh()
    assert sorted(reader.final) == [0, 1, 4, 5, 6, 7]
    (note,) = reader.damage_notes()
    assert note.startswith(
        f"damaged: journal/w3.rec: {layout[1][1] - layout[1][0]} bytes at byte {layout[1][0]}"
    )
    os.remove(tmp_path / "journal" / "w3.rec")
    reader.refresh()
    assert "damaged: journal/w3.rec is missing" in reader.damage_notes()


def test_a_damaged_mark_outranks_the_result_of_its_attempt(tmp_path):
    os.makedirs(tmp_path / "journal")
    store = JobStore(tmp_path)
    ok = records.pack_frame([records.make_record(Kind.OK, t) for t in range(3)])
    mark = records.pack_frame([records.make_record(Kind.LOST, 1, flags=records.FLAG_DAMAGED)])
    (tmp_path / "journal" / "w1.rec").write_bytes(ok)
    (tmp_path / "journal" / "_control.rec").write_bytes(mark)
    reader = JournalReader(store)
    reader.refresh()  # whichever journal is read first
    assert reader.final[1][1].kind == Kind.LOST and reader.damaged_tasks == {1}
    assert reader.kind_counts[Kind.OK] == 2 and reader.kind_counts[Kind.LOST] == 1
    again = records.pack_frame([records.make_record(Kind.OK, 1, attempt=1)])  # a retry's result
    (tmp_path / "journal" / "w2.rec").write_bytes(again)
    reader.refresh()
    assert reader.final[1][1].kind == Kind.OK and not reader.damaged_tasks
