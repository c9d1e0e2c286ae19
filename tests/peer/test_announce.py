"""Announcement datagrams and the peer table, without sockets."""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from dataclasses import replace

import msgpack
import pytest

from elsewhere.peer import announce
from elsewhere.peer.announce import (
    MAX_DATAGRAM,
    Announcement,
    AnnouncementDecoder,
    ClockSkew,
    PeerState,
    announce_key,
    encode_announcement,
    new_peer_id,
    with_fields,
)
from elsewhere.peer.keys import GroupKey
from elsewhere.peer.peertable import PeerFilter, PeerTable
from elsewhere.util.errors import ProtocolError

NOW = 1_800_000_000.0


def _ann(group: str = "test", **changes: object) -> Announcement:
    base = Announcement(
        peer_id="ab" * 16,
        group=group,
        address="10.0.0.5",
        port=7001,
        user="alice",
        host="ws5",
        state=PeerState.IDLE,
        slots=4,
        slots_free=3,
        mem_bytes=8 << 30,
        time_s=math.inf,
        task=None,
        timestamp=NOW,
        counter=1,
    )
    return with_fields(base, changes)


def test_round_trip(key: GroupKey) -> None:
    ann = _ann(task="job-1/7", state=PeerState.BUSY, time_s=3600.0)
    data = encode_announcement(ann, key)
    assert len(data) < 200  # compact
    assert AnnouncementDecoder(key).decode(data, NOW + 1) == ann


def test_loopback_only_round_trip() -> None:
    ann = _ann(group="")
    assert AnnouncementDecoder(None).decode(encode_announcement(ann, None), NOW) == ann


def test_state_numbers_never_change() -> None:
    assert {s.name: s.value for s in PeerState} == {
        "ZOMBIE": 0, "CONTROLLER": 1, "IDLE": 2, "BUSY": 3,
    }  # fmt: skip


def test_other_key_never_accepted(key: GroupKey, other_key: GroupKey) -> None:
    data = encode_announcement(_ann(), other_key)
    with pytest.raises(ProtocolError, match="authentication"):
        AnnouncementDecoder(key).decode(data, NOW)


def test_keyless_announcements_are_not_accepted_by_a_keyed_group(key: GroupKey) -> None:
    data = encode_announcement(_ann(group=""), None)
    with pytest.raises(ProtocolError, match="authentication"):
        AnnouncementDecoder(key).decode(data, NOW)
    data = encode_announcement(_ann(), key)
    with pytest.raises(ProtocolError, match="authentication"):
        AnnouncementDecoder(None).decode(data, NOW)


def test_announce_key_is_derived_not_the_group_key(key: GroupKey) -> None:
    assert announce_key(key) != key.secret
    assert announce_key(key) != announce_key(GroupKey("other", key.secret))


@pytest.mark.parametrize("offset", [0, 4, 5, 7, 9, 17, 25, 41, -1])
def test_any_flipped_bit_is_dropped(key: GroupKey, offset: int) -> None:
    data = bytearray(encode_announcement(_ann(), key))
    data[offset] ^= 0x02
    with pytest.raises(ProtocolError):
        AnnouncementDecoder(key).decode(bytes(data), NOW)


