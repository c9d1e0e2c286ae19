"""The wire codec and connection state machine, without sockets."""

from __future__ import annotations

import pickle
import struct

import msgpack
import numpy as np
import pytest
from peer_testing import make_pair, pump

from elsewhere.peer import messages, reader, wire
from elsewhere.peer.handshake import HandshakeRefused
from elsewhere.peer.keys import GroupKey
from elsewhere.peer.messages import (
    FIXED_SIZE,
    TAG_SIZE,
    Accept,
    Ack,
    Ask,
    Auth,
    Bye,
    Cancel,
    Challenge,
    Error,
    FixedHeader,
    Flags,
    Hello,
    Identity,
    MessageType,
    Ping,
    Pong,
    Refuse,
    RefuseReason,
    Result,
    Task,
)
from elsewhere.peer.wire import (
    Connection,
    ConnectionState,
    HandshakeComplete,
    Limits,
    Received,
    Role,
)
from elsewhere.util.errors import PeerError, ProtocolError

KEY_MODES = pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])


def _key(keyed: bool, key: GroupKey) -> GroupKey | None:
    return key if keyed else None


def _frame_bytes(conn: Connection) -> list[bytes]:
    return [f.tobytes() for f in conn.data_to_send()]


def _admit(a: Connection, b: Connection, task_id: str = "t1") -> None:
    a.send(Ask(task_id, mem_bytes=1 << 20, time_s=10, cores=1))
    pump(a, b)
    b.send(Accept(task_id))
    pump(a, b)


# ------------------------------------------------------------ fixed numbers


def test_message_type_numbers_never_change() -> None:
    assert {t.name: t.value for t in MessageType} == {
        "HELLO": 1, "CHALLENGE": 2, "AUTH": 3, "ASK": 10, "ACCEPT": 11, "REFUSE": 12,
        "TASK": 13, "RESULT": 14, "ACK": 15, "CANCEL": 16, "PING": 20, "PONG": 21,
        "BYE": 30, "ERROR": 31,
    }  # fmt: skip
    assert {r.name: r.value for r in RefuseReason} == {
        "BUSY": 1, "MEMORY": 2, "TIME": 3, "FAIR_SHARE": 4, "NOT_ALLOWED": 5, "DRAINING": 6,
    }  # fmt: skip


def test_fixed_header_is_32_bytes_and_round_trips() -> None:
    h = FixedHeader(MessageType.TASK, Flags.COMPRESSED, 7, 100, 2**40, 3)
    raw = h.pack()
    assert len(raw) == FIXED_SIZE == 32
    assert raw[:4] == b"ELSW" and raw[4] == 1 and raw[5] == 13
    assert FixedHeader.parse(raw) == h


@pytest.mark.parametrize(
    ("offset", "value", "match"),
    [
        (0, b"XLSW", "magic"),
        (4, b"\x02", "version 2"),
        (5, b"\x63", "unknown message type 99"),
        (6, b"\x80\x00", "unknown flags"),
        (30, b"\x00\x01", "reserved"),
    ],
)
def test_fixed_header_validation(offset: int, value: bytes, match: str) -> None:
    raw = bytearray(FixedHeader(MessageType.PING, Flags.NONE, 0, 5, 0, 0).pack())
    raw[offset : offset + len(value)] = value
    with pytest.raises(ProtocolError, match=match):
        FixedHeader.parse(raw)


# ------------------------------------------------------------ messages


@pytest.mark.parametrize(
    "message",
    [
        Hello("p", "g", "u", "h", True, b"n" * 32),
        Hello("p", "g", "u", "h", True, b"n" * 32, ("ack-many", "later-one")),
        Challenge("p", "g", "u", "h", False, b"n" * 32),
        Auth(),
        Ask("t", 5, 1.5, 2),
        Ask("t", 5, 1.5, 2, lane=True),
        Accept("t"),
        Refuse("t", RefuseReason.FAIR_SHARE, "later"),
        Task("t", {"job": "j", "attempt": 2}),
        Result("t", {"ok": True}),
        Ack("t"),
        Ack("t", ("u", "v")),
        Cancel("t"),
        Cancel("t", (4, 7)),
        Ping(3),
        Pong(3),
        Bye("done"),
        Error("protocol", "bad"),
    ],
)
def test_every_message_round_trips_through_its_header(message: messages.Message) -> None:
    packed = msgpack.packb(message.to_header(), use_bin_type=True)
    assert messages.parse_header(packed, message.TYPE) == message


def test_unknown_header_keys_are_ignored_for_newer_peers() -> None:
    packed = msgpack.packb({"task_id": "t", "from_the_future": [1, 2]})
    assert messages.parse_header(packed, MessageType.ACK) == Ack("t")


def test_an_ack_of_one_task_has_the_header_of_the_first_protocol() -> None:
    # a peer that did not say "ack-many" gets ACKs it has always read
    assert Ack("t").to_header() == {"task_id": "t"}
    assert Ack("t", ("u",)).to_header() == {"task_id": "t", "more": ["u"]}


def test_a_cancel_without_tasks_has_the_header_of_the_first_protocol() -> None:
    assert Cancel("t").to_header() == {"task_id": "t"}
    assert Cancel("t", (4,)).to_header() == {"task_id": "t", "tasks": [4]}


