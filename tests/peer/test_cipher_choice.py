"""The cipher of a connection: AES-256-GCM or ChaCha20-Poly1305, offered by each end in its
order of preference, chosen in the handshake (ChaCha20-Poly1305 where an end lacks AES
instructions and both have it, else the first of the controller's that the worker has), forced with ELSEWHERE_PEER_CIPHER; older peers, which name none, get AES-256-GCM.

The first part works without sockets; the last starts real workers (a job under each cipher,
a capture of a ChaCha20-Poly1305 job, ends forced apart, ``elsewhere peer list``)."""

from __future__ import annotations

import json
import os
import secrets
import struct
import time
from pathlib import Path

import msgpack
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from peer_procs import WorkerProc, Workers, free_port, wait_until
from peer_testing import make_pair, pump

import elsewhere as ew
from elsewhere.peer import ciphers, reader
from elsewhere.peer.announce import (
    Announcement,
    AnnouncementDecoder,
    encode_announcement,
    new_peer_id,
)
from elsewhere.peer.ciphers import AES_GCM, CHACHA, CIPHER_ENV, ChaChaPolyStream
from elsewhere.peer.frames import SMALL_BODY
from elsewhere.peer.handshake import HandshakeRefused
from elsewhere.peer.keys import GroupKey, write_key
from elsewhere.peer.messages import FIXED_SIZE, TAG_SIZE, Accept, Ask, Greeting, Identity, Task
from elsewhere.peer.wire import Connection, ConnectionState, Received, Role
from elsewhere.util.errors import PeerError, ProtocolError

BOTH = (AES_GCM, CHACHA)
ARG = b"ARGUMENT-MARKER-0b7d"


def _admit(a: Connection, b: Connection, task_id: str) -> None:
    a.send(Ask(task_id))
    pump(a, b)
    b.send(Accept(task_id))
    pump(a, b)


def _deliver(frame_bytes: bytes | bytearray, to: Connection, piece: int = 65537) -> list[object]:
    """Hand a frame to ``to`` as the pump does (large parts straight into their buffers,
    in reads of ``piece`` bytes, each decrypted in place as it lands)."""
    got: list[object] = []
    view = memoryview(frame_bytes)
    while view:
        target = to.receive_buffer()
        n = min(len(target), len(view), piece)
        target[:n] = view[:n]
        got += to.received(n)
        view = view[n:]
    return got


# ---------------------------------------------------------------- ChaCha20-Poly1305, streamed


@pytest.mark.parametrize(
    "cuts", [[], [1], [7, 64, 65], [1000, 5000, 5001]], ids=["whole", "1", "odd", "large"]
)
def test_chacha_fed_in_pieces_is_the_one_call_aead(cuts: list[int]) -> None:
    key, nonce = os.urandom(32), os.urandom(12)
    aad, message = os.urandom(45), os.urandom(9000)
    expected = ChaCha20Poly1305(key).encrypt(nonce, message, aad)
    sealer = ChaChaPolyStream(key, nonce)
    sealer.authenticate_additional_data(aad[:13])  # associated data in pieces too
    sealer.authenticate_additional_data(aad[13:])
    out = bytearray(len(message))
    bounds = [0, *cuts, len(message)]
    for lo, hi in zip(bounds, bounds[1:]):
        sealer.update_into(message[lo:hi], memoryview(out)[lo:hi])
    sealer.finalize()
    assert bytes(out) + sealer.tag == expected
    opener = ChaChaPolyStream(key, nonce, decrypt=True)  # in place, as a receiver does
    opener.authenticate_additional_data(aad)
    work = memoryview(bytearray(expected[:-TAG_SIZE]))
    for lo, hi in zip(bounds, bounds[1:]):
        opener.update_into(work[lo:hi], work[lo:hi])
    opener.finalize_with_tag(expected[-TAG_SIZE:])
    assert bytes(work) == message
    damaged = ChaChaPolyStream(key, nonce, decrypt=True)
    damaged.authenticate_additional_data(aad)
    damaged.update(expected[:-TAG_SIZE])
    with pytest.raises(InvalidTag):
        damaged.finalize_with_tag(bytes(TAG_SIZE))


def test_chacha_authenticating_only_is_the_aead_with_no_message() -> None:
    key, nonce, data = os.urandom(32), os.urandom(12), os.urandom(3000)
    mac = ChaChaPolyStream(key, nonce)
    mac.authenticate_additional_data(data[:1000])
    mac.authenticate_additional_data(data[1000:])
    mac.finalize()
    assert mac.tag == ChaCha20Poly1305(key).encrypt(nonce, b"", data)


