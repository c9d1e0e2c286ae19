"""Frames encrypted on the wire (a keyed group's default), without sockets: what an observer
of the bytes sees, what a flipped byte does, and ends that disagree about encryption."""

from __future__ import annotations

import gc

import msgpack
import pytest
from peer_testing import make_pair, pump

from elsewhere.peer import reader
from elsewhere.peer.announce import (
    Announcement,
    AnnouncementDecoder,
    encode_announcement,
    new_peer_id,
)
from elsewhere.peer.frames import SMALL_BODY, SliceRing
from elsewhere.peer.handshake import HandshakeRefused
from elsewhere.peer.keys import GroupKey
from elsewhere.peer.messages import (
    FIXED_SIZE,
    TAG_SIZE,
    Accept,
    Ask,
    Bye,
    Error,
    Hello,
    Identity,
    MessageType,
    Result,
    Task,
)
from elsewhere.peer.wire import Connection, ConnectionState, HandshakeComplete, Received, Role
from elsewhere.util.errors import PeerError, ProtocolError

ARG = b"ARGUMENT-MARKER-7c1f"
RES = b"RESULT-MARKER-e93a"
INFO = "INFO-MARKER-51d2"  # in the msgpack header (job name, cwd, env ...)


def _admit(a: Connection, b: Connection, task_id: str) -> None:
    a.send(Ask(task_id))
    pump(a, b)
    b.send(Accept(task_id))
    pump(a, b)


def _exchange(key: GroupKey, encrypt: bool, size: int) -> tuple[bytes, list[Received]]:
    """A TASK and a RESULT with markers in their headers and buffers (``size`` bytes of
    buffer each): every byte that crossed, and the events the two ends got."""
    a, b = make_pair(key, encrypt=encrypt)
    _admit(a, b, "t1")
    filler = bytes(size)
    a.send(Task("t1", {"job": {"name": INFO}}), [ARG, filler, ARG])
    wire = b""
    got: list[Received] = []
    for frame in a.data_to_send():
        raw = b"".join(bytes(p) for p in frame.iter_parts())  # streamed, as the pump sends
        wire += raw
        got += [e for e in b.feed(raw) if isinstance(e, Received)]
    b.send(Result("t1", {"host": INFO}), [RES, filler, RES])
    b.send(Error("oops", f"{INFO} went wrong"))
    for frame in b.data_to_send():
        raw = frame.tobytes()
        wire += raw
        got += [e for e in a.feed(raw) if isinstance(e, Received)]
    return wire, got


@pytest.mark.parametrize("size", [10, SMALL_BODY + 1, 3 << 20], ids=["small", "streamed", "large"])
def test_an_observer_of_an_encrypted_connection_reads_nothing_of_a_task(key: GroupKey, size: int) -> None:
    wire, got = _exchange(key, True, size)
    assert ARG not in wire and RES not in wire and INFO.encode() not in wire
    assert [bytes(got[0].buffers[0]), bytes(got[1].buffers[2])] == [ARG, RES]  # the ends read them
    assert got[0].message.info == {"job": {"name": INFO}} and got[2].message.message.startswith(INFO)  # type: ignore[union-attr]
    clear, _ = _exchange(key, False, size)  # the same exchange, encryption off at both ends:
    assert ARG in clear and RES in clear and INFO.encode() in clear  # all of it readable
    assert len(clear) == len(wire)  # encryption adds no byte: sizes are what an observer learns


def test_every_frame_after_the_handshake_is_encrypted(key: GroupKey) -> None:
    a, b = make_pair(key)
    a.send(Ask("task-id-marker"))
    a.send(Bye("bye-marker"))
    raw = b"".join(f.tobytes() for f in a.data_to_send())
    assert b"task-id-marker" not in raw and b"bye-marker" not in raw
    events = b.feed(raw)
    assert [type(e.message).__name__ for e in events if isinstance(e, Received)] == ["Ask", "Bye"]


@pytest.mark.parametrize("where", ["header", "small body", "body tag", "large body start", "large body middle",
                                   "large body end"])  # fmt: skip