def test_a_greeting_without_capabilities_has_none() -> None:
    old = {"peer_id": "p", "group": "g", "user": "u", "host": "h", "keyed": True, "nonce": b"n" * 32}
    assert messages.parse_header(msgpack.packb(old, use_bin_type=True), MessageType.HELLO).caps == ()


@pytest.mark.parametrize(
    ("mtype", "header"),
    [
        (MessageType.ASK, {"task_id": "t", "mem_bytes": -1}),
        (MessageType.ASK, {"task_id": "t", "time_s": float("nan")}),
        (MessageType.ASK, {"task_id": "t", "cores": 0}),
        (MessageType.ASK, {"task_id": 5}),
        (MessageType.ASK, {}),
        (MessageType.REFUSE, {"task_id": "t", "reason": 99}),
        (MessageType.REFUSE, {"task_id": "t", "reason": "busy"}),
        (MessageType.TASK, {"task_id": "t", "info": [1]}),
        (
            MessageType.HELLO,
            {
                "peer_id": "p",
                "group": "g",
                "user": "",
                "host": "",
                "keyed": True,
                "nonce": b"short",
            },
        ),
        (MessageType.PING, {"token": True}),
        (MessageType.BYE, {"reason": "x" * 5000}),
        (MessageType.ACK, {"task_id": "t", "more": "uv"}),
        (MessageType.ACK, {"task_id": "t", "more": [""]}),
        (MessageType.ACK, {"task_id": "t", "more": [7]}),
        (MessageType.ACK, {"task_id": "t", "more": ["u"] * messages.MAX_ACKS}),
        (MessageType.CANCEL, {"task_id": "t", "tasks": [-1]}),
        (MessageType.CANCEL, {"task_id": "t", "tasks": ["3"]}),
        (MessageType.CANCEL, {"task_id": "t", "tasks": 3}),
        (MessageType.CANCEL, {"task_id": "t", "tasks": [True]}),
        (MessageType.CHALLENGE, {"peer_id": "p", "group": "g", "user": "", "host": "", "keyed": True,
                                 "nonce": b"n" * 32, "caps": ["x" * 65]}),
        (MessageType.CHALLENGE, {"peer_id": "p", "group": "g", "user": "", "host": "", "keyed": True,
                                 "nonce": b"n" * 32, "caps": "ack-many"}),
    ],
)
def test_invalid_message_fields_raise_protocol_error(mtype: MessageType, header: dict) -> None:
    with pytest.raises(ProtocolError, match=mtype.name):
        messages.parse_header(msgpack.packb(header, use_bin_type=True), mtype)


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\x92\x01\x02", b"\x81\x01\x02", b"\xd4\x05\x00", b"\x91" * 5000 + b"\xc0"],
    ids=["empty", "never-used-byte", "array", "int-key", "ext-type", "deep-nesting"],
)
def test_malformed_msgpack_raises_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        messages.parse_header(data, MessageType.PING)


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_buffers"):
        Limits(max_buffers=70000)
    with pytest.raises(ValueError, match="max_body_bytes"):
        Limits(max_body_bytes=0)


# ------------------------------------------------------------ handshake


@KEY_MODES
def test_handshake_completes_and_names_the_peer(keyed: bool, key: GroupKey) -> None:
    k = _key(keyed, key)
    a = Connection(Role.INITIATOR, k, Identity("ctrl", "alice", "hosta"))
    b = Connection(Role.RESPONDER, k, Identity("work", "bob", "hostb"))
    assert a.state is b.state is ConnectionState.HANDSHAKE
    got_a, got_b = pump(a, b)
    assert a.state is b.state is ConnectionState.READY
    assert got_a == [HandshakeComplete(a.peer)] and isinstance(a.peer, Challenge)
    assert got_b == [HandshakeComplete(b.peer)] and isinstance(b.peer, Hello)
    assert (a.peer.peer_id, a.peer.user, a.peer.host) == ("work", "bob", "hostb")
    assert (b.peer.peer_id, b.peer.user, b.peer.host) == ("ctrl", "alice", "hosta")
    assert a.keyed is b.keyed is keyed
    assert a.peer.caps == b.peer.caps == wire.CAPABILITIES  # each end learns what the other reads


def test_handshake_frames_carry_tags_only_with_a_key(key: GroupKey) -> None:
    for k, tag in ((key, TAG_SIZE), (None, 0)):
        a = Connection(Role.INITIATOR, k, Identity("a"))
        b = Connection(Role.RESPONDER, k, Identity("b"))
        hello = a.data_to_send()[0].tobytes()
        b.feed(hello)
        challenge = b.data_to_send()[0].tobytes()
        hlen = struct.unpack_from(">I", challenge, 16)[0]
        assert len(challenge) == FIXED_SIZE + hlen + tag
        assert len(hello) == FIXED_SIZE + struct.unpack_from(">I", hello, 16)[0]


def _hello_claiming(conn: Connection, fingerprint: str) -> bytes:
    """``conn``'s HELLO, made to name the key ``fingerprint`` (a fingerprint is no secret), and
    kept as the one it sent."""
    hello = conn.data_to_send()[0].tobytes()
    header = msgpack.packb({**msgpack.unpackb(hello[FIXED_SIZE:]), "keys": [fingerprint]})
    forged = hello[:16] + struct.pack(">I", len(header)) + hello[20:FIXED_SIZE] + header
    conn._transcript = [forged]  # type: ignore[attr-defined]
    return forged