# ---------------------------------------------------------------- what each end offers


X86_AES = "processor\t: 0\nflags\t\t: fpu vme sse2 aes pclmulqdq avx2\n"
X86_NONE = "processor\t: 0\nflags\t\t: fpu vme sse2 ssse3\n"
ARM_AES = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"
ARM_NONE = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32\n"


def test_the_cpus_aes_instructions_are_read_from_cpuinfo() -> None:
    assert [ciphers.parse_aes_flag(t) for t in (X86_AES, X86_NONE, ARM_AES, ARM_NONE, "")] == [
        True, False, True, False, False]  # fmt: skip
    assert (
        ciphers.parse_aes_flag("model name\t: AMD EPYC aes edition\n") is False
    )  # only the flags count


def test_an_end_offers_aes_first_with_aes_instructions_else_chacha(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ciphers, "aes_in_hardware", lambda: True)
    assert ciphers.offered_ciphers({}) == (AES_GCM, CHACHA)
    monkeypatch.setattr(ciphers, "aes_in_hardware", lambda: False)
    assert ciphers.offered_ciphers({}) == (CHACHA, AES_GCM)
    for name, forced in (("chacha20", CHACHA), ("ChaCha20-Poly1305", CHACHA), ("aes", AES_GCM),
                         (" aes-256-gcm ", AES_GCM)):  # fmt: skip
        assert ciphers.offered_ciphers({CIPHER_ENV: name}) == (forced,)
    with pytest.raises(PeerError, match="ELSEWHERE_PEER_CIPHER='rot13' names no cipher"):
        ciphers.offered_ciphers({CIPHER_ENV: "rot13"})


@pytest.mark.parametrize(
    ("controller", "worker", "chosen"),
    [
        (BOTH, BOTH, AES_GCM),
        ((CHACHA, AES_GCM), BOTH, CHACHA),  # an end without AES instructions puts ChaCha
        (BOTH, (CHACHA, AES_GCM), CHACHA),  # first: it is chosen, whichever end that is
        (BOTH, (CHACHA,), CHACHA),
        ((CHACHA,), BOTH, CHACHA),
        ((AES_GCM,), (CHACHA, AES_GCM), AES_GCM),
    ],
)
def test_chacha_where_an_end_lacks_aes_else_the_first_of_the_controllers_ciphers(
    key: GroupKey, controller: tuple[str, ...], worker: tuple[str, ...], chosen: str
) -> None:
    a = Connection(Role.INITIATOR, key, Identity("c"), ciphers=controller)
    b = Connection(Role.RESPONDER, key, Identity("w"), ciphers=worker)
    pump(a, b)
    assert a.state is b.state is ConnectionState.READY
    assert a.cipher == b.cipher == chosen
    assert a._send_key.cipher == b._recv_key.cipher == chosen  # type: ignore[attr-defined,union-attr]
    assert b.peer is not None and b.peer.ciphers == controller  # each end saw the other's offer
    assert a.peer is not None and a.peer.ciphers == worker
    _admit(a, b, "t1")
    a.send(Task("t1"), [ARG, bytes(3 << 20)])
    (frame,) = a.data_to_send()
    raw = b"".join(bytes(p) for p in frame.iter_parts())
    assert ARG not in raw
    got = _deliver(raw, b)
    assert bytes(got[-1].buffers[0]) == ARG  # type: ignore[attr-defined]


def test_ends_with_no_cipher_in_common_are_refused_with_a_clear_message(key: GroupKey) -> None:
    controller = Connection(Role.INITIATOR, key, Identity("c"), ciphers=(AES_GCM,))
    worker = Connection(Role.RESPONDER, key, Identity("w"), ciphers=(CHACHA,))
    with pytest.raises(HandshakeRefused) as refused:
        worker.feed(controller.data_to_send()[0].tobytes())
    assert refused.value.code == "cipher"
    (error,) = worker.data_to_send()
    with pytest.raises(HandshakeRefused) as told:
        controller.feed(error.tobytes())
    text = str(told.value)
    assert told.value.code == "cipher" and "no cipher in common" in text
    assert f"this worker offers {CHACHA}, the controller {AES_GCM}" in text and CIPHER_ENV in text


