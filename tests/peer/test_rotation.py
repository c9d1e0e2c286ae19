"""Key rotation: a new key beside the old, both accepted during the overlap, the new one
announced; the old one retired when the overlap ends or its line is dropped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from peer_procs import WorkerProc, free_port, wait_until
from peer_testing import pump
from test_daemon import Client

from elsewhere.api.peer_cli import main as peer_main
from elsewhere.peer.announce import (
    Announcement,
    AnnouncementDecoder,
    encode_announcement,
    new_peer_id,
)
from elsewhere.peer.handshake import HandshakeRefused
from elsewhere.peer.keys import (
    GroupKey,
    drop_previous_keys,
    format_key_file,
    generate_key,
    load_key,
    parse_key_file,
    rotate_key,
    write_key,
)
from elsewhere.peer.keywatch import KeyWatch, retired
from elsewhere.peer.messages import Identity, Ping, Pong
from elsewhere.peer.wire import Connection, ConnectionState, HandshakeComplete, Role
from elsewhere.util.errors import ConfigError, ProtocolError

NOW = 1_800_000_000.0


def _rotated(tmp_path: Path, overlap_s: float = 3600.0) -> tuple[GroupKey, GroupKey, Path]:
    """A key file rotated once: (the old key alone, the rotated key, its file)."""
    path = write_key("lab", tmp_path / "lab.key")
    old = load_key(path)
    new = rotate_key(path, overlap_s=overlap_s)
    return GroupKey("lab", old.secret), new, path


# ---------------------------------------------------------------- the key file


def test_rotate_writes_a_new_key_beside_the_old_until_the_overlap_ends(tmp_path: Path) -> None:
    old, new, path = _rotated(tmp_path, overlap_s=7 * 86400)
    assert new.secret != old.secret and path.stat().st_mode & 0o777 == 0o600
    ((secret, until),) = new.previous
    assert secret == old.secret and abs(until - (time.time() + 7 * 86400)) < 5
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and lines[1].split()[4] == "until" and lines[1].endswith("Z")
    assert [k.secret for k in new.accepted()] == [new.secret, old.secret]
    assert [k.secret for k in new.accepted(until + 1)] == [new.secret]  # the overlap is over
    assert new.overlap_ends() == until and new.overlap_ends(until + 1) is None
    again = rotate_key(path, overlap_s=60)  # a second rotation keeps the first one's old key
    assert [s for s, _ in again.previous] == [new.secret, old.secret]


def test_dropping_the_old_key_ends_the_overlap(tmp_path: Path) -> None:
    _old, new, path = _rotated(tmp_path)
    dropped = drop_previous_keys(path)
    assert dropped.secret == new.secret and dropped.previous == ()
    assert len(path.read_text().splitlines()) == 1


def test_a_rotated_key_file_round_trips_and_is_checked() -> None:
    key = GroupKey("lab", generate_key(), ((generate_key(), NOW),))
    parsed = parse_key_file(format_key_file(key))
    assert parsed == key and parsed.previous == key.previous
    cur, old = format_key_file(key).splitlines()
    for bad, says in ((f"{old}", "one line"), (f"{cur}\n{cur}", "one line"),
                      (f"{cur}\n{old.replace('lab', 'dept', 1)}", "same group"),
                      (f"{cur}\n{old.rsplit(' ', 1)[0]} yesterday", "not a time"),
                      (f"{cur}\n{old.replace(' until ', ' after ')}", "until")):  # fmt: skip
        with pytest.raises(ConfigError, match=says):
            parse_key_file(bad)


def test_rotating_needs_a_key_to_rotate(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no peer key file"):
        rotate_key(tmp_path / "none.key")


def test_keygen_rotate_and_drop_old_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lab.key"
    assert peer_main(["peer", "keygen", "lab", "-o", str(path)]) == 0
    first = load_key(path)
    assert peer_main(["peer", "keygen", "lab", "-o", str(path), "--rotate", "--overlap", "2d"]) == 0
    out = capsys.readouterr().out
    rotated = load_key(path)
    assert rotated.previous[0][0] == first.secret and first.fingerprint in out and "accepted until" in out
    assert abs(rotated.previous[0][1] - time.time() - 2 * 86400) < 5
    assert peer_main(["peer", "keygen", "lab", "-o", str(path), "--drop-old"]) == 0
    assert load_key(path).previous == () and load_key(path).secret == rotated.secret
    assert peer_main(["peer", "keygen", "lab", "-o", str(tmp_path / "x.key"), "--rotate"]) != 0


# ---------------------------------------------------------------- the handshake


def _handshake(ctrl_key: GroupKey, worker_key: GroupKey) -> tuple[Connection, Connection]:
    a = Connection(Role.INITIATOR, ctrl_key, Identity("c"))
    b = Connection(Role.RESPONDER, worker_key, Identity("w"))
    pump(a, b)
    return a, b


def test_during_the_overlap_old_and_new_keys_meet(tmp_path: Path) -> None:
    old, new, _ = _rotated(tmp_path)
    for ctrl, worker, proven in ((new, new, new), (old, new, old), (new, old, old)):
        a, b = _handshake(ctrl, worker)
        assert a.state is b.state is ConnectionState.READY
        assert a.proven_secret == b.proven_secret == proven.secret  # the newest key both hold
        a.send(Ping(3))
        assert pump(a, b)[1][-1].message == Ping(3)


def test_after_the_overlap_the_old_key_opens_nothing(tmp_path: Path) -> None:
    old, new, path = _rotated(tmp_path, overlap_s=0.5)
    time.sleep(0.6)
    a = Connection(Role.INITIATOR, old, Identity("former member"))
    b = Connection(Role.RESPONDER, new, Identity("w"))
    with pytest.raises(HandshakeRefused, match="no key of group 'lab' in common"):
        b.feed(a.data_to_send()[0].tobytes())
    with pytest.raises(ProtocolError, match="refused the handshake: key"):
        a.feed(b.data_to_send()[0].tobytes())
    dropped = drop_previous_keys(path)  # the same at once, by dropping the old line
    a = Connection(Role.INITIATOR, old, Identity("former member"))
    b = Connection(Role.RESPONDER, dropped, Identity("w"))
    with pytest.raises(HandshakeRefused):
        b.feed(a.data_to_send()[0].tobytes())


def test_announcements_go_out_under_the_new_key_and_old_ones_count_during_the_overlap(tmp_path: Path) -> None:
    old, new, _ = _rotated(tmp_path)
    until = new.previous[0][1]

    def datagram(key: GroupKey, counter: int, now: float) -> bytes:
        ann = Announcement(new_peer_id(), "lab", "127.0.0.1", 1, timestamp=now, counter=counter)
        return encode_announcement(ann, key)

    now = time.time()
    assert AnnouncementDecoder(old).decode(datagram(old, 1, now), now)
    with pytest.raises(ProtocolError, match="failed authentication"):
        AnnouncementDecoder(old).decode(datagram(new, 1, now), now)  # signed with the new key
    rotated = AnnouncementDecoder(new)
    assert rotated.decode(datagram(new, 1, now), now) and rotated.decode(datagram(old, 2, now), now)
    later = until + 1
    with pytest.raises(ProtocolError, match="failed authentication"):
        rotated.decode(datagram(old, 3, later), later)


def test_the_key_watch_sees_a_rotation_and_retires_the_old_key(tmp_path: Path) -> None:
    path = write_key("lab", tmp_path / "lab.key")
    first = load_key(path)
    watch = KeyWatch([first])
    t = time.monotonic() + 10
    assert watch.check(t) == [first] and not watch.changed
    rotated = rotate_key(path)
    assert watch.check(t + 1) is None  # (looked at every 2 s)
    keys = watch.check(t + 10)
    assert watch.changed and keys is not None and keys[0].secret == rotated.secret
    assert not retired(first.secret, "lab", keys)  # in its overlap
    drop_previous_keys(path)
    keys = watch.check(t + 20)
    assert watch.changed and keys is not None and retired(first.secret, "lab", keys)
    assert not retired(rotated.secret, "lab", keys)
    path.write_text("garbage")
    path.chmod(0o600)
    assert watch.check(t + 30) == keys and not watch.changed  # unreadable: the keys stay


# ---------------------------------------------------------------- a running worker


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_running_worker_takes_a_rotation_and_a_former_member_is_shut_out(tmp_path: Path) -> None:
    path = write_key("lab", tmp_path / "lab.key")
    former = GroupKey("lab", load_key(path).secret)  # a member's copy of the key, before it leaves
    port = free_port()
    w = WorkerProc(["--key", str(path), "--port", str(port), "--interface", "127.0.0.1"], tmp_path / "w.json")
    try:
        tcp = w.wait_started()["port"]
        rotated = rotate_key(path, overlap_s=3600)
        wait_until(lambda: "read the key file of group 'lab' again" in w.log(), 15, "the worker to read the key")
        ctrl = Client(tcp, rotated)  # a member with the new file: the new key
        assert ctrl.conn.proven_secret == rotated.secret
        during = Client(tcp, former)  # in the overlap, the old key still opens a connection
        assert during.conn.state is ConnectionState.READY
        drop_previous_keys(path)  # the overlap ends
        with pytest.raises(ConnectionError):  # ... and the former member's connection with it
            during.next(HandshakeComplete, timeout=15)
        with pytest.raises(ProtocolError, match="no key of group 'lab' in common"):
            Client(tcp, former)
        ctrl.send(Ping(5))  # the member's connection, under the new key, goes on
        assert ctrl.next(Pong, timeout=5).message == Pong(5)
    finally:
        w.stop()