def test_wrong_key_never_authenticates(key: GroupKey, other_key: GroupKey) -> None:
    a = Connection(Role.INITIATOR, other_key, Identity("intruder"))
    b = Connection(Role.RESPONDER, key, Identity("work"))
    with pytest.raises(HandshakeRefused, match="no key of group 'test' in common"):
        b.feed(a.data_to_send()[0].tobytes())
    # one that names the worker's key without holding it fails on the worker's proof
    a = Connection(Role.INITIATOR, other_key, Identity("intruder"))
    b = Connection(Role.RESPONDER, key, Identity("work"))
    b.feed(_hello_claiming(a, key.fingerprint))
    challenge = b.data_to_send()[0].tobytes()
    with pytest.raises(ProtocolError, match="failed authentication"):
        a.feed(challenge)
    assert a.state is ConnectionState.CLOSED


def test_intruder_that_skips_the_challenge_check_is_refused(
    key: GroupKey, other_key: GroupKey
) -> None:
    """An outsider who ignores the responder's proof still cannot forge AUTH."""
    a = Connection(Role.INITIATOR, other_key, Identity("intruder"))
    b = Connection(Role.RESPONDER, key, Identity("work"))
    b.feed(_hello_claiming(a, key.fingerprint))
    challenge = b.data_to_send()[0].tobytes()
    real = a._handshake_tag_ok
    a._handshake_tag_ok = (
        lambda label, head, tag: (  # type: ignore[method-assign]
            label == b"CHALLENGE" or real(label, head, tag)
        )
    )
    a.feed(challenge)
    assert a.state is ConnectionState.READY  # it fooled itself...
    auth = a.data_to_send()[0].tobytes()
    with pytest.raises(ProtocolError, match="AUTH frame failed authentication"):
        b.feed(auth)  # ...but not the responder
    assert b.state is ConnectionState.CLOSED


@pytest.mark.parametrize(("a_keyed", "b_keyed"), [(True, False), (False, True)])
def test_key_mode_mismatch_is_refused_with_an_error_frame(
    key: GroupKey, a_keyed: bool, b_keyed: bool
) -> None:
    a = Connection(Role.INITIATOR, key if a_keyed else None, Identity("a"))
    b = Connection(Role.RESPONDER, key if b_keyed else None, Identity("b"))
    with pytest.raises(ProtocolError, match="group key"):
        b.feed(a.data_to_send()[0].tobytes())
    error = b.data_to_send()
    assert [f.msg_type for f in error] == [MessageType.ERROR]
    with pytest.raises(ProtocolError, match="refused the handshake: key"):
        a.feed(error[0].tobytes())


def test_group_mismatch_is_refused(key: GroupKey) -> None:
    other = GroupKey("elsewhere", key.secret)
    a = Connection(Role.INITIATOR, other, Identity("a"))
    b = Connection(Role.RESPONDER, key, Identity("b"))
    with pytest.raises(ProtocolError, match="group 'elsewhere'"):
        b.feed(a.data_to_send()[0].tobytes())


def test_a_responder_of_several_groups_serves_each_and_no_other(key: GroupKey) -> None:
    import os

    lab, dept, other = GroupKey("lab", os.urandom(32)), GroupKey("dept", os.urandom(32)), key
    for group_key in (lab, dept):  # a member of either group completes the handshake
        a = Connection(Role.INITIATOR, group_key, Identity("a"))
        b = Connection(Role.RESPONDER, lab, Identity("b"), more_keys=[dept])
        got_a, got_b = pump(a, b)
        assert any(isinstance(e, HandshakeComplete) for e in got_a)
        assert any(isinstance(e, HandshakeComplete) for e in got_b)
        assert b.group == a.group == group_key.group
        _admit(a, b)
        a.send(Ping(7))
        assert [getattr(e, "message", e) for e in pump(a, b)[1]][-1] == Ping(7)
    # a group it does not serve: refused by name
    a = Connection(Role.INITIATOR, other, Identity("a"))
    b = Connection(Role.RESPONDER, lab, Identity("b"), more_keys=[dept])
    with pytest.raises(ProtocolError, match="serves 'dept', 'lab'"):
        b.feed(a.data_to_send()[0].tobytes())
    # the right group name with the wrong secret: no key in common (or, claiming dept's key,
    # the handshake fails authentication)
    a = Connection(Role.INITIATOR, GroupKey("dept", os.urandom(32)), Identity("a"))
    b = Connection(Role.RESPONDER, lab, Identity("b"), more_keys=[dept])
    with pytest.raises(ProtocolError, match="no key of group 'dept' in common"):
        b.feed(a.data_to_send()[0].tobytes())
    a = Connection(Role.INITIATOR, GroupKey("dept", os.urandom(32)), Identity("a"))
    b = Connection(Role.RESPONDER, lab, Identity("b"), more_keys=[dept])
    b.feed(_hello_claiming(a, dept.fingerprint))
    with pytest.raises(ProtocolError, match="failed authentication"):
        a.feed(b.data_to_send()[0].tobytes())
    with pytest.raises(ValueError, match="keyed responder"):
        Connection(Role.INITIATOR, lab, Identity("a"), more_keys=[dept])


