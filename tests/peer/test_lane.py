"""Lanes: a controller's connection carried on by a worker's task process (see "Lanes" in
docs/peer-protocol.md): a connection moved to another process with its session, and a
worker daemon's lanes spoken to by a hand-driven controller."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from peer_procs import WorkerProc, wait_until
from peer_testing import make_pair, pump
from test_daemon import Client, decode, start_worker

from elsewhere.peer.child import Outcome
from elsewhere.peer.keys import GroupKey, load_key, write_key
from elsewhere.peer.messages import (
    LANE_SUFFIX,
    Accept,
    Ask,
    Bye,
    Cancel,
    Refuse,
    RefuseReason,
    Result,
    Task,
)
from elsewhere.peer.wire import Connection, Received
from elsewhere.util.errors import PeerError, ProtocolError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return write_key("lab", tmp_path / "lab.key")


def _moved(conn: Connection) -> Connection:
    """``conn`` carried on elsewhere: its session through msgpack, as it crosses processes."""
    session = msgpack.unpackb(msgpack.packb(conn.session(), use_bin_type=True), raw=False)
    return Connection.resumed(session)


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "loopback"])
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "clear"])
def test_a_connection_moved_with_its_session_carries_on_both_ways(keyed: bool, encrypt: bool, key: GroupKey) -> None:
    a, b = make_pair(key if keyed else None, encrypt=encrypt)
    a.send(Ask("t1", lane=True))
    (got,) = pump(a, b)[1]
    assert isinstance(got, Received) and got.message == Ask("t1", lane=True)
    moved = _moved(b)  # the ASK is open on it: the task process answers it
    assert moved.peer == b.peer and moved.cipher == b.cipher
    moved.send(Accept("t1"))
    pump(a, moved)
    a.send(Task("t1", {"n": 1}, Task.folding(Ask("t2"))), [b"an argument", bytes(200_000)])
    (task,) = pump(a, moved)[1]
    assert task.message.task_id == "t1" and bytes(task.buffers[0]) == b"an argument" and len(task.buffers[1]) == 200_000
    moved.send(Result("t1", {"ok": 1}, accepted=("t2",)), [b"its value"])
    (result,) = pump(a, moved)[0]
    assert bytes(result.buffers[0]) == b"its value" and result.message.accepted == ("t2",)
    a.send(Task("t2", {"n": 2}), [b"x"])  # admitted by the ACCEPT folded in the RESULT
    assert pump(a, moved)[1][0].message.task_id == "t2"
    with pytest.raises(PeerError, match="was not accepted"):
        a.send(Task("t3", {}), [b"x"])  # the admission rules came along


def test_a_moved_session_holds_the_connections_keys_not_the_group_secret(key: GroupKey) -> None:
    _a, b = make_pair(key)
    packed = msgpack.packb(b.session(), use_bin_type=True)
    assert key.secret not in packed and b.proven_secret not in packed


def test_a_frame_replayed_to_the_moved_connection_is_refused(key: GroupKey) -> None:
    a, b = make_pair(key)
    a.send(Ask("t1"))
    frames = [f.tobytes() for f in a.data_to_send()]
    for f in frames:
        b.feed(f)
    moved = _moved(b)
    with pytest.raises(ProtocolError, match="out of order or replayed"):
        moved.feed(frames[0])


def test_a_connection_is_not_moved_in_the_middle_of_a_frame(key: GroupKey) -> None:
    a, b = make_pair(key)
    a.send(Ask("t1"))
    (frame,) = [f.tobytes() for f in a.data_to_send()]
    b.feed(frame[:10])
    with pytest.raises(PeerError, match="middle of a frame"):
        b.session()
    b.feed(frame[10:])
    b.session()  # whole again
    b.send(Accept("t1"))
    with pytest.raises(PeerError, match="middle of a frame"):
        b.session()  # the ACCEPT not sent yet


# ---------------------------------------------------------------- a worker daemon's lanes


@contextlib.contextmanager
def _lane_worker(tmp_path: Path, key_file: Path, slots: int) -> Iterator[tuple[WorkerProc, Client, Client, int, GroupKey]]:
    """A live worker of ``slots`` slots, a controller's own connection to it, and a lane
    connection of the same controller (and the worker's port and key, for more clients)."""
    w, port = start_worker(tmp_path, key_file, "--slots", str(slots))
    key = load_key(key_file)
    try:
        main = Client(port, key)
        yield w, main, Client(port, key, peer_id=main.peer_id + LANE_SUFFIX), port, key
    finally:
        w.stop()


def test_a_lane_runs_its_tasks_in_a_task_process_and_gives_its_slot_back(tmp_path: Path, key_file: Path) -> None:
    with _lane_worker(tmp_path, key_file, 1) as (w, main, lane, port, key):
        assert lane.ask("l1", lane=True) == Accept("l1")  # said by the task process
        lane.task("l1", os.getpid, [()], ask=Ask("l2"))
        ev = lane.next(Result, 20)
        assert ev.message.accepted == ("l2",)  # the next ASK, accepted in the RESULT
        ((_, fate, pid),) = decode(ev.message.info, ev.buffers)
        assert fate is Outcome.OK and pid != w.pid and pid in w.live_children()
        assert ev.message.info["pid"] == pid  # the RESULT was written by the process that ran it
        lane.task("l2", abs, [(-7,)], ask=Ask("l3"))
        assert lane.result("l2") == [(0, Outcome.OK, 7)]
        stats = wait_until(lambda: (s := w.stats()).get("lanes") == 1 and s, 10, "the lane counted")
        assert stats.get("batches", 0) == 0  # the daemon relayed none of them
        # the controller's own connection asks too: it waits, the slot is its lane's
        main.send(Ask("m1"))
        assert lane.quiet(0.5) == [] and main.quiet(0.1) == []
        # another controller asks: the lane ends (BYE, its granted ASK unused), the slot is
        # given fairly (the other controller's, which has had none)
        other = Client(port, key)
        other.send(Ask("o1"))
        bye = lane.next(Bye, 20)
        assert "another controller waits" in bye.message.reason
        assert other.next((Accept, Refuse), 20).message == Accept("o1")
        other.task("o1", os.getpid, [()])
        ((_, fate, pid2),) = other.result("o1")
        assert fate is Outcome.OK and pid2 == pid  # the same task process, the daemon's again
        assert main.next((Accept, Refuse), 20).message == Accept("m1")  # then the controller's own
        wait_until(lambda: w.stats().get("lanes_taken_back") == 1, 10, "the lane taken back")


def test_a_lane_whose_task_process_dies_frees_its_slot(tmp_path: Path, key_file: Path) -> None:
    with _lane_worker(tmp_path, key_file, 1) as (w, main, lane, _port, _key):
        assert lane.ask("l1", lane=True) == Accept("l1")
        lane.task("l1", os._exit, [(3,)])
        with pytest.raises(ConnectionError):
            lane.next(Result, 20)  # the connection ends with the process: the controller places it again
        wait_until(lambda: w.stats().get("lanes_lost") == 1, 10, "the lane's death seen")
        assert main.ask("m1") == Accept("m1")  # its slot is free
        main.task("m1", abs, [(-2,)])
        assert main.result("m1") == [(0, Outcome.OK, 2)]


def test_lanes_are_refused_where_a_task_process_cannot_serve_them(tmp_path: Path, key_file: Path) -> None:
    with _lane_worker(tmp_path, key_file, 2) as (_w, main, lane, port, key):
        refused = lane.ask("l1", lane=True, time_s=60)
        assert isinstance(refused, Refuse) and refused.reason is RefuseReason.BUSY and "no memory or time" in refused.detail
        refused = main.ask("m1", lane=True)  # on the controller's own connection
        assert isinstance(refused, Refuse) and "lane connection" in refused.detail
        second = Client(port, key, peer_id=main.peer_id + LANE_SUFFIX)
        assert isinstance(second.ask("x", cores=1), Refuse)  # a lane connection asks for a lane
        third = Client(port, key, peer_id=main.peer_id + LANE_SUFFIX)  # one lane a slot, at most
        with pytest.raises(ConnectionError):
            third.ask("y", lane=True)
        assert main.ask("m2") == Accept("m2")  # the controller's own connection is untouched


def test_a_worker_asked_to_stop_ends_its_lanes_and_exits(tmp_path: Path, key_file: Path) -> None:
    with _lane_worker(tmp_path, key_file, 1) as (w, _main, lane, _port, _key):
        assert lane.ask("l1", lane=True) == Accept("l1")
        lane.task("l1", abs, [(-3,)], ask=Ask("l2"))
        assert lane.result("l1") == [(0, Outcome.OK, 3)]
        w.signal(signal.SIGTERM)  # drain: the lane ends after the batch in hand (none), the worker exits
        assert "stopping" in lane.next(Bye, 20).message.reason
        assert w.proc.wait(20) == 0


def test_a_task_admitted_before_a_lane_took_the_slot_is_not_stuck_behind_it(tmp_path: Path, key_file: Path) -> None:
    # the controller's own connection was admitted (its ASK ahead), the slot went to its lane
    # once that admission went unused for a moment; then the TASK comes: the lane ends after
    # its batch and the TASK runs (before, it waited for as long as the lane lived)
    with _lane_worker(tmp_path, key_file, 1) as (_w, main, lane, _port, _key):
        assert main.ask("m1") == Accept("m1")
        lane.send(Ask("l1", lane=True))
        time.sleep(0.2)  # the admission of m1 goes stale (unused); the next ASK admits the lane
        main.send(Ask("m2"))
        assert lane.next((Accept, Refuse), 20).message == Accept("l1")
        main.task("m1", abs, [(-4,)])
        assert "waits for this slot" in lane.next(Bye, 20).message.reason
        assert main.result("m1") == [(0, Outcome.OK, 4)]
        main.send(Cancel("m2"))  # (its admission would hold the worker's exit up)


def test_a_worker_with_an_idle_lane_idles_out(tmp_path: Path, key_file: Path) -> None:
    # --maxidle: a lane that runs no task keeps the worker no more than an unused admission
    w, port = start_worker(tmp_path, key_file, "--slots", "1", "--maxidle", "1")
    key = load_key(key_file)
    try:
        main = Client(port, key)
        lane = Client(port, key, peer_id=main.peer_id + LANE_SUFFIX)
        assert lane.ask("l1", lane=True) == Accept("l1")
        lane.task("l1", abs, [(-5,)], ask=Ask("l2"))
        assert lane.result("l1") == [(0, Outcome.OK, 5)]  # then nothing more
        assert "stopping" in lane.next(Bye, 30).message.reason
        assert w.proc.wait(30) == 0
    finally:
        w.stop()