def test_an_attacker_cannot_change_the_ciphers_offered(key: GroupKey) -> None:
    for change in ("AES only", "no list"):  # (no list: as if from a peer older than the choice)
        controller = Connection(Role.INITIATOR, key, Identity("c"), ciphers=(CHACHA, AES_GCM))
        hello = controller.data_to_send()[0].tobytes()
        fields = msgpack.unpackb(hello[FIXED_SIZE:])
        assert fields["ciphers"] == [CHACHA, AES_GCM]
        if change == "AES only":
            fields["ciphers"] = [AES_GCM]
        else:
            del fields["ciphers"]
        forged = msgpack.packb(fields)
        worker = Connection(Role.RESPONDER, key, Identity("w"), ciphers=BOTH)
        worker.feed(hello[:16] + len(forged).to_bytes(4, "big") + hello[20:FIXED_SIZE] + forged)
        assert worker.cipher == AES_GCM  # the worker was led to the other cipher ...
        with pytest.raises(ProtocolError, match="CHALLENGE frame failed authentication"):
            controller.feed(
                worker.data_to_send()[0].tobytes()
            )  # ... which the controller finds out


# ---------------------------------------------------------------- peers older than the choice


@pytest.fixture
def old_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """An end made with ``ciphers=()`` behaves as a version from before the choice: it says
    nothing of ciphers in its HELLO or CHALLENGE (its header has no such key), and uses
    AES-256-GCM whatever the other end said."""
    from elsewhere.peer.handshake import Handshake

    real_header, real_choose = Greeting.to_header, Handshake._choose_cipher

    def to_header(self: Greeting) -> dict[str, object]:
        out = real_header(self)
        if not self.ciphers:
            del out["ciphers"]
        return out

    def choose(self: Handshake, theirs: tuple[str, ...]) -> None:
        if self._ciphers:
            real_choose(self, theirs)
        else:
            self.cipher = AES_GCM

    monkeypatch.setattr(Greeting, "to_header", to_header)
    monkeypatch.setattr(Handshake, "_choose_cipher", choose)


@pytest.mark.parametrize("new_offers", [BOTH, (CHACHA, AES_GCM)], ids=["aes-first", "chacha-first"])
@pytest.mark.parametrize("old_side", ["controller", "worker"])
@pytest.mark.usefixtures("old_peers")
def test_an_older_peer_and_a_newer_one_speak_aes_gcm(
    key: GroupKey, old_side: str, new_offers: tuple[str, ...]
) -> None:
    offers = {"controller": new_offers, "worker": new_offers, old_side: ()}
    a = Connection(Role.INITIATOR, key, Identity("c"), ciphers=offers["controller"])
    b = Connection(Role.RESPONDER, key, Identity("w"), ciphers=offers["worker"])
    first = a.data_to_send()
    assert ("ciphers" in msgpack.unpackb(first[0].tobytes()[FIXED_SIZE:])) is (
        old_side != "controller"
    )
    for f in first:
        b.feed(f.tobytes())
    pump(a, b)
    assert a.state is b.state is ConnectionState.READY and a.cipher == b.cipher == AES_GCM
    _admit(a, b, "t1")
    a.send(Task("t1"), [ARG])
    (frame,) = a.data_to_send()
    got = b.feed(frame.tobytes())
    assert bytes(got[0].buffers[0]) == ARG  # type: ignore[attr-defined]


@pytest.mark.usefixtures("old_peers")
def test_an_end_forced_to_chacha_refuses_an_older_peer_and_says_why(key: GroupKey) -> None:
    old = Connection(Role.INITIATOR, key, Identity("c"), ciphers=())
    new = Connection(Role.RESPONDER, key, Identity("w"), ciphers=(CHACHA,))
    with pytest.raises(
        HandshakeRefused, match=f"the controller {AES_GCM} only \\(an older version"
    ):
        new.feed(old.data_to_send()[0].tobytes())
    new_controller = Connection(Role.INITIATOR, key, Identity("c"), ciphers=(CHACHA,))
    old_worker = Connection(Role.RESPONDER, key, Identity("w"), ciphers=())
    old_worker.feed(new_controller.data_to_send()[0].tobytes())
    with pytest.raises(
        HandshakeRefused, match="no cipher in common: this controller offers chacha20"
    ):
        new_controller.feed(old_worker.data_to_send()[0].tobytes())


# ---------------------------------------------------------------- frames under ChaCha20-Poly1305