def test_sending_before_the_handshake_is_an_error(key: GroupKey) -> None:
    a = Connection(Role.INITIATOR, key, Identity("a"))
    with pytest.raises(PeerError, match="handshake"):
        a.send(Ping(1))


def test_handshake_messages_cannot_be_sent_by_hand(key: GroupKey) -> None:
    a, _ = make_pair(key)
    with pytest.raises(PeerError, match="sent by the connection itself"):
        a.send(Auth())


def test_frames_before_the_handshake_are_refused(key: GroupKey) -> None:
    a, _ = make_pair(key)
    a.send(Ping(1))
    raw = a.data_to_send()[0].tobytes()
    raw = raw[:8] + struct.pack(">Q", 0) + raw[16:]  # with the right sequence number
    b = Connection(Role.RESPONDER, key, Identity("b"))
    with pytest.raises(ProtocolError, match="unexpected PING"):
        b.feed(raw)


def test_handshake_frames_after_the_handshake_are_refused(key: GroupKey) -> None:
    _, b = make_pair(key)
    stale = Connection(Role.INITIATOR, key, Identity("x")).data_to_send()[0].tobytes()
    stale = stale[:8] + struct.pack(">Q", 2) + stale[16:]  # with the right sequence number
    with pytest.raises(ProtocolError, match="unexpected HELLO"):
        b.feed(stale)


# ------------------------------------------------------------ frames after the handshake


def _array_payload() -> tuple[np.ndarray, list[object]]:
    arr = np.arange(300_000, dtype=np.float64).reshape(600, 500)
    bufs: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(arr, protocol=5, buffer_callback=bufs.append)
    return arr, [stream, *bufs]


@pytest.mark.parametrize("mode", ["encrypted", "clear", "keyless"])
def test_task_round_trip_with_out_of_band_buffers(mode: str, key: GroupKey) -> None:
    a, b = make_pair(None if mode == "keyless" else key, encrypt=mode == "encrypted")
    _admit(a, b)
    arr, payload = _array_payload()
    a.send(Task("t1", {"job": "j"}), payload, Flags.COMPRESSED)
    (frame,) = a.data_to_send()
    if mode != "encrypted":  # (an encrypted body goes as slices of its ciphertext, then the tag)
        assert len(frame.parts()) == 1 + len(payload) + (mode == "clear")
    events = b.feed(frame.tobytes())
    assert len(events) == 1 and isinstance(events[0], Received)
    got = events[0]
    assert got.message == Task("t1", {"job": "j"}) and got.flags is Flags.COMPRESSED
    assert [bytes(x) for x in got.buffers] == [bytes(memoryview(p)) for p in payload]
    result = pickle.loads(got.buffers[0], buffers=got.buffers[1:])
    np.testing.assert_array_equal(result, arr)


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "clear"])
def test_streamed_parts_equal_whole_parts(key: GroupKey, encrypt: bool) -> None:
    a, b = make_pair(key, encrypt=encrypt)
    _admit(a, b)
    _admit(a, b, "t2")
    payload = [b"x" * 3_000_001, b"", b"y" * 17]
    a.send(Task("t1"), payload)
    a.send(Task("t2"), payload)
    frame, other = a.data_to_send()
    streamed = [bytes(p) for p in frame.iter_parts(slice_bytes=1 << 20)]
    assert max(len(p) for p in streamed[1:]) == 1 << 20
    whole = other.tobytes()
    assert frame.nbytes == len(b"".join(streamed)) == len(whole) == other.nbytes
    events = b.feed(b"".join(streamed)) + b.feed(whole)  # the same frames, read either way
    assert [[bytes(x) for x in e.buffers] for e in events] == [payload, payload]  # type: ignore[union-attr]
    if encrypt:  # sealing again would use the frame's nonce again
        with pytest.raises(PeerError, match="streamed once"):
            list(frame.iter_parts())
    else:
        assert b"".join(bytes(p) for p in frame.iter_parts()) == b"".join(streamed)  # tag cached
    assert b"".join(bytes(p) for p in other.iter_parts()) == whole  # sealed once, kept


@pytest.mark.parametrize("read", [65536, (1 << 20) + 7])  # (as much as a read gives, at most)
def test_zero_copy_receive_into_allocated_buffers(key: GroupKey, read: int) -> None:
    # an encrypted buffer lands in a small buffer and is decrypted from there into the one
    # allocated for it: the buffers handed on are those allocated, holding the plaintext
    made: list[bytearray] = []

    def allocate(n: int) -> bytearray:
        made.append(bytearray(n))
        return made[-1]

    a, b = make_pair(key, allocate=allocate)
    _admit(a, b)
    arr, payload = _array_payload()
    a.send(Task("t1"), payload)
    (frame,) = a.data_to_send()
    data = memoryview(frame.tobytes())
    events: list[wire.Event] = []
    reads, size = 0, len(data)
    while data:
        target = b.receive_buffer()
        assert 0 < len(target) <= b.next_size()
        n = min(len(target), len(data), read)
        target[:n] = data[:n]  # what sock.recv_into(target) does
        reads += 1
        events += b.received(n)
        data = data[n:]
    assert reads <= size // 65536 + 8  # (reads of 64 KiB and more but the frame's small parts)
    (got,) = events
    assert isinstance(got, Received)
    assert all(
        x is y for x, y in zip(got.buffers, made, strict=True)
    )  # received in place, not copied
    np.testing.assert_array_equal(pickle.loads(got.buffers[0], buffers=got.buffers[1:]), arr)


