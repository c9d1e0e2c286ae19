"""Journal frames and result bodies: torn writes are never read as results."""

from __future__ import annotations

import pytest

from elsewhere.folder import records
from elsewhere.folder.records import Kind


def test_frames_round_trip_and_torn_tail():
    recs = [records.make_record(Kind.OK, i, item=i, t_start=1.5) for i in range(5)]
    data = records.pack_frame(recs[:3]) + records.pack_frame(recs[3:])
    got, used = records.parse_frames(data)
    assert [r.task for r in got] == [0, 1, 2, 3, 4] and used == len(data)
    for cut in range(1, len(data)):
        got, used = records.parse_frames(data[:cut])
        assert [r.task for r in got] in ([], [0, 1, 2]) and used <= cut


def test_a_damaged_frame_is_skipped_not_read():
    good = records.pack_frame([records.make_record(Kind.OK, 2)])
    data = bytearray(records.pack_frame([records.make_record(Kind.OK, 1)])) + good
    data[len(good) - 1] ^= 0xFF  # the first frame's last byte
    got, used = records.parse_frames(data)
    assert [r.task for r in got] == [2] and used == len(data)


def test_body_round_trip_and_damage():
    parts = records.pack_body(b"pickle-bytes", [memoryview(b"buffer-one")])
    blob = b"".join(bytes(p) for p in parts)
    pickled, bufs = records.unpack_body(blob)
    assert bytes(pickled) == b"pickle-bytes" and [bytes(b) for b in bufs] == [b"buffer-one"]
    broken = bytearray(blob)
    broken[30] ^= 1
    with pytest.raises(ValueError):
        records.unpack_body(broken)


def test_a_claim_in_either_form_holds_its_tasks_and_no_other():
    for claim in ([3, 6], [-1, 3, 4, 5]):
        assert [i for i in range(8) if records.claim_holds(claim, i)] == [3, 4, 5] == list(records.iter_ranges(claim))
    assert not records.claim_holds([], 0) and not records.claim_holds([-1], 0)