@pytest.mark.parametrize("size", [10, SMALL_BODY + 1, 3 << 20], ids=["small", "streamed", "large"])
def test_an_observer_of_a_chacha_connection_reads_nothing_of_a_task(
    key: GroupKey, size: int
) -> None:
    a, b = make_pair(key, ciphers=(CHACHA,))
    _admit(a, b, "t1")
    a.send(Task("t1", {"job": {"name": "INFO-MARKER"}}), [ARG, bytes(size), ARG])
    (frame,) = a.data_to_send()
    raw = b"".join(bytes(p) for p in frame.iter_parts())
    assert ARG not in raw and b"INFO-MARKER" not in raw
    got = _deliver(raw, b)
    assert [bytes(got[-1].buffers[i]) for i in (0, 2)] == [ARG, ARG]  # type: ignore[attr-defined]
    assert got[-1].message.info == {"job": {"name": "INFO-MARKER"}}  # type: ignore[attr-defined]


def test_a_body_streamed_by_the_sender_and_opened_at_once_by_the_receiver_agree(
    key: GroupKey,
) -> None:
    # a frame over SMALL_BODY with its head, whose body alone is under it: the sender seals it
    # slice by slice, the receiver opens it in one call; both must be the same AEAD
    for cipher in BOTH:
        a, b = make_pair(key, ciphers=(cipher,))
        _admit(a, b, "t1")
        a.send(Task("t1", {"pad": "x" * 4096}), [ARG, bytes(SMALL_BODY - 100)])
        (frame,) = a.data_to_send()
        assert not frame.small
        got = b.feed(b"".join(bytes(p) for p in frame.iter_parts(4096)))
        assert isinstance(got[0], Received) and bytes(got[0].buffers[0]) == ARG, cipher


@pytest.mark.parametrize("where", ["header", "small body", "body tag", "large body start", "large body middle",
                                   "large body end"])  # fmt: skip