@KEY_MODES
def test_byte_by_byte_feeding_gives_the_same_events(keyed: bool, key: GroupKey) -> None:
    a, b = make_pair(_key(keyed, key))
    _admit(a, b)
    a.send(Task("t1", {"n": 1}), [b"abc", b"", b"defg"])
    a.send(Ping(5))
    events: list[wire.Event] = []
    for frame in a.data_to_send():
        for i, byte in enumerate(frame.tobytes()):
            events += b.feed(bytes([byte]))
            if i == 0:
                assert b.next_size() == FIXED_SIZE - 1
    assert [type(e.message) for e in events if isinstance(e, Received)] == [Task, Ping]
    assert [bytes(x) for x in events[0].buffers] == [b"abc", b"", b"defg"]  # type: ignore[union-attr]


@pytest.mark.parametrize("keyed", [True, False])
def test_a_whole_frame_is_refused_for_what_byte_by_byte_reading_refuses_it(keyed: bool, key: GroupKey) -> None:
    # A frame that arrives whole is checked in one quick step (the full check runs only to
    # say why it refuses): every change to the fixed header must be refused as the byte by
    # byte reading refuses it, with the same words, and a good frame pass both ways.
    for offset in range(FIXED_SIZE):
        for value in (0x00, 0x01, 0x02, 0x80, 0xFF):
            errors: list[tuple[str, object]] = []
            for whole in (True, False):
                a, b = make_pair(_key(keyed, key))
                _admit(a, b)
                a.send(Task("t1", {"n": 1}), [b"abc"])
                (raw,) = _frame_bytes(a)
                frame = bytearray(raw)
                frame[offset] = value
                try:
                    if whole:
                        events = b.feed(bytes(frame))
                    else:
                        events = [e for x in frame for e in b.feed(bytes([x]))]
                    errors.append(("ok" if events else "waiting", len(events)))
                except ProtocolError as exc:
                    errors.append(("refused", str(exc)))
            assert errors[0] == errors[1], (offset, value, errors)


def test_sequence_numbers_count_up_per_direction(key: GroupKey) -> None:
    a, b = make_pair(key)
    frames = [a.send(Ping(i)) for i in range(3)]
    assert [f.seq for f in frames] == [2, 3, 4]  # HELLO and AUTH were 0 and 1
    assert b.send(Pong(0)).seq == 1  # CHALLENGE was 0


# ------------------------------------------------------------ attacks and damage


def test_replayed_frame_is_refused(key: GroupKey) -> None:
    a, b = make_pair(key)
    a.send(Ping(1))
    (raw,) = _frame_bytes(a)
    assert len(b.feed(raw)) == 1
    with pytest.raises(ProtocolError, match="replayed"):
        b.feed(raw)


def test_reordered_frames_are_refused(key: GroupKey) -> None:
    a, b = make_pair(key)
    a.send(Ping(1))
    a.send(Ping(2))
    _, second = _frame_bytes(a)
    with pytest.raises(ProtocolError, match="out of order"):
        b.feed(second)


def test_frame_from_another_connection_does_not_authenticate(key: GroupKey) -> None:
    a1, _ = make_pair(key)
    _, b2 = make_pair(key)
    a1.send(Ping(1))  # same key, same sequence number, other session keys
    with pytest.raises(ProtocolError, match="failed authentication"):
        b2.feed(_frame_bytes(a1)[0])


def test_unauthenticated_frames_never_pass_on_a_keyed_connection(key: GroupKey) -> None:
    plain_a, _ = make_pair(None)
    _, keyed_b = make_pair(key)
    plain_a.send(Ping(1))
    (raw,) = _frame_bytes(plain_a)
    assert keyed_b.feed(raw) == []  # still waiting for the tag that a keyed frame has
    with pytest.raises(ProtocolError, match="failed authentication"):
        keyed_b.feed(bytes(TAG_SIZE))


def _regions(raw: bytes, nbuf: int) -> dict[str, int]:
    hlen = struct.unpack_from(">I", raw, 16)[0]
    table = FIXED_SIZE
    header = table + 8 * nbuf
    head_tag = header + hlen
    return {
        "type": 5,
        "flags": 7,
        "seq": 15,
        "header_len": 19,
        "body_len": 27,
        "nbuf": 29,
        "table": table + 3,
        "header": header + 1,
        "head_tag": head_tag + 2,
        "buffer": head_tag + TAG_SIZE + 1,
        "body_tag": len(raw) - 1,
    }