def test_a_flipped_byte_of_ciphertext_is_refused_and_nothing_is_handed_on(
    key: GroupKey, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = make_pair(key)
    _admit(a, b, "t1")
    size = 3 << 20 if where.startswith("large") else 100
    a.send(Task("t1", {"n": 1}), [ARG, bytes(size)])
    (frame,) = a.data_to_send()
    raw = bytearray(b"".join(bytes(p) for p in frame.iter_parts()))
    hlen = int.from_bytes(raw[16:20], "big")
    header = FIXED_SIZE + 8 * 2
    body = header + hlen + TAG_SIZE
    at = {"header": header + 3, "small body": body + 5, "body tag": len(raw) - 3,
          "large body start": body, "large body middle": body + (size >> 1),
          "large body end": len(raw) - TAG_SIZE - 1}[where]  # fmt: skip
    raw[at] ^= 0x40
    parsed: list[object] = []
    real = reader.parse_header
    monkeypatch.setattr(reader, "parse_header", lambda *args: parsed.append(args) or real(*args))
    got: list[object] = []
    with pytest.raises(ProtocolError, match="failed authentication"):
        view = memoryview(raw)
        while view:  # as the pump reads: large parts straight into their buffers
            n = min(len(b.receive_buffer()), len(view), 1 << 16)
            b.receive_buffer()[:n] = view[:n]
            got += b.received(n)
            view = view[n:]
    assert got == []  # no message, no buffer of it handed on
    assert parsed == [] if where == "header" else len(parsed) == 1  # a damaged header is never parsed
    assert b.state is ConnectionState.CLOSED


@pytest.mark.parametrize("worker_encrypts", [True, False])
def test_ends_that_disagree_about_encryption_are_refused_with_a_clear_message(
    key: GroupKey, worker_encrypts: bool
) -> None:
    controller = Connection(Role.INITIATOR, key, Identity("c"), encrypt=not worker_encrypts)
    worker = Connection(Role.RESPONDER, key, Identity("w"), encrypt=worker_encrypts)
    with pytest.raises(HandshakeRefused) as refused:
        worker.feed(controller.data_to_send()[0].tobytes())
    assert refused.value.code == "encrypt"
    (error,) = worker.data_to_send()
    assert error.msg_type is MessageType.ERROR
    with pytest.raises(HandshakeRefused) as told:
        controller.feed(error.tobytes())
    text = str(told.value)
    assert told.value.code == "encrypt" and "both ends must agree" in text
    if worker_encrypts:
        assert "the controller turned encryption off (encrypt=False)" in text and "--no-encrypt" in text
    else:
        assert "the worker was started with --no-encrypt" in text and "encrypt=False" in text


def test_both_ends_may_turn_encryption_off_together(key: GroupKey) -> None:
    a, b = make_pair(key, encrypt=False)
    assert a.state is b.state is ConnectionState.READY and not a.encrypt and not b.encrypt
    assert b.peer is not None and b.peer.encrypt is False


def test_without_a_key_nothing_is_encrypted_and_the_choice_does_not_matter() -> None:
    a = Connection(Role.INITIATOR, None, Identity("a"), encrypt=True)
    b = Connection(Role.RESPONDER, None, Identity("b"), encrypt=False)
    pump(a, b)
    assert a.state is b.state is ConnectionState.READY and not a.encrypt and not b.encrypt


def test_an_attacker_cannot_turn_encryption_off_in_the_hello(key: GroupKey) -> None:
    controller = Connection(Role.INITIATOR, key, Identity("c"))
    worker = Connection(Role.RESPONDER, key, Identity("w"), encrypt=False)  # would accept it
    hello = controller.data_to_send()[0].tobytes()
    fields = msgpack.unpackb(hello[FIXED_SIZE:])
    assert fields["encrypt"] is True
    forged = msgpack.packb({**fields, "encrypt": False})
    forged_frame = hello[:16] + len(forged).to_bytes(4, "big") + hello[20:FIXED_SIZE] + forged
    assert Hello.from_header(msgpack.unpackb(forged)).encrypt is False
    worker.feed(forged_frame)
    (challenge,) = worker.data_to_send()  # the worker proves the key over the forged HELLO ...
    with pytest.raises(ProtocolError, match="CHALLENGE frame failed authentication"):
        controller.feed(challenge.tobytes())  # ... which the controller never sent
    assert controller.state is ConnectionState.CLOSED


def test_each_direction_and_each_connection_has_its_own_key(key: GroupKey) -> None:
    a, b = make_pair(key)
    c, d = make_pair(key)
    for x, y in ((a, b), (c, d)):
        x.send(Ask("same"))
        y.send(Ask("same"))
    frames = [f.tobytes() for conn in (a, b, c, d) for f in conn.data_to_send()]
    assert len({f[FIXED_SIZE:] for f in frames}) == 4  # same message, same seq: four ciphertexts
    with pytest.raises(ProtocolError, match="failed authentication"):
        d.feed(frames[0])  # a frame of another connection does not authenticate


def test_the_slice_ring_reuses_only_what_nothing_holds() -> None:
    ring = SliceRing(1024)
    first = ring.take(1000)
    first[:3] = b"abc"
    second = ring.take(10)  # the first is held: a new buffer
    assert len(ring) == 2 and first.obj is not second.obj
    piece = first[1:2]  # a slice of a view holds its buffer too
    del first
    gc.collect()
    third = ring.take(5)
    assert third.obj is not piece.obj and len(ring) == 3
    del piece, second, third
    for _ in range(10):  # once released, the same buffers come back
        view = ring.take(1024)
        del view
    assert len(ring) == 3


def test_a_large_encrypted_frame_costs_a_few_slices_of_memory(key: GroupKey) -> None:
    a, b = make_pair(key)
    _admit(a, b, "t1")
    a.send(Task("t1"), [bytes(20 << 20)])
    (frame,) = a.data_to_send()
    sent = 0
    for part in frame.iter_parts():  # sent and dropped one by one, as the pump does
        sent += len(part)
        del part
    assert sent == frame.nbytes
    assert a._ring is not None and len(a._ring) <= 2  # type: ignore[attr-defined]
    with pytest.raises(PeerError, match="streamed once"):
        list(frame.iter_parts())


def test_announcements_say_whether_a_peer_encrypts_and_old_ones_do_not(key: GroupKey) -> None:
    import time

    now = time.time()
    ann = Announcement(new_peer_id(), key.group, "127.0.0.1", 1, timestamp=now, counter=1, encrypt=True)
    assert AnnouncementDecoder(key).decode(encode_announcement(ann, key), now).encrypt is True
    old = encode_announcement(ann, key)
    body = msgpack.unpackb(old[40:-32])[:11]  # a peer from before encryption sends 11 fields
    import hashlib
    import hmac
    import struct

    from elsewhere.peer.announce import announce_key

    packed = msgpack.packb(body)
    signed = old[:6] + struct.pack(">H", len(packed)) + old[8:40] + packed
    data = signed + hmac.new(announce_key(key), signed, hashlib.sha256).digest()
    assert AnnouncementDecoder(key).decode(data, now).encrypt is False


def test_handshake_still_names_the_peer_when_encrypting(key: GroupKey) -> None:
    a = Connection(Role.INITIATOR, key, Identity("ctrl", "alice", "hosta"))
    b = Connection(Role.RESPONDER, key, Identity("work", "bob", "hostb"))
    got_a, got_b = pump(a, b)
    assert got_a == [HandshakeComplete(a.peer)] and got_b == [HandshakeComplete(b.peer)]
    assert a.encrypt and b.encrypt and a.peer is not None and a.peer.encrypt



# ---------------------------------------------------------------- the key exchange


def _recorded_pair(key: GroupKey, **kwargs: object) -> tuple[Connection, Connection, list[bytes]]:
    """A handshake, recorded as an observer on the path sees it."""
    a = Connection(Role.INITIATOR, key, Identity("c"), **kwargs)  # type: ignore[arg-type]
    b = Connection(Role.RESPONDER, key, Identity("w"), **kwargs)  # type: ignore[arg-type]
    seen: list[bytes] = []
    for _ in range(3):
        for src, dst in ((a, b), (b, a)):
            for frame in src.data_to_send():
                seen.append(frame.tobytes())
                dst.feed(seen[-1])
    assert a.state is b.state is ConnectionState.READY
    return a, b, seen


def test_a_member_who_records_a_connection_cannot_read_it(key: GroupKey) -> None:
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    from elsewhere.peer.ciphers import AES_GCM
    from elsewhere.peer.frames import DirectionKey, hkdf

    a, b, handshake = _recorded_pair(key)
    a.send(Ask("a secret task id"))
    (frame,) = a.data_to_send()
    raw = frame.tobytes()
    assert b.feed(raw)[0].message.task_id == "a secret task id"  # type: ignore[union-attr]
    # the group key and the three handshake frames: what a member (or a thief of the key
    # file, later) has of a recorded connection; the keys need the X25519 exchange too
    salt = hashlib.sha256(b"".join(handshake)).digest()
    info = b"elsewhere peer v1 initiator->responder" + (b"" if a.cipher == AES_GCM else b"\0" + a.cipher.encode())
    guess = DirectionKey(hkdf(key.secret, salt, info), True, a.cipher)
    head = memoryview(raw)
    assert guess.open_head(frame.seq, head, FIXED_SIZE) is None
    # (the same derivation with the exchange's shared secret does open it: the test is sound)
    hello, challenge = (Hello.from_header(msgpack.unpackb(f[FIXED_SIZE : len(f) - n]))
                        for f, n in ((handshake[0], 0), (handshake[1], TAG_SIZE)))  # fmt: skip
    assert hello.dh and challenge.dh and hello.dh != challenge.dh
    private = a._ephemeral._pair[0]  # type: ignore[attr-defined,union-attr]
    shared = private.exchange(X25519PublicKey.from_public_bytes(challenge.dh))
    right = DirectionKey(hkdf(key.secret + shared, salt, info), True, a.cipher)
    assert right.open_head(frame.seq, head, FIXED_SIZE) is not None


def test_an_attacker_cannot_strip_the_key_exchange(key: GroupKey) -> None:
    controller = Connection(Role.INITIATOR, key, Identity("c"))
    worker = Connection(Role.RESPONDER, key, Identity("w"))
    hello = controller.data_to_send()[0].tobytes()
    fields = msgpack.unpackb(hello[FIXED_SIZE:])
    assert len(fields["dh"]) == 32
    forged = msgpack.packb({k: v for k, v in fields.items() if k != "dh"})  # as an older peer's
    worker.feed(hello[:16] + len(forged).to_bytes(4, "big") + hello[20:FIXED_SIZE] + forged)
    with pytest.raises(ProtocolError, match="CHALLENGE frame failed authentication"):
        controller.feed(worker.data_to_send()[0].tobytes())


def test_a_workers_key_shares_are_kept_a_few_seconds_then_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    from elsewhere.peer import handshake

    clock = [100.0]
    monkeypatch.setattr(handshake.time, "monotonic", lambda: clock[0])
    shares = handshake.EphemeralKeys(reuse_s=10.0)
    first = shares.get()
    clock[0] += 9.9
    assert shares.get() is first
    clock[0] += 0.2
    assert shares.get()[1] != first[1]
    fresh = handshake.EphemeralKeys()  # a controller's: one per connection
    assert fresh.get()[1] != fresh.get()[1]
    a, b, _ = _recorded_pair(GroupKey("x", bytes(32)), ephemeral=shares)  # both ends, one pair: works
    a.send(Ask("t"))
    assert b.feed(a.data_to_send()[0].tobytes())


def test_a_key_share_that_is_no_x25519_key_is_refused(key: GroupKey) -> None:
    controller = Connection(Role.INITIATOR, key, Identity("c"))
    worker = Connection(Role.RESPONDER, key, Identity("w"))
    hello = controller.data_to_send()[0].tobytes()
    forged = msgpack.packb({**msgpack.unpackb(hello[FIXED_SIZE:]), "dh": bytes(32)})  # a low-order point
    forged_hello = hello[:16] + len(forged).to_bytes(4, "big") + hello[20:FIXED_SIZE] + forged
    controller._transcript = [forged_hello]  # type: ignore[attr-defined]  (a key holder's own HELLO)
    worker.feed(forged_hello)
    controller.feed(worker.data_to_send()[0].tobytes())
    with pytest.raises(ProtocolError, match="not a valid X25519 key"):
        worker.feed(controller.data_to_send()[0].tobytes())