def test_a_flipped_byte_under_chacha_is_refused_and_nothing_is_handed_on(
    key: GroupKey, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = make_pair(key, ciphers=(CHACHA,))
    assert a.cipher == CHACHA
    _admit(a, b, "t1")
    size = 3 << 20 if where.startswith("large") else 100
    a.send(Task("t1", {"n": 1}), [ARG, bytes(size)])
    (frame,) = a.data_to_send()
    raw = bytearray(b"".join(bytes(p) for p in frame.iter_parts()))
    hlen = int.from_bytes(raw[16:20], "big")
    body = FIXED_SIZE + 8 * 2 + hlen + TAG_SIZE
    at = {"header": FIXED_SIZE + 8 * 2 + 3, "small body": body + 5, "body tag": len(raw) - 3,
          "large body start": body, "large body middle": body + (size >> 1),
          "large body end": len(raw) - TAG_SIZE - 1}[where]  # fmt: skip
    raw[at] ^= 0x40
    parsed: list[object] = []
    real = reader.parse_header
    monkeypatch.setattr(reader, "parse_header", lambda *args: parsed.append(args) or real(*args))
    got: list[object] = []
    with pytest.raises(ProtocolError, match="failed authentication"):
        got += _deliver(raw, b, 1 << 16)
    assert got == []  # no message, no buffer of it handed on
    assert (
        parsed == [] if where == "header" else len(parsed) == 1
    )  # a damaged header is never parsed
    assert b.state is ConnectionState.CLOSED


def test_announcements_carry_the_ciphers_offered_and_old_ones_none(key: GroupKey) -> None:
    import hashlib
    import hmac

    from elsewhere.peer.announce import announce_key

    now = time.time()
    ann = Announcement(new_peer_id(), key.group, "127.0.0.1", 1, timestamp=now, counter=1, encrypt=True,
                       ciphers=(CHACHA, AES_GCM))  # fmt: skip
    data = encode_announcement(ann, key)
    assert AnnouncementDecoder(key).decode(data, now).ciphers == (CHACHA, AES_GCM)
    body = msgpack.unpackb(data[40:-32])[:12]  # a peer from before the choice sends 12 fields
    packed = msgpack.packb(body)
    signed = data[:6] + struct.pack(">H", len(packed)) + data[8:40] + packed
    old = AnnouncementDecoder(key).decode(
        signed + hmac.new(announce_key(key), signed, hashlib.sha256).digest(), now
    )
    assert old.ciphers == () and old.encrypt is True
    assert ciphers.choose_cipher(BOTH, old.ciphers) == AES_GCM


# ---------------------------------------------------------------- real workers


def secret_task(text: str) -> str:
    print("LOG-" + text[4:])  # its output travels back with the result
    return text.replace("ARG-", "RES-")


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("forced", "cipher"), [("aes", AES_GCM), ("chacha20", CHACHA)])
def test_a_job_runs_under_each_cipher_and_a_capture_reads_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forced: str, cipher: str
) -> None:
    from test_encryption_live import LoopbackCapture

    monkeypatch.setenv(CIPHER_ENV, forced)  # the worker (started now) and this controller
    key = write_key("lab", tmp_path / "lab.key")
    port = free_port()
    tag = secrets.token_hex(8)
    markers = {
        "argument": f"ARG-{tag}",
        "result": f"RES-{tag}",
        "log": f"LOG-{tag}",
        "job name": f"job-{tag}",
    }
    cluster = ew.peers("lab", key=key, port=port, interface="127.0.0.1", detach=False)
    with Workers(tmp_path, 1, port=port, key=key) as workers:
        assert f"tasks and results encrypted ({cipher})" in workers[0].log()
        with LoopbackCapture() as capture:
            job = ew.submit(
                secret_task, [markers["argument"]], on=cluster, name=markers["job name"]
            )
            job.wait(timeout=60, progress=False)
            assert job.get() == [markers["result"]]
            assert markers["log"] in job.log(0)
        stats = wait_until(lambda: workers[0].stats().get(f"cipher_{cipher}") and workers[0].stats(), 10,
                           "the worker's stats")  # fmt: skip
        assert not any(k.startswith("cipher_") and k != f"cipher_{cipher}" for k in stats)
    seen = capture.everything()
    assert len(seen) > 2000  # the job's frames were captured
    found = [name for name, m in markers.items() if m.encode() in seen]
    assert found == [], f"readable on the wire under {cipher}: {found}"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_ends_forced_to_different_ciphers_run_nothing_and_the_controller_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = write_key("lab", tmp_path / "lab.key")
    port = free_port()
    monkeypatch.setenv(CIPHER_ENV, "chacha20")
    with Workers(tmp_path, 1, port=port, key=key) as w:
        monkeypatch.setenv(CIPHER_ENV, "aes")
        job = ew.submit(
            abs, [-1], on=ew.peers("lab", key=key, port=port, interface="127.0.0.1", detach=False)
        )
        try:
            wait_until(
                lambda: "no cipher in common" in str(job.check()), 20, "the controller's note"
            )
            note = str(job.check())
            assert (
                job.state == "queued"
                and f"this worker offers {CHACHA}" in note
                and CIPHER_ENV in note
            )
            assert w[0].stats().get("tasks", 0) == 0
        finally:
            job.cancel()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_peer_list_shows_the_cipher_of_each_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from elsewhere.api.peer_cli import main as peer_main

    monkeypatch.delenv(CIPHER_ENV, raising=False)
    key = write_key("lab", tmp_path / "lab.key")
    port = free_port()
    base = ["--port", str(port), "--interface", "127.0.0.1", "--key", str(key), "--slots", "1"]
    procs = [WorkerProc(base, tmp_path / "w0.json"),
             WorkerProc(base, tmp_path / "w1.json", extra_env={CIPHER_ENV: "chacha20"})]  # fmt: skip
    try:
        for p in procs:
            p.wait_started()
        where = [
            "--key",
            str(key),
            "--port",
            str(port),
            "--interface",
            "127.0.0.1",
            "--wait",
            "1.5",
        ]
        assert peer_main(["peer", "list", *where, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        default = ciphers.offered_ciphers()[0]  # what this machine's connections would choose
        assert sorted((r["cipher"], r["wire"], tuple(r["ciphers"])) for r in rows) == sorted([
            (default, f"encrypted ({default})", ciphers.offered_ciphers()),
            (CHACHA, f"encrypted ({CHACHA})", (CHACHA,))])  # fmt: skip
        monkeypatch.setenv(
            CIPHER_ENV, "aes"
        )  # this end forced to AES: none in common with the second
        assert peer_main(["peer", "list", *where]) == 0
        table = capsys.readouterr().out
        assert f"encrypted ({AES_GCM})" in table and "encrypted (none in common)" in table
    finally:
        for p in procs:
            p.stop()