@pytest.mark.parametrize(
    "region",
    ["type", "flags", "seq", "header_len", "body_len", "nbuf", "table", "header", "head_tag",
     "buffer", "body_tag"],
)  # fmt: skip
def test_one_flipped_bit_anywhere_is_refused_and_nothing_is_parsed(
    key: GroupKey, region: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = make_pair(key)
    _admit(a, b)
    a.send(Task("t1"), [b"payload-one", b"payload-two"])
    (raw,) = _frame_bytes(a)
    damaged = bytearray(raw)
    damaged[_regions(raw, 2)[region]] ^= 0x01
    parsed: list[object] = []
    real_parse = messages.parse_header
    # patched where the Connection looks it up (its reading half)
    monkeypatch.setattr(reader, "parse_header", lambda *a: parsed.append(a) or real_parse(*a))
    with pytest.raises(ProtocolError):
        b.feed(bytes(damaged) + bytes(64))  # extra bytes: a grown length must not hang
    if region not in ("buffer", "body_tag"):
        assert parsed == []  # refused before the msgpack header was parsed
    assert b.state is ConnectionState.CLOSED


@pytest.mark.parametrize("cut", [5, FIXED_SIZE, FIXED_SIZE + 20, -500, -1])
def test_truncated_frame_waits_then_fails_at_eof(key: GroupKey, cut: int) -> None:
    a, b = make_pair(key)
    _admit(a, b)
    a.send(Task("t1"), [b"z" * 1000])
    (raw,) = _frame_bytes(a)
    assert b.feed(raw[:cut]) == []
    assert b.next_size() > 0
    with pytest.raises(ProtocolError, match="middle of a frame"):
        b.receive_eof()
    assert b.state is ConnectionState.CLOSED


def test_clean_eof_between_frames(key: GroupKey) -> None:
    _, b = make_pair(key)
    assert b.receive_eof() == []
    assert b.state is ConnectionState.CLOSED
    with pytest.raises(ProtocolError, match="closed"):
        b.feed(b"x")


def test_eof_during_handshake_is_an_error(key: GroupKey) -> None:
    b = Connection(Role.RESPONDER, key, Identity("b"))
    with pytest.raises(ProtocolError, match="handshake"):
        b.receive_eof()


def _forge_fixed(mtype: MessageType, seq: int, hlen: int, blen: int, nbuf: int) -> bytes:
    return struct.pack(">4sBBHQIQHH", b"ELSW", 1, mtype, 0, seq, hlen, blen, nbuf, 0)


@pytest.mark.parametrize(
    ("mtype", "hlen", "blen", "nbuf", "match"),
    [
        (MessageType.PING, 2**32 - 1, 0, 0, "header length"),
        (MessageType.PING, 0, 0, 0, "header length"),
        (MessageType.TASK, 5, 2**64 - 1, 1, "over the cap"),
        (MessageType.TASK, 5, 10, 2**16 - 1, "buffers"),
        (MessageType.PING, 5, 10, 1, "buffers"),
        (MessageType.PING, 5, 10, 0, "over the cap"),
        (MessageType.TASK, 5, 10, 0, "without buffers"),
    ],
)
def test_oversize_lengths_refused_from_the_fixed_header_alone(
    key: GroupKey, mtype: MessageType, hlen: int, blen: int, nbuf: int, match: str
) -> None:
    calls: list[int] = []
    _, b = make_pair(key, allocate=lambda n: calls.append(n) or bytearray(n))
    with pytest.raises(ProtocolError, match=match):
        b.feed(_forge_fixed(mtype, 2, hlen, blen, nbuf))  # only the 32 fixed bytes
    assert calls == []


def test_handshake_header_cap_is_small(key: GroupKey) -> None:
    b = Connection(Role.RESPONDER, key, Identity("b"))
    with pytest.raises(ProtocolError, match="header length"):
        b.feed(_forge_fixed(MessageType.HELLO, 0, 4096, 0, 0))


def test_buffer_lengths_must_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = make_pair(None)
    _admit(a, b)
    header = msgpack.packb(Task("t1").to_header())
    table = struct.pack(">2Q", 3, 4)
    raw = _forge_fixed(MessageType.TASK, a._send_seq, len(header), 8, 2) + table + header
    with pytest.raises(ProtocolError, match="add up"):
        b.feed(raw)


def test_garbage_header_from_a_key_holder_is_a_protocol_error(key: GroupKey) -> None:
    a, b = make_pair(key)
    a._queue(MessageType.PING, b"\xc1\xc1", [], 0)  # correctly tagged, not msgpack
    with pytest.raises(ProtocolError, match="bad msgpack"):
        b.feed(_frame_bytes(a)[0])


def test_nothing_is_ever_unpickled(key: GroupKey, monkeypatch: pytest.MonkeyPatch) -> None:
    class Trap:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("UNPICKLED",))

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail("the wire module unpickled something")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    a, b = make_pair(key)
    _admit(a, b)
    a.send(Task("t1"), [pickle.dumps(Trap())])
    (got,) = b.feed(_frame_bytes(a)[0])
    assert isinstance(got, Received) and bytes(got.buffers[0]).startswith(b"\x80")


# ------------------------------------------------------------ admission rules