def test_dropped_before_the_body_is_parsed(key: GroupKey, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(announce.msgpack, "unpackb", lambda *a, **k: calls.append(a))
    decoder = AnnouncementDecoder(key)
    good = encode_announcement(_ann(), key)
    bad = [
        good[:-1] + bytes([good[-1] ^ 1]),  # tag
        encode_announcement(_ann(timestamp=NOW - 31), key),  # time
        encode_announcement(_ann(), GroupKey("test", bytes(32))),  # key
        good[:4] + b"\x02" + good[5:],  # version
        good + b"x",  # length
        good[:50],  # truncated
    ]
    for data in bad:
        with pytest.raises(ProtocolError):
            decoder.decode(data, NOW)
    assert calls == []


@pytest.mark.parametrize("skew", [-31.0, 31.0, -1e6])
def test_time_window(key: GroupKey, skew: float) -> None:
    data = encode_announcement(_ann(timestamp=max(NOW + skew, 0)), key)
    way = "ahead of" if skew > 0 else "behind"
    with pytest.raises(ClockSkew, match=f"its clock is {abs(max(NOW + skew, 0) - NOW):.0f} s {way} this machine's"):
        AnnouncementDecoder(key).decode(data, NOW)
    AnnouncementDecoder(key, window_s=1e7).decode(data, NOW)


def test_replay_is_dropped_and_counter_must_grow(key: GroupKey) -> None:
    decoder = AnnouncementDecoder(key)
    first = encode_announcement(_ann(counter=5), key)
    decoder.decode(first, NOW)
    with pytest.raises(ProtocolError, match="replayed"):
        decoder.decode(first, NOW)
    with pytest.raises(ProtocolError, match="replayed"):
        decoder.decode(encode_announcement(_ann(counter=4), key), NOW)
    decoder.decode(encode_announcement(_ann(counter=6), key), NOW)
    other_peer = _ann(peer_id="cd" * 16, counter=1)
    decoder.decode(encode_announcement(other_peer, key), NOW)


def test_replay_memory_is_bounded(key: GroupKey) -> None:
    decoder = AnnouncementDecoder(key, max_peers=10)
    for i in range(50):
        decoder.decode(encode_announcement(_ann(peer_id=new_peer_id()), key), NOW + i * 0.01)
    assert len(decoder._last) <= 10


def test_other_group_with_the_same_secret_is_dropped(key: GroupKey) -> None:
    """The group name is part of the key derivation and checked in the body."""
    twin = GroupKey("twin", key.secret)
    with pytest.raises(ProtocolError):
        AnnouncementDecoder(key).decode(encode_announcement(_ann("twin"), twin), NOW)


def test_body_checked_after_tag(key: GroupKey) -> None:
    """A key holder sending a bad body gets ProtocolError, not a crash."""
    good = encode_announcement(_ann(), key)
    for body in (msgpack.packb([1, 2]), msgpack.packb({"a": 1}), b"\xc1",
                 msgpack.packb(["test", "a", 99999, "u", "h", 2, 1, 1, 1, 1.0, None])):  # fmt: skip
        prefix = good[:6] + struct.pack(">H", len(body)) + good[8:40]
        signed = prefix + body
        data = signed + hmac.new(announce_key(key), signed, hashlib.sha256).digest()
        with pytest.raises(ProtocolError, match="announcement"):
            AnnouncementDecoder(key).decode(data, NOW)


def test_newer_peers_may_append_fields(key: GroupKey) -> None:
    ann = _ann()
    good = encode_announcement(ann, key)
    body = msgpack.unpackb(good[40:-32])
    body = msgpack.packb([*body, "future", 1])
    prefix = good[:6] + struct.pack(">H", len(body)) + good[8:40]
    data = prefix + body + hmac.new(announce_key(key), prefix + body, hashlib.sha256).digest()
    assert AnnouncementDecoder(key).decode(data, NOW) == ann


def test_longest_announcement_fits_one_datagram(key: GroupKey) -> None:
    longest = _ann(host="h" * 256, user="u" * 256, task="t" * 256, address="a" * 256,
                   group="g" * 64, mem_bytes=2**63 - 1, counter=2**64 - 1)  # fmt: skip
    assert len(encode_announcement(longest, GroupKey("g" * 64, key.secret))) <= MAX_DATAGRAM


def test_too_large_announcement_is_refused_when_made(
    key: GroupKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(announce, "MAX_DATAGRAM", 100)
    with pytest.raises(ValueError, match="over 100"):
        encode_announcement(_ann(host="h" * 100), key)


@pytest.mark.parametrize(
    "changes",
    [
        {"peer_id": "xyz"},
        {"peer_id": "zz" * 16},
        {"port": 70000},
        {"state": 9},
        {"slots_free": -1},
        {"time_s": float("nan")},
        {"mem_bytes": 1.5},
        {"task": 5},
        {"leaving": 1},
    ],
)
def test_announcement_fields_are_validated(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _ann(**changes)


def test_with_fields_names_unknown_fields() -> None:
    with pytest.raises(ValueError, match=r"no field.*colour"):
        with_fields(_ann(), {"colour": "red"})


# ------------------------------------------------------------ the table


def test_table_records_the_real_source_address() -> None:
    table = PeerTable()
    info = table.update(_ann(address="10.9.9.9", port=7001), ("192.168.1.20", 40000), 100.0)
    assert info is not None
    assert info.source == ("192.168.1.20", 40000)
    assert info.connect_address == ("192.168.1.20", 7001)  # not the claimed 10.9.9.9
    assert table.peers() == [info] and len(table) == 1 and info.peer_id in table


def test_table_expires_silent_peers() -> None:
    table = PeerTable(expire_after_s=3.5)
    table.update(_ann(peer_id="01" * 16), ("127.0.0.1", 1), 100.0)
    table.update(_ann(peer_id="02" * 16), ("127.0.0.1", 2), 100.0)
    assert table.expire(103.0) == []
    table.update(_ann(peer_id="02" * 16, counter=2), ("127.0.0.1", 2), 103.0)
    gone = table.expire(103.6)
    assert [p.peer_id for p in gone] == ["01" * 16]
    assert [p.peer_id for p in table.peers()] == ["02" * 16]
    assert table.get("02" * 16).first_seen == 100.0  # type: ignore[union-attr]


def test_table_knows_the_groups_a_peer_is_heard_in() -> None:
    table = PeerTable(expire_after_s=3.5)
    pid = "03" * 16
    table.update(_ann(peer_id=pid, group="lab"), ("127.0.0.1", 1), 100.0)
    table.update(_ann(peer_id=pid, group="dept", counter=2), ("127.0.0.1", 1), 101.0)
    assert len(table) == 1 and table.groups(pid, 101.5) == ["dept", "lab"]
    table.update(_ann(peer_id=pid, group="dept", counter=3), ("127.0.0.1", 1), 104.0)
    assert table.groups(pid, 104.0) == ["dept"]  # no longer heard in "lab"
    assert table.update(_ann(peer_id=pid, group="dept", leaving=True, counter=4), ("127.0.0.1", 1), 104.1) is None
    assert table.groups(pid, 104.1) == []


def test_leaving_peer_is_dropped_at_once() -> None:
    table = PeerTable()
    table.update(_ann(), ("127.0.0.1", 1), 1.0)
    assert table.update(_ann(leaving=True, counter=2), ("127.0.0.1", 1), 1.1) is None
    assert table.peers() == []


def test_filter_uses_the_source_address_not_the_claim() -> None:
    table = PeerTable(peer_filter=PeerFilter(refuse_addresses=("10.0.0.0/8",)))
    assert table.update(_ann(address="192.168.0.1"), ("10.1.2.3", 1), 1.0) is None
    assert table.update(_ann(address="10.1.2.3"), ("192.168.0.1", 1), 1.0) is not None


@pytest.mark.parametrize(
    ("flt", "source", "user", "listed"),
    [
        (PeerFilter(), "10.0.0.1", "alice", True),
        (PeerFilter(allow_addresses=("10.0.0.0/24",)), "10.0.0.1", "alice", True),
        (PeerFilter(allow_addresses=("10.0.0.0/24",)), "10.0.1.1", "alice", False),
        (PeerFilter(allow_addresses=("10.0.0.0/8",), refuse_addresses=("10.0.0.1",)), "10.0.0.1", "alice", False),
        (PeerFilter(allow_users=("bob",)), "10.0.0.1", "alice", False),
        (PeerFilter(refuse_users=("alice",)), "10.0.0.1", "alice", False),
        (PeerFilter(), "not-an-ip", "alice", False),
    ],
)  # fmt: skip
def test_peer_filter(flt: PeerFilter, source: str, user: str, listed: bool) -> None:
    assert flt.allows(_ann(user=user), source) is listed


def test_peer_filter_names_a_bad_network() -> None:
    with pytest.raises(ValueError, match="not-a-net"):
        PeerFilter(allow_addresses=("not-a-net",))


def test_filter_change_removes_a_listed_peer() -> None:
    table = PeerTable(peer_filter=PeerFilter(refuse_users=("mallory",)))
    table.update(_ann(user="alice"), ("127.0.0.1", 1), 1.0)
    table.update(replace(_ann(user="mallory"), counter=2), ("127.0.0.1", 1), 2.0)
    assert table.peers() == []