@KEY_MODES
def test_ask_accept_task_result_ack(keyed: bool, key: GroupKey) -> None:
    ctrl, work = make_pair(_key(keyed, key))
    ctrl.send(Ask("t1", 100, 5.0, 1))
    ctrl.send(Ask("t2", 100, 5.0, 1))
    _, got = pump(ctrl, work)
    assert [e.message for e in got] == [Ask("t1", 100, 5.0, 1), Ask("t2", 100, 5.0, 1)]  # type: ignore[union-attr]
    work.send(Accept("t1"))
    work.send(Refuse("t2", RefuseReason.MEMORY, "only 1 GB free"))
    got, _ = pump(ctrl, work)
    assert got[1].message == Refuse("t2", RefuseReason.MEMORY, "only 1 GB free")  # type: ignore[union-attr]
    with pytest.raises(PeerError, match="not accepted"):
        ctrl.send(Task("t2"), [b"x"])
    ctrl.send(Task("t1"), [b"payload"])
    work.send(Result("t1", {"ok": True}), [b"result"])
    got_c, got_w = pump(ctrl, work)
    assert got_w[0].message == Task("t1")  # type: ignore[union-attr]
    assert got_c[0].message == Result("t1", {"ok": True})  # type: ignore[union-attr]
    ctrl.send(Ack("t1"))
    with pytest.raises(PeerError, match="not accepted"):
        ctrl.send(Task("t1"), [b"again"])  # one TASK per ACCEPT


@KEY_MODES
def test_a_task_carries_the_next_ask_and_a_result_its_accept(keyed: bool, key: GroupKey) -> None:
    ctrl, work = make_pair(_key(keyed, key))
    assert "fold" in ctrl.peer.caps and "fold" in work.peer.caps  # type: ignore[union-attr]
    _admit(ctrl, work, "t1")
    ctrl.send(Task("t1", {"n": 1}, Task.folding(Ask("t2", 100, 5.0, 1))), [b"payload"])
    _, got = pump(ctrl, work)
    assert got[0].message.next_ask() == Ask("t2", 100, 5.0, 1)  # type: ignore[union-attr]
    with pytest.raises(PeerError, match="not accepted"):
        ctrl.send(Task("t2"), [b"x"])  # asked, not yet admitted
    with pytest.raises(PeerError, match="did not ask"):
        work.send(Result("t1", {}, ("t9",)), [b"r"])
    work.send(Result("t1", {"ok": True}, ("t2",)), [b"result"])
    got, _ = pump(ctrl, work)
    assert got[0].message == Result("t1", {"ok": True}, ("t2",))  # type: ignore[union-attr]
    ctrl.send(Task("t2"), [b"next"])  # the folded ACCEPT admits it
    _, got = pump(ctrl, work)
    assert got[0].message == Task("t2")  # type: ignore[union-attr]
    with pytest.raises(PeerError, match="not accepted"):
        ctrl.send(Task("t2"), [b"again"])  # one TASK per ACCEPT, folded or not


def test_folded_asks_and_accepts_keep_the_admission_rules(key: GroupKey) -> None:
    ctrl, work = make_pair(key)
    _admit(ctrl, work, "t1")
    ctrl.send(Ask("t3"))
    with pytest.raises(PeerError, match="already asked"):
        ctrl.send(Task("t1", {}, Task.folding(Ask("t3"))), [b"p"])
    ctrl.send(Task("t1", {}, Task.folding(Ask("t2"))), [b"p"])  # the failed send changed nothing
    pump(ctrl, work)
    # a forged RESULT accepting what was never asked for, and a folded ASK repeated
    work._queue(MessageType.RESULT, msgpack.packb(Result("t1", {}, ("t9",)).to_header()), [memoryview(b"r")], 0)
    with pytest.raises(ProtocolError, match="not asked for"):
        ctrl.feed(_frame_bytes(work)[0])
    a, b = make_pair(key)
    _admit(a, b, "t1")
    a.send(Ask("t2"))
    header = msgpack.packb(Task("t1", {}, Task.folding(Ask("t2"))).to_header())
    a._queue(MessageType.TASK, header, [memoryview(b"p")], 0)
    frames = _frame_bytes(a)
    b.feed(frames[0])
    with pytest.raises(ProtocolError, match="repeated"):
        b.feed(frames[1])
    with pytest.raises(ValueError, match="ask must be"):
        Task("t1", {}, ("t2", 0, 0.0))
    with pytest.raises(ValueError, match="itself"):
        Task("t1", {}, Task.folding(Ask("t1")))


def test_task_without_accept_is_refused_before_its_body(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    a, b = make_pair(None, allocate=lambda n: calls.append(n) or bytearray(n))
    header = msgpack.packb(Task("sneaky").to_header())
    a._queue(MessageType.TASK, header, [memoryview(b"x" * 100)], 0)
    raw = _frame_bytes(a)[0]
    head_len = len(raw) - 100
    with pytest.raises(ProtocolError, match="without an accepted ASK"):
        b.feed(raw[:head_len])  # the body is not even needed to refuse it
    assert calls == []


def test_accept_without_ask_is_refused(key: GroupKey) -> None:
    a, b = make_pair(key)
    with pytest.raises(PeerError, match="did not ask"):
        b.send(Accept("t9"))
    b._queue(MessageType.ACCEPT, msgpack.packb(Accept("t9").to_header()), [], 0)
    with pytest.raises(ProtocolError, match="not asked for"):
        a.feed(_frame_bytes(b)[0])


def test_repeated_ask_is_refused(key: GroupKey) -> None:
    a, b = make_pair(key)
    a.send(Ask("t1"))
    with pytest.raises(PeerError, match="already asked"):
        a.send(Ask("t1"))
    header = msgpack.packb(Ask("t1").to_header())
    a._queue(MessageType.ASK, header, [], 0)
    frames = _frame_bytes(a)
    b.feed(frames[0])
    with pytest.raises(ProtocolError, match="repeated"):
        b.feed(frames[1])


def test_open_asks_are_capped(key: GroupKey) -> None:
    a, b = make_pair(key, limits=Limits(max_pending_asks=3))
    for i in range(4):
        a.send(Ask(f"t{i}"))
    frames = _frame_bytes(a)
    for raw in frames[:3]:
        b.feed(raw)
    with pytest.raises(ProtocolError, match="open ASKs"):
        b.feed(frames[3])


def test_buffers_only_on_task_and_result(key: GroupKey) -> None:
    a, _ = make_pair(key)
    with pytest.raises(PeerError, match="cannot carry buffers"):
        a.send(Ping(1), [b"x"])


def test_send_checks_own_caps(key: GroupKey) -> None:
    a, b = make_pair(key, limits=Limits(max_buffers=1, max_body_bytes=10))
    _admit(a, b)
    with pytest.raises(PeerError, match="over the cap"):
        a.send(Task("t1"), [b"a", b"b"])
    with pytest.raises(PeerError, match="over the cap"):
        a.send(Task("t1"), [b"x" * 11])


def test_non_contiguous_buffer_is_refused(key: GroupKey) -> None:
    a, b = make_pair(key)
    _admit(a, b)
    with pytest.raises(PeerError, match="contiguous"):
        a.send(Task("t1"), [np.arange(10)[::2]])


def test_allocator_of_the_wrong_size_is_caught(key: GroupKey) -> None:
    a, b = make_pair(key, allocate=lambda n: bytearray(n + 1))
    _admit(a, b)
    a.send(Task("t1"), [b"abc"])
    with pytest.raises(PeerError, match="allocator"):
        b.feed(_frame_bytes(a)[0])


# ------------------------------------------------------------ closing


def test_bye_closes_both_ways(key: GroupKey) -> None:
    a, b = make_pair(key)
    a.send(Bye("done"))
    with pytest.raises(PeerError, match="closing"):
        a.send(Ping(1))
    (got,) = b.feed(_frame_bytes(a)[0])
    assert got == Received(Bye("done"))
    assert b.state is ConnectionState.CLOSED
    with pytest.raises(ProtocolError, match="closed"):
        b.feed(b"more")


def test_error_after_handshake_is_an_event(key: GroupKey) -> None:
    a, b = make_pair(key)
    b.send(Error("draining", "shutting down"))
    (got,) = a.feed(_frame_bytes(b)[0])
    assert got == Received(Error("draining", "shutting down"))
    assert a.state is ConnectionState.CLOSED


def test_received_checks_its_argument(key: GroupKey) -> None:
    _, b = make_pair(key)
    with pytest.raises(ValueError, match="asked for"):
        b.received(FIXED_SIZE + 1)


def test_cancel_withdraws_an_ask_on_both_ends(key: GroupKey) -> None:
    ctrl, work = make_pair(key, limits=Limits(max_pending_asks=2))
    for i in range(5):  # a long-lived connection never runs out of open ASKs
        ctrl.send(Ask(f"t{i}"))
        pump(ctrl, work)
        work.send(Accept(f"t{i}"))
        pump(ctrl, work)
        ctrl.send(Cancel(f"t{i}"))
        pump(ctrl, work)
        with pytest.raises(PeerError, match="not accepted"):
            ctrl.send(Task(f"t{i}"), [b"x"])
    assert work._accepted_for_peer == set() and work._asks_from_peer == set()


def test_cancel_from_the_worker_does_not_break_a_task_in_flight(key: GroupKey) -> None:
    ctrl, work = make_pair(key)
    _admit(ctrl, work)
    ctrl.send(Task("t1"), [b"x"])  # crosses the worker's CANCEL on the wire
    work.send(Cancel("t1"))
    got_c, got_w = pump(ctrl, work)
    assert [type(e.message) for e in got_w] == [Task]  # type: ignore[union-attr]
    assert [type(e.message) for e in got_c] == [Cancel]  # type: ignore[union-attr]


def test_info_must_be_a_map_with_text_keys(key: GroupKey) -> None:
    with pytest.raises(ValueError, match="str keys"):
        Task("t1", {1: "x"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="str keys"):
        Result("t1", {"a": 1, b"b": 2})  # type: ignore[dict-item]
    assert Task("t1", {}).info == {} and Result("t1", {"a": 1}).info == {"a": 1}
    a, b = make_pair(key)
    _admit(a, b, "t1")
    # bytes keys pass msgpack's strict_map_key; the message check refuses them
    a._queue(MessageType.TASK, msgpack.packb({"task_id": "t1", "info": {b"k": 1}}), [memoryview(b"x")], 0)
    with pytest.raises(ProtocolError, match="str keys"):
        b.feed(_frame_bytes(a)[0])
