"""The worker daemon, spoken to over its wire protocol by a hand-driven controller.

Each test starts real ``elsewhere peer worker`` processes and talks to them
with a :class:`Connection` on a plain socket: admission and its reasons,
held requests, results kept until acknowledged, cancel, drain and hand-back,
the limits a worker offers, and the command line around it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from peer_procs import WorkerProc, free_port, wait_until

from elsewhere.folder import serial
from elsewhere.peer import wire
from elsewhere.peer.announce import new_peer_id
from elsewhere.peer.child import Outcome
from elsewhere.peer.keys import GroupKey, load_key, write_key
from elsewhere.peer.messages import (
    Accept,
    Ack,
    Ask,
    Cancel,
    Error,
    Identity,
    Ping,
    Pong,
    Refuse,
    RefuseReason,
    Result,
    Task,
)
from elsewhere.peer.wire import Connection, HandshakeComplete, Received, Role
from elsewhere.util.errors import ConfigError, ProtocolError
from elsewhere.util.units import format_duration, format_size, parse_duration, parse_size

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- a hand-driven controller


class Client:
    """A controller reduced to its wire protocol, on a blocking socket."""

    def __init__(self, port: int, key: GroupKey | None, *, peer_id: str | None = None,
                 user: str = "tester") -> None:  # fmt: skip
        self.peer_id = peer_id or new_peer_id()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = Connection(Role.INITIATOR, key, Identity(self.peer_id, user, "testhost"))
        self.pending: list[Any] = []
        self.flush()
        self.next(HandshakeComplete)

    def flush(self) -> None:
        for frame in self.conn.data_to_send():
            self.sock.sendall(frame.tobytes())

    def send(self, message: Any, buffers: Any = ()) -> None:
        self.conn.send(message, buffers)
        self.flush()

    def next(self, kind: type | tuple[type, ...] = object, timeout: float = 10.0) -> Any:
        """The next event whose message (or itself) is a ``kind``."""
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.pending):
                obj = ev.message if isinstance(ev, Received) else ev
                if isinstance(obj, kind):
                    del self.pending[i]
                    return ev
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} within {timeout} s (have {self.pending})")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("the worker closed the connection")
            self.pending += self.conn.feed(data)
            self.flush()  # e.g. AUTH, the answer to CHALLENGE

    def quiet(self, seconds: float) -> list[Any]:
        """Events that arrive within ``seconds`` (checks that nothing else does)."""
        got = list(self.pending)
        self.pending.clear()
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                break
            if not data:
                break
            got += self.conn.feed(data)
            self.flush()
        return got

    def ask(self, tid: str, **kw: Any) -> Any:
        self.send(Ask(tid, **kw))
        return self.next((Accept, Refuse)).message

    def task(self, tid: str, fn: Any, args: list[tuple[Any, ...]], *, first: int = 0,
             job: dict[str, Any] | None = None, time_s: float = 0.0,
             ask: Ask | None = None, files: tuple[str, bytes] | None = None,
             digest: str | None = None, send_fn: bool = True,
             info_extra: dict[str, Any] | None = None) -> None:  # fmt: skip
        module = sys.modules[__name__]
        cloudpickle.register_pickle_by_value(module)  # the worker cannot import this test file
        try:  # large arrays out of band, as the controller sends them
            entries, oob = serial.dumps([(None, a, {}) for a in args])
            common = cloudpickle.dumps((fn, None), protocol=5)
            job_part = [] if files is None else [pickle.dumps((None, files), protocol=5)]
        finally:
            cloudpickle.unregister_pickle_by_value(module)
        info = {"job": job or {"id": "j1", "name": "job", "seed": 1}, "diary": "always",
                "items": [[first + i, 0] for i in range(len(args))], "ntask": 1 + len(oob),
                "nfn": 1 if send_fn else 0, "fn": digest or "f-" + tid, "time_s": time_s,
                **(info_extra or {})}  # fmt: skip
        if files is not None:  # the job's files= in a job part (the job data would go there too)
            info.update(jpart="j-" + files[0], njpart=1)
        fn_part = [common] if send_fn else []
        self.send(Task(tid, info, Task.folding(ask) if ask is not None else ()),
                  [entries, *oob, *fn_part, *job_part])  # fmt: skip

    def result(self, tid: str, timeout: float = 20.0, *, ack: bool = True) -> list[tuple[int, Outcome, Any]]:
        ev = self.next(Result, timeout)
        assert ev.message.task_id == tid
        if ack:
            self.send(Ack(tid))
        return decode(ev.message.info, ev.buffers)

    def close(self) -> None:
        self.sock.close()


def decode(info: dict[str, Any], buffers: tuple[Any, ...]) -> list[tuple[int, Outcome, Any]]:
    """(task, fate, value) of each task of a RESULT: its items, then the tasks of its runs."""
    return [(index, fate, value) for index, fate, value, _log in decode_logs(info, buffers)]


def decode_logs(info: dict[str, Any], buffers: tuple[Any, ...]) -> list[tuple[int, Outcome, Any, bytes]]:
    """(task, fate, value, output) of each task of a RESULT: its items, then its runs'."""
    values, pos, opos = [], 0, 2
    for plen, noob in info["groups"]:
        data = bytes(buffers[0][pos : pos + plen])
        values.append(pickle.loads(data, buffers=buffers[opos : opos + noob]))
        pos, opos = pos + plen, opos + noob
    out = []
    logs, at = bytes(buffers[1]), 0
    for index, _attempt, status, group, item, *_, log_len in info["items"]:
        out.append((index, Outcome(status), values[group][item] if group >= 0 else None, logs[at : at + log_len]))
        at += log_len
    for first, count, _attempt, group, item, *_ in info.get("runs", ()):
        out += [(first + k, Outcome.OK, values[group][item + k], b"") for k in range(count)]
    return out


def start_worker(tmp: Path, key: Path | None, *args: str) -> tuple[WorkerProc, int]:
    port = free_port()
    extra = ["--key", str(key)] if key is not None else []
    w = WorkerProc(["--port", str(port), "--interface", "127.0.0.1", *extra, *args],
                   tmp / f"w{port}.json")  # fmt: skip
    stats = w.wait_started()
    return w, int(stats["port"])


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return write_key("lab", tmp_path / "lab.key")


# ---------------------------------------------------------------- admission


def test_refusals_come_before_any_payload_with_a_reason(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "1", "--memavail", "1G",
                           "--timavail", "10s", "--refuse-user", "mallory")  # fmt: skip
    try:
        key = load_key(key_file)
        c = Client(port, key)
        r = c.ask("m", mem_bytes=2 << 30)
        assert isinstance(r, Refuse) and r.reason is RefuseReason.MEMORY
        r = c.ask("t", time_s=100)
        assert isinstance(r, Refuse) and r.reason is RefuseReason.TIME
        r = c.ask("c", cores=2)
        assert isinstance(r, Refuse) and r.reason is RefuseReason.BUSY and "2 cores" in r.detail
        assert isinstance(c.ask("ok", mem_bytes=1 << 20, time_s=5), Accept)
        c.send(Cancel("ok"))
        m = Client(port, key, user="mallory")
        r = m.ask("x")
        assert isinstance(r, Refuse) and r.reason is RefuseReason.NOT_ALLOWED and "mallory" in r.detail
        assert w.stats().get("refused_not_allowed", 0) >= 0
    finally:
        w.stop()


def test_a_full_worker_holds_requests_and_admits_them_in_turn(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        assert isinstance(c.ask("a"), Accept)
        c.send(Ask("b"))
        assert not c.quiet(0.3)  # held: the slot is taken
        c.task("a", time.sleep, [(0.3,)])
        ev = c.next(Result, timeout=10)  # admitted once free: the ACCEPT inside the RESULT
        assert ev.message.task_id == "a" and ev.message.accepted == ("b",)
        assert decode(ev.message.info, ev.buffers)[0][1] is Outcome.OK
        c.send(Ack("a"))
        c.task("b", pow, [(2, 5)])
        assert c.result("b") == [(0, Outcome.OK, 32)]
    finally:
        w.stop()


def test_the_accept_a_freed_slot_brings_leaves_with_the_result(tmp_path: Path, key_file: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(wire, "CAPABILITIES", ("ack-many",))  # a controller without "fold"
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        assert isinstance(c.ask("a"), Accept)
        c.send(Ask("b"))  # held: the slot is taken
        c.task("a", pow, [(2, 3)])
        c.sock.settimeout(10)
        data = c.sock.recv(1 << 20)  # one send of the worker: both frames in one read
        events = c.conn.feed(data)
        assert [type(e.message) for e in events] == [Result, Accept], events
        assert events[1].message == Accept("b") and events[0].message.accepted == ()
        assert decode(events[0].message.info, events[0].buffers) == [(0, Outcome.OK, 8)]
        c.send(Ack("a"))
        c.send(Cancel("b"))
    finally:
        w.stop()


def test_to_a_folding_controller_the_accept_rides_inside_the_result(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        assert "fold" in c.conn.peer.caps
        assert isinstance(c.ask("a"), Accept)
        c.task("a", pow, [(2, 3)], ask=Ask("b"))  # the next ASK inside the TASK: held meanwhile
        ev = c.next(Result)
        assert ev.message.accepted == ("b",)  # one frame: the RESULT, admitting "b"
        assert decode(ev.message.info, ev.buffers) == [(0, Outcome.OK, 8)]
        assert c.quiet(0.3) == []  # no ACCEPT frame of its own
        c.send(Ack("a"))
        c.task("b", pow, [(3, 3)], ask=Ask("c"))  # admitted by the folded ACCEPT
        ev = c.next(Result)
        assert ev.message.accepted == ("c",)
        assert decode(ev.message.info, ev.buffers) == [(0, Outcome.OK, 27)]
        c.send(Ack("b"))
        c.send(Cancel("c"))
    finally:
        w.stop()


def written_at(w: WorkerProc) -> int:
    """When the daemon last wrote its stats file (ns; 0 before the first write)."""
    try:
        return w.stats_path.stat().st_mtime_ns
    except OSError:
        return 0


def settled_count(w: WorkerProc, key: str, *, after: int = 0, timeout: float = 20.0) -> int:
    """The counter ``key`` once two successive stats writes, both newer than ``after``, agree."""
    seen: dict[int, int] = {}  # write time -> the count it holds

    def agreed() -> tuple[int] | None:
        before = written_at(w)
        value = w.stats().get(key, 0)
        if before > after and written_at(w) == before:  # not replaced while read
            seen[before] = value
        last = [seen[t] for t in sorted(seen)[-2:]]
        return (last[1],) if len(last) == 2 and last[0] == last[1] else None

    return wait_until(agreed, timeout, f"two stats writes that agree on {key}")[0]


def tiny(i: int) -> int:
    import warnings

    if i in (150, 151):
        print(f"out {i}", flush=i == 151)  # (150: left in the buffer, flushed for it)
    if i == 300:
        raise ValueError("three hundred")
    if i in (350, 351):
        warnings.warn("careful", stacklevel=1)  # one line: shown for each task
    return 2 * i


def test_a_flood_of_tiny_tasks_keeps_each_task_s_value_error_and_output(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        assert isinstance(c.ask("a"), Accept)
        c.task("a", tiny, [(i,) for i in range(400)])
        got: dict[int, tuple[Outcome, Any, str]] = {}
        saw_runs = False
        while len(got) < 400:
            ev = c.next(Result, 20)
            c.send(Ack(ev.message.task_id))
            saw_runs = saw_runs or bool(ev.message.info.get("runs"))
            for index, fate, value, log in decode_logs(ev.message.info, ev.buffers):
                got[index] = (fate, value, log.decode())
        assert [f for f, _, _ in got.values()].count(Outcome.ERROR) == 1 and got[300][0] is Outcome.ERROR
        assert all(got[i][1] == 2 * i for i in range(400) if i != 300)
        printed = {i: text for i, (_, _, text) in got.items() if text}
        assert set(printed) == {150, 151, 350, 351}, printed  # each task's output is its own
        assert printed[150] == "out 150\n" and printed[151] == "out 151\n"
        assert "careful" in printed[350] and "careful" in printed[351]
        # most of them ran on the task process's fast path (and this says what the test saw)
        stats = wait_until(lambda: w.stats().get("tasks", 0) >= 1 and w.stats(), 10, "the stats")
        assert stats.get("child_fast_tasks", 0) > 200, stats
        assert saw_runs  # the quiet runs crossed as one entry each (and their tasks are all above)
        c.close()
    finally:
        w.stop()


def unpicklable_at_250(i: int) -> Any:
    return threading.Lock() if i == 250 else i


@pytest.mark.parametrize("runs", [True, False], ids=["runs", "rows"])
def test_quiet_runs_cross_as_one_entry_and_a_value_that_cannot_travel_is_its_task_s_error(
        tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch, runs: bool) -> None:  # fmt: skip
    if not runs:  # a controller that reads no runs gets one row per task
        monkeypatch.setattr(wire, "CAPABILITIES", tuple(c for c in wire.CAPABILITIES if c != "runs"))
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        for bid, fn in (("a", abs), ("b", unpicklable_at_250)):
            assert isinstance(c.ask(bid), Accept)
            c.task(bid, fn, [(i,) for i in range(400)])
            got: dict[int, tuple[Outcome, Any]] = {}
            entries = 0
            while len(got) < 400:
                ev = c.next(Result, 20)
                c.send(Ack(ev.message.task_id))
                info = ev.message.info
                entries += len(info["items"]) + len(info.get("runs", ()))
                assert runs or "runs" not in info
                for index, fate, value in decode(info, ev.buffers):
                    assert index not in got, f"task {index} reported twice"
                    got[index] = (fate, value)
            assert sorted(got) == list(range(400))
            if bid == "a":
                assert all(got[i] == (Outcome.OK, i) for i in range(400))
                assert entries < 100 if runs else entries == 400  # (most of them on the fast path)
            else:
                assert got[250][0] is Outcome.ERROR and "pickle" in str(got[250][1]).lower()
                assert all(got[i] == (Outcome.OK, i) for i in range(400) if i != 250)
        c.close()
    finally:
        w.stop()


def test_busy_poll_keeps_the_worker_awake_after_a_task_then_it_sleeps(tmp_path: Path, key_file: Path) -> None:
    polling = start_worker(tmp_path, key_file, "--slots", "1", "--busy-poll", "50")
    sleeping = start_worker(tmp_path, key_file, "--slots", "1", "--busy-poll", "0")
    try:
        clients = []
        for _w, port in (polling, sleeping):
            c = Client(port, load_key(key_file))
            clients.append(c)
            assert isinstance(c.ask("a"), Accept)
            c.task("a", pow, [(2, 3)])
            assert c.result("a") == [(0, Outcome.OK, 8)]  # acknowledged: nothing more comes
        # the 50 ms window closes; the stats are rewritten every second, so a fixed sleep could
        # read a write made inside the window on a loaded machine: read counts that two
        # writes in a row agree on, then one from a write made a while later
        first = [settled_count(w, "busy_polls") for w, _ in (polling, sleeping)]
        time.sleep(1.2)
        later = [settled_count(w, "busy_polls", after=written_at(w)) for w, _ in (polling, sleeping)]
        assert first[0] > 0  # it polled, awake, after the frames and the child's result
        assert later[0] == first[0]  # and then slept: no polling without work
        assert first[1] == later[1] == 0  # --busy-poll 0: never
        # the child that ran the task polled too, after it (it says so with its next result),
        # and then slept: the next task still reached it, long after the window
        for c in clients:
            assert isinstance(c.ask("b"), Accept)
            c.task("b", pow, [(3, 2)])
            assert c.result("b") == [(0, Outcome.OK, 9)]
        polls = [wait_until(lambda w=w: w.stats().get("tasks", 0) >= 2 and w.stats(), 10, "the stats of two tasks")
                 for w, _ in (polling, sleeping)]  # fmt: skip
        assert polls[0].get("child_busy_polls", 0) > 0
        assert polls[1].get("child_busy_polls", 0) == 0
    finally:
        polling[0].stop()
        sleeping[0].stop()


def test_a_frame_that_arrives_in_pieces_is_read_whole(tmp_path: Path, key_file: Path) -> None:
    # the daemon stops reading once a read leaves the socket empty; the rest of a frame that
    # comes later must still be read (the socket is readable again), byte by byte even
    w, port = start_worker(tmp_path, key_file)
    try:
        c = Client(port, load_key(key_file))
        c.conn.send(Ask("split", mem_bytes=1, time_s=1.0, cores=1))
        (raw,) = [f.tobytes() for f in c.conn.data_to_send()]
        for i in range(0, len(raw), 7):
            c.sock.sendall(raw[i : i + 7])
            time.sleep(0.01)
        assert c.next((Accept, Refuse)).message == Accept("split")
        c.send(Cancel("split"))
    finally:
        w.stop()


def test_results_are_kept_until_acknowledged(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file)
    key = load_key(key_file)
    try:
        c = Client(port, key)
        assert isinstance(c.ask("r"), Accept)
        c.task("r", pow, [(3, 2), (4, 2)], first=10)
        assert c.result("r", ack=False) == [(10, Outcome.OK, 9), (11, Outcome.OK, 16)]
        c.close()  # gone before acknowledging: the worker keeps the result
        again = Client(port, key, peer_id=c.peer_id)
        assert again.result("r") == [(10, Outcome.OK, 9), (11, Outcome.OK, 16)]  # and ACK
        again.close()
        third = Client(port, key, peer_id=c.peer_id)
        third.send(Ping(7))
        assert [type(getattr(e, "message", e)) for e in third.quiet(0.5)] == [Pong]
        # another controller never sees it
        assert not Client(port, key).quiet(0.3)
    finally:
        w.stop()


def test_a_controller_away_is_given_its_grace_then_its_running_tasks_stop(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "2", "--grace", "3s")
    key = load_key(key_file)
    try:
        c = Client(port, key)
        assert isinstance(c.ask("back"), Accept) and isinstance(c.ask("gone"), Accept)
        c.task("back", time.sleep, [(1.5,)])
        c.task("gone", time.sleep, [(60,)])
        time.sleep(0.3)
        c.close()  # away (a laptop asleep): within the grace, both go on
        time.sleep(2.0)
        again = Client(port, key, peer_id=c.peer_id)  # back: the finished one is there
        assert again.result("back") == [(0, Outcome.OK, None)]
        again.close()  # away again, for longer than the grace: the other one is stopped
        wait_until(lambda: w.stats().get("orphans_stopped") == 1 and w.stats().get("running") == 0, 20,
                   "the orphaned task to be stopped")  # fmt: skip
        third = Client(port, key, peer_id=c.peer_id)
        assert [type(getattr(e, "message", e)) for e in third.quiet(0.5)] == []  # no RESULT for it
    finally:
        w.stop()


def test_one_ack_acknowledges_several_results(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file)
    key = load_key(key_file)
    try:
        c = Client(port, key)
        assert "ack-many" in c.conn.peer.caps
        for tid, base in (("r1", 2), ("r2", 3), ("r3", 4)):
            assert isinstance(c.ask(tid), Accept)
            c.task(tid, pow, [(base, 2)])
            assert c.result(tid, ack=False) == [(0, Outcome.OK, base * base)]
        c.send(Ack("r1", ("r3",)))  # r2 stays unacknowledged
        c.send(Ping(1))
        c.next(Pong)  # the ACK was read before the PING was answered
        c.close()
        again = Client(port, key, peer_id=c.peer_id)  # only what was not acknowledged comes again
        assert again.result("r2") == [(0, Outcome.OK, 9)]
        assert [type(getattr(e, "message", e)) for e in again.quiet(0.5)] == []
    finally:
        w.stop()


def test_cancel_stops_a_running_task_and_the_worker_goes_on(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        assert isinstance(c.ask("long"), Accept)
        c.task("long", time.sleep, [(60,)])
        time.sleep(0.3)
        c.send(Cancel("long"))
        assert isinstance(c.ask("next"), Accept)  # the slot is free again at once
        c.task("next", pow, [(2, 10)])
        assert c.result("next") == [(0, Outcome.OK, 1024)]
    finally:
        w.stop()


def crash(x: int) -> int:
    if x == 1:
        os.abort()
    return x


def test_a_crash_reports_the_task_lost_and_hands_back_the_rest(tmp_path: Path,
                                                               key_file: Path) -> None:  # fmt: skip
    w, port = start_worker(tmp_path, key_file)
    try:
        c = Client(port, load_key(key_file))
        assert isinstance(c.ask("b"), Accept)
        c.task("b", crash, [(0,), (1,), (2,)])
        out = c.result("b")
        # task 0 ended before the crash; its value, unless already sent, is lost with the
        # child and the task handed back. 1 crashed it; 2 never ran.
        assert out[0][:2] in ((0, Outcome.OK), (0, Outcome.REQUEUE))
        assert [(i, fate) for i, fate, _ in out[1:]] == [(1, Outcome.LOST), (2, Outcome.REQUEUE)]
        assert out[1][2]["type"] == "WorkerLost" and "SIGABRT" in out[1][2]["message"]
        assert isinstance(c.ask("after"), Accept)
        c.task("after", pow, [(3, 3)])
        assert c.result("after") == [(0, Outcome.OK, 27)]
    finally:
        w.stop()


def big(a: Any) -> Any:
    return a[::-1].copy()


def test_large_arrays_cross_out_of_band(tmp_path: Path, key_file: Path) -> None:
    np = pytest.importorskip("numpy")
    w, port = start_worker(tmp_path, key_file)
    try:
        c = Client(port, load_key(key_file))
        a = np.arange(6_000_000, dtype=np.float64)  # 48 MB
        assert isinstance(c.ask("big"), Accept)
        c.task("big", big, [(a,)])
        ev = c.next(Result, 30)
        c.send(Ack("big"))
        assert any(len(b) == a.nbytes for b in ev.buffers[2:])  # the value came out of band
        (_, fate, value), = decode(ev.message.info, ev.buffers)
        assert fate is Outcome.OK and value[0] == a[-1] and value.shape == a.shape
    finally:
        w.stop()


def doubled_in_place(a: Any) -> Any:
    a *= 2
    return a


def tail_of(a: Any) -> Any:
    return a[1000:]


def read_only(a: Any) -> Any:
    a.flags.writeable = False
    return a


def test_a_result_that_is_its_argument_is_sent_from_it_and_kept_until_acknowledged(
        tmp_path: Path, key_file: Path) -> None:  # fmt: skip
    np = pytest.importorskip("numpy")
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    key = load_key(key_file)
    try:
        c = Client(port, key)
        n = (4 << 20) // 8  # large: it travels in pooled shared memory
        cases = [("twice", doubled_in_place, np.full(n, 1.0), np.full(n, 2.0)),
                 ("tail", tail_of, np.arange(n, dtype=np.float64), np.arange(1000, n, dtype=np.float64)),
                 ("ro", read_only, np.full(n, 3.0), np.full(n, 3.0))]  # fmt: skip
        for tid, fn, arg, want in cases:
            assert isinstance(c.ask(tid), Accept)
            c.task(tid, fn, [(arg,)])
            ((_, fate, value),) = c.result(tid, ack=False)
            assert fate is Outcome.OK and np.array_equal(value, want), tid
        # the same size again: the pool must not hand out the memory the unacknowledged
        # results above are in
        for tid in ("later1", "later2"):
            assert isinstance(c.ask(tid), Accept)
            c.task(tid, doubled_in_place, [(np.full(n, 10.0),)])
            ((_, fate, value),) = c.result(tid)
            assert fate is Outcome.OK and value[0] == value[-1] == 20.0
        c.close()
        again = Client(port, key, peer_id=c.peer_id)  # the kept results come again, intact
        for tid, _fn, _arg, want in cases:
            ev = again.next(Result, 20)
            ((_, fate, value),) = decode(ev.message.info, ev.buffers)
            assert np.array_equal(value, dict((t, x) for t, _, _, x in cases)[ev.message.task_id])
            again.send(Ack(ev.message.task_id))
        # nothing was copied in the child: every result was sent from its argument's memory
        wait_until(lambda: w.stats().get("results_from_inputs", 0) >= 5, 5,
                   "the worker to count the results sent from their arguments")  # fmt: skip
    finally:
        w.stop()


def test_many_functions_then_an_early_one_again(tmp_path: Path, key_file: Path) -> None:
    # the child keeps a bounded number of function parts: the daemon must know which it
    # dropped and send one again when a task needs it (it used to run None: TypeError)
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        for k in range(40):
            assert isinstance(c.ask(f"t{k}"), Accept)
            c.task(f"t{k}", pow, [(2, k)], digest=f"fn-{k}")
            assert c.result(f"t{k}") == [(0, Outcome.OK, 2**k)]
        for k in (0, 1, 39, 5):  # the worker has them: only their digests are named
            assert isinstance(c.ask(f"again{k}"), Accept)
            c.task(f"again{k}", pow, [(3, 2)], digest=f"fn-{k}", send_fn=False)
            assert c.result(f"again{k}") == [(0, Outcome.OK, 9)]
        # the controller may tell the worker to forget parts; naming one later is an error
        assert isinstance(c.ask("forget"), Accept)
        c.task("forget", pow, [(2, 2)], digest="fn-new", info_extra={"forget": ["fn-0", "fn-1"]})
        assert c.result("forget") == [(0, Outcome.OK, 4)]
        assert isinstance(c.ask("gone"), Accept)
        c.task("gone", pow, [(2, 2)], digest="fn-0", send_fn=False)
        err = c.next(Error).message
        assert "never sent" in err.message
    finally:
        w.stop()


def where_and_what(name: str) -> tuple[str, str]:
    with open(name) as f:
        return os.getcwd(), f.read()


def test_job_files_are_unpacked_in_the_tasks_folder(tmp_path: Path, key_file: Path) -> None:
    import io
    import tarfile

    from elsewhere.peer.attached import pack_files

    folder = tmp_path / "files"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("attached")
    (folder / "sub" / "more.txt").write_text("deeper")
    files = pack_files(folder)
    assert files is not None
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        job = {"id": "files-job", "name": "files", "seed": 1, "cwd": None}  # not on that machine
        assert isinstance(c.ask("f"), Accept)
        c.task("f", where_and_what, [("notes.txt",), ("sub/more.txt",)], job=job, files=files)
        (_, fate, (cwd, text)), (_, fate2, (_, text2)) = c.result("f")
        assert fate is fate2 is Outcome.OK and (text, text2) == ("attached", "deeper")
        assert os.path.basename(cwd) == "files-job"  # the job's scratch folder
        # an archive whose member leaves the folder is refused: the tasks say why
        header = io.BytesIO()
        with tarfile.open(fileobj=header, mode="w") as tar:
            info = tarfile.TarInfo("../escaped.txt")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        bad = files[1][: files[1].index(b"\n") + 1] + header.getvalue()
        assert isinstance(c.ask("g"), Accept)
        c.task("g", where_and_what, [("notes.txt",)], job={**job, "id": "bad-job"}, files=("bad", bad))
        ((_, fate, err),) = c.result("g")
        assert fate is Outcome.ERROR and "unsafe path" in err["message"]
        assert not (Path(cwd).parent / "escaped.txt").exists()
    finally:
        w.stop()


def keep(a: Any) -> float:
    import builtins

    builtins._ew_kept = a  # type: ignore[attr-defined]  # the task keeps its input past its end
    return float(a[0])


def kept_first(a: Any) -> tuple[float, float]:
    import builtins

    return float(builtins._ew_kept[0]), float(a[0])  # type: ignore[attr-defined]


def test_shared_memory_a_task_keeps_is_never_reused(tmp_path: Path, key_file: Path) -> None:
    np = pytest.importorskip("numpy")
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    try:
        c = Client(port, load_key(key_file))
        n = (4 << 20) // 8  # large: it travels in pooled shared memory
        assert isinstance(c.ask("k"), Accept)
        c.task("k", keep, [(np.full(n, 1.0),)])
        assert c.result("k") == [(0, Outcome.OK, 1.0)]
        assert isinstance(c.ask("c"), Accept)
        c.task("c", kept_first, [(np.full(n, 2.0),)])  # same size: the pool would reuse it
        assert c.result("c") == [(0, Outcome.OK, (1.0, 2.0))]
    finally:
        w.stop()


# ---------------------------------------------------------------- life of the daemon


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: its terminal closed
def test_sigterm_drains_the_running_task_is_delivered(tmp_path: Path, key_file: Path, signum: int) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    c = Client(port, load_key(key_file))
    assert isinstance(c.ask("d"), Accept)
    c.task("d", time.sleep, [(0.8,)])
    time.sleep(0.2)
    w.signal(signum)
    r = c.ask("late")
    assert isinstance(r, Refuse) and r.reason is RefuseReason.DRAINING
    assert c.result("d") == [(0, Outcome.OK, None)]
    assert w.proc.wait(10) == 0
    w.stop()


def _elsewhere(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    from peer_procs import env

    return subprocess.run([sys.executable, "-m", "elsewhere", *args], capture_output=True, text=True,
                          timeout=timeout, env=env({"ELSEWHERE_HOME": str(home)}))  # fmt: skip


def test_a_detached_worker_outlives_its_command_and_stop_drains_it(tmp_path: Path, key_file: Path) -> None:
    import json

    home = tmp_path / "home"
    out = _elsewhere(home, "peer", "worker", "--detach", "--interface", "127.0.0.1", "--port",
                     str(free_port()), "--key", str(key_file), "--slots", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = list((home / "peer" / "workers").glob("[0-9]*.json"))
    assert len(records) == 1
    rec = json.loads(records[0].read_text())
    pid = rec["pid"]
    try:
        assert f"pid {pid}" in out.stdout and "elsewhere peer stop" in out.stdout
        assert os.getsid(pid) != os.getsid(0)  # a session of its own: the terminal's end is not its
        second = _elsewhere(home, "peer", "worker", "--detach", "--interface", "127.0.0.1", "--port",
                            str(free_port()), "--key", str(key_file), "--slots", "1")  # fmt: skip
        assert second.returncode == 0 and f"already run here (pid {pid}" in second.stderr
        pids = [json.loads(p.read_text())["pid"] for p in (home / "peer" / "workers").glob("[0-9]*.json")]
        other = next(p for p in pids if p != pid)
        one = _elsewhere(home, "peer", "stop", str(other))  # by pid: that one only
        assert one.returncode == 0 and f"pid {other}" in one.stdout and f"pid {pid}" not in one.stdout
        c = Client(rec["port"], load_key(key_file))
        assert isinstance(c.ask("d"), Accept)
        c.task("d", time.sleep, [(1.0,)])
        time.sleep(0.3)
        from peer_procs import env

        stop = subprocess.Popen([sys.executable, "-m", "elsewhere", "peer", "stop"], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env({"ELSEWHERE_HOME": str(home)}))  # fmt: skip
        assert c.result("d") == [(0, Outcome.OK, None)]  # it finishes and delivers its task first
        stdout, stderr = stop.communicate(timeout=60)
        assert stop.returncode == 0, stderr
        assert f"pid {pid}" in stdout and "stopped" in stdout
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):  # gone, or a zombie its new parent reaps
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not records[0].exists()
        assert "draining" in Path(rec["log"]).read_text()
        again = _elsewhere(home, "peer", "stop")
        assert again.returncode == 0 and "no background peer workers" in again.stdout
    finally:  # whatever a failure left running
        for left in [pid, *(int(p.stem) for p in (home / "peer" / "workers").glob("[0-9]*.json"))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(left, signal.SIGKILL)


def test_a_detached_worker_that_cannot_start_says_why(tmp_path: Path, key_file: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = _elsewhere(tmp_path / "home", "peer", "worker", "--detach", "--interface", "127.0.0.1",
                         "--port", str(free_port()), "--key", str(key_file),
                         "--tcp-port", str(taken.getsockname()[1]))  # fmt: skip
    assert out.returncode == 1
    assert "did not start" in out.stderr and "Address already in use" in out.stderr
    assert not list((tmp_path / "home" / "peer" / "workers").glob("[0-9]*.json"))


def test_a_worker_whose_port_is_taken_says_so_without_a_traceback(tmp_path: Path, key_file: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        tcp = taken.getsockname()[1]
        out = _elsewhere(tmp_path / "home", "peer", "worker", "--interface", "127.0.0.1", "--port",
                         str(free_port()), "--key", str(key_file), "--tcp-port", str(tcp))  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"cannot listen for tasks on 127.0.0.1:{tcp} (Address already in use): the port is taken" in out.stderr


def test_a_second_signal_hands_the_running_task_back(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--slots", "1")
    c = Client(port, load_key(key_file))
    assert isinstance(c.ask("h"), Accept)
    c.task("h", time.sleep, [(60,)])
    time.sleep(0.3)
    w.signal(signal.SIGINT)
    time.sleep(0.2)
    w.signal(signal.SIGINT)
    assert c.result("h", timeout=10) == [(0, Outcome.REQUEUE, None)]
    assert w.proc.wait(10) == 0
    assert "stopping now: running batches are handed back" in w.log()  # the user hears the second
    w.stop()


def test_maxnum_and_maxidle_end_the_worker(tmp_path: Path, key_file: Path) -> None:
    w, port = start_worker(tmp_path, key_file, "--maxnum", "2")
    c = Client(port, load_key(key_file))
    assert isinstance(c.ask("n"), Accept)
    c.task("n", pow, [(1, 1), (2, 1), (3, 1)])  # one batch of three: two run, one goes back
    out = c.result("n")
    assert [(i, fate) for i, fate, _ in out] == [(0, Outcome.OK), (1, Outcome.OK), (2, Outcome.REQUEUE)]
    assert [v for _, _, v in out[:2]] == [1, 2]
    assert w.proc.wait(10) == 0
    w.stop()
    idle, _ = start_worker(tmp_path, key_file, "--maxidle", "0.5")
    assert idle.proc.wait(10) == 0
    idle.stop()


def test_without_a_key_the_worker_is_loopback_only(tmp_path: Path) -> None:
    w, port = start_worker(tmp_path, None, "--slots", "1")
    try:
        c = Client(port, None)
        assert isinstance(c.ask("k"), Accept)
        c.task("k", pow, [(7, 2)])
        assert c.result("k") == [(0, Outcome.OK, 49)]
        with pytest.raises((ConnectionError, ProtocolError)):  # a keyed peer cannot talk to it
            Client(port, GroupKey("default", os.urandom(32)))
        assert w.stats()["port"] == port
        with socket.socket() as s:
            s.settimeout(2)
            addrs = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), port, socket.AF_INET)}
            outside = next((a for a in addrs if not a.startswith("127.")), None)
            if outside is not None:  # listening on 127.0.0.1 only
                assert s.connect_ex((outside, port)) != 0
    finally:
        w.stop()


# ---------------------------------------------------------------- command line and units


def test_keygen_writes_a_private_key_in_the_config_dir(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from elsewhere.api.peer_cli import add_peer_commands

    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "cfg"))
    parser = argparse.ArgumentParser()
    add_peer_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["peer", "keygen", "lab"])
    assert args.func(args) == 0
    path = tmp_path / "cfg" / "peer" / "lab.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and load_key(path).group == "lab"
    assert "fingerprint" in capsys.readouterr().out
    out = tmp_path / "elsewhere.key"
    args = parser.parse_args(["peer", "keygen", "lab", "--output", str(out)])
    assert args.func(args) == 0 and stat.S_IMODE(out.stat().st_mode) == 0o600
    with pytest.raises(ConfigError, match="exists"):
        args.func(args)


def test_worker_options_from_the_command_line(tmp_path: Path, key_file: Path) -> None:
    from elsewhere.api.peer_cli import add_peer_commands, worker_options

    parser = argparse.ArgumentParser()
    add_peer_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args([
        "peer", "worker", "--maxtime", "8h", "--maxidle", "1h", "--memavail", "8G", "--slots", "4",
        "--key", str(key_file), "--allow-user", "ann", "--refuse-host", "10.9.0.0/16", "--fcfs",
        "--maxnum", "100", "--timavail", "10min", "--busy-poll", "0.5",
    ])  # fmt: skip
    opts = worker_options(args)
    assert opts.poll_s == 0.0005
    assert (opts.maxtime, opts.maxidle, opts.memavail, opts.slots) == (8 * 3600, 3600, 8 << 30, 4)
    assert (opts.timavail, opts.maxnum, opts.fair_share) == (600, 100, False)
    assert opts.key.group == "lab" and opts.more_keys == ()
    assert opts.access.check("bob", "h", "10.1.1.1") is not None  # not on the allow list
    assert opts.access.check("ann", "h", "10.9.3.4") is not None  # refused network
    assert opts.access.check("ann", "h", "10.1.1.1") is None


def test_one_worker_serves_several_groups(tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import json

    from elsewhere.api.peer_cli import add_peer_commands

    dept_file = write_key("dept", tmp_path / "dept.key")
    other_file = write_key("other", tmp_path / "other.key")
    port = free_port()
    w = WorkerProc(["--port", str(port), "--interface", "127.0.0.1", "--key", str(key_file),
                    "--key", str(dept_file), "--slots", "1"], tmp_path / "groups.json")  # fmt: skip
    try:
        tcp = int(w.wait_started()["port"])
        for f in (key_file, dept_file):  # a member of either group runs tasks there
            c = Client(tcp, load_key(f))
            assert c.conn.group == load_key(f).group
            assert isinstance(c.ask("g"), Accept)
            c.task("g", pow, [(2, 5)])
            assert c.result("g") == [(0, Outcome.OK, 32)]
            c.close()
        with pytest.raises(ProtocolError, match="serves 'dept', 'lab'"):
            Client(tcp, load_key(other_file))
        parser = argparse.ArgumentParser()
        add_peer_commands(parser.add_subparsers(dest="command"))
        for f, group in ((key_file, "lab"), (dept_file, "dept")):  # announced to each group
            args = parser.parse_args(["peer", "list", "--key", str(f), "--port", str(port),
                                      "--interface", "127.0.0.1", "--wait", "1.5", "--json"])  # fmt: skip
            assert args.func(args) == 0
            rows = json.loads(capsys.readouterr().out)
            assert [(r["group"], r["address"]) for r in rows] == [(group, f"127.0.0.1:{tcp}")]
        # with the keys of both groups (and another) in the config folder: one line for it
        config = tmp_path / "cfg"
        (config / "peer").mkdir(parents=True)
        for f, group in ((key_file, "lab"), (dept_file, "dept"), (other_file, "other")):
            copy = config / "peer" / f"{group}.key"
            copy.write_bytes(f.read_bytes())
            copy.chmod(0o600)
        monkeypatch.setenv("ELSEWHERE_CONFIG", str(config))
        args = parser.parse_args(["peer", "list", "--port", str(port), "--interface", "127.0.0.1",
                                  "--wait", "2.5", "--json"])  # fmt: skip
        assert args.func(args) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [(r["groups"], r["address"]) for r in rows] == [(["dept", "lab"], f"127.0.0.1:{tcp}")]
    finally:
        w.stop()


def test_peer_list_shows_the_workers(tmp_path: Path, key_file: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import json

    from elsewhere.api.peer_cli import add_peer_commands

    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "cfg"))
    port = free_port()
    w = WorkerProc(["--port", str(port), "--interface", "127.0.0.1", "--key", str(key_file),
                    "--slots", "2", "--memavail", "3G"], tmp_path / "list.json")  # fmt: skip
    try:
        w.wait_started()
        parser = argparse.ArgumentParser()
        add_peer_commands(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["peer", "list", "--key", str(key_file), "--port", str(port),
                                  "--interface", "127.0.0.1", "--wait", "1.5", "--json"])  # fmt: skip
        assert args.func(args) == 0
        rows = json.loads(capsys.readouterr().out)
        assert len(rows) == 1
        row = rows[0]
        assert (row["group"], row["state"], row["slots"], row["free"]) == ("lab", "idle", 2, 2)
        assert row["memory"] <= 3 << 30 and row["user"] and row["host"]
        args = parser.parse_args(["peer", "list", "--key", str(key_file), "--port", str(port),
                                  "--interface", "127.0.0.1", "--wait", "1.5"])  # fmt: skip
        assert args.func(args) == 0
        text = capsys.readouterr().out
        assert "idle" in text and "lab" in text and "2/2" in text
    finally:
        w.stop()
    # with no worker: what was listened for, and what to check
    args = parser.parse_args(["peer", "list", "--key", str(key_file), "--port", str(port),
                              "--interface", "127.0.0.1", "--wait", "0.3"])  # fmt: skip
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert f"no peers seen in 0.3 s on discovery port {port}" in text
    assert f"group 'lab' (key {load_key(key_file).fingerprint})" in text and "--peer HOST:PORT" in text


def test_sizes_and_durations() -> None:
    assert parse_size("8G") == 8 << 30 and parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29 and parse_size(100) == 100 << 20 and parse_size(None) is None
    assert parse_duration("10min") == 600 and parse_duration("1h30m") == 5400
    assert parse_duration("8h") == 28800 and parse_duration("90") == 90
    assert parse_duration("01:00:00") == 3600 and parse_duration("inf") == math.inf
    for bad in ("8X", "lots", "-1"):
        with pytest.raises(ConfigError):
            parse_size(bad)
    for bad in ("soon", "1h and more"):
        with pytest.raises(ConfigError):
            parse_duration(bad)
    assert format_size(8 << 30) == "8.0 GiB" and format_duration(5400) == "1h30m"
    assert format_duration(math.inf) == "unlimited"


# ---------------------------------------------------------------- results too large to send

_SMALL_CAP_WORKER = (  # a worker whose frames may carry 4 MiB (not 4 GiB): big results, cheaply
    "import sys\n"
    "from elsewhere.peer import wire\n"
    "real = wire.Limits\n"
    "wire.Limits = lambda: real(max_body_bytes=4 << 20)\n"
    "from elsewhere.api.peer_cli import main\n"
    "sys.exit(main(['peer', 'worker', *sys.argv[1:]]))\n"
)


def make_bytes(n: int) -> bytes:
    return bytes(n)


def test_a_result_too_large_to_send_comes_back_as_an_error_not_never(tmp_path: Path, key_file: Path) -> None:
    port = free_port()
    w = WorkerProc(["--port", str(port), "--interface", "127.0.0.1", "--key", str(key_file), "--slots", "1"],
                   tmp_path / "cap.json", launcher=[sys.executable, "-c", _SMALL_CAP_WORKER])  # fmt: skip
    try:
        c = Client(int(w.wait_started()["port"]), load_key(key_file))
        assert isinstance(c.ask("big"), Accept)
        # quick tasks, whose values would travel in one group: the child sends them in parts
        # of at most a quarter of the frame; the one too large alone becomes an error; the
        # last, which fits alone but not with the others, is handed back to run again
        sizes = [1_500_000, 6_000_000, 10, 1_500_000, 1_500_000]
        c.task("big", make_bytes, [(n,) for n in sizes])
        got = c.result("big")
        assert [(i, fate) for i, fate, _ in got] == [(0, Outcome.OK), (1, Outcome.ERROR), (2, Outcome.OK),
                                                     (3, Outcome.OK), (4, Outcome.REQUEUE)]  # fmt: skip
        assert got[0][2] == got[3][2] == bytes(1_500_000) and got[2][2] == bytes(10)
        err = got[1][2]
        assert err["type"] == "ResultTooLarge" and "(5.7 MiB) is over what one message from a worker may carry (4.0 MiB)" in err["message"]
        assert isinstance(c.ask("next"), Accept)  # the worker goes on
        c.task("next", make_bytes, [(5,)])
        assert c.result("next") == [(0, Outcome.OK, bytes(5))]
        c.close()
        wait_until(lambda: w.stats().get("results_too_large") == 1, 10, "the worker to count it")
    finally:
        w.stop()


# ---------------------------------------------------------------- a member whose clock is off

_CLOCK_AHEAD_WORKER = (  # a worker on a machine whose clock is two minutes ahead
    "import sys, time\n"
    "real = time.time\n"
    "time.time = lambda: real() + 120.0\n"
    "from elsewhere.api.peer_cli import main\n"
    "sys.exit(main(['peer', 'worker', *sys.argv[1:]]))\n"
)


def test_a_worker_whose_clock_is_off_is_named_with_the_reason(tmp_path: Path, key_file: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import elsewhere as ew
    from elsewhere.api.peer_cli import add_peer_commands
    from elsewhere.backends.peer import peers

    monkeypatch.setenv("ELSEWHERE_HOME", str(tmp_path / "home"))
    port = free_port()
    w = WorkerProc(["--port", str(port), "--interface", "127.0.0.1", "--key", str(key_file), "--slots", "1"],
                   tmp_path / "ahead.json", launcher=[sys.executable, "-c", _CLOCK_AHEAD_WORKER])  # fmt: skip
    try:
        w.wait_started()
        parser = argparse.ArgumentParser()
        add_peer_commands(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["peer", "list", "--key", str(key_file), "--port", str(port),
                                  "--interface", "127.0.0.1", "--wait", "2.5"])  # fmt: skip
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert "no peers seen" in out
        assert "refused the announcements of 127.0.0.1" in out and "a member of the group" in out
        assert "its clock is 120 s ahead of this machine's, more than the 30 s allowed" in out
        with pytest.raises(ew.TimeoutError, match=r"refused the announcements of 127\.0\.0\.1: its clock is 120 s ahead"):
            ew.map(pow, [2], [3], on=peers("lab", key=key_file, port=port, interface="127.0.0.1"), timeout=4)
    finally:
        w.stop()


def test_the_memory_of_a_task_counts_its_subprocesses() -> None:
    from elsewhere.peer.children import tree_rss

    grandchild = ("import time\nb = bytearray(96 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
                  "print('ready', flush=True)\ntime.sleep(30)\n")  # fmt: skip
    task = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}], stdout=sys.stdout)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert task.stdout is not None and task.stdout.readline().strip() == "ready"
        got = tree_rss([task.pid, 999_999_999])
        assert got[task.pid] >= 96 << 20  # the grandchild's 96 MiB, and both interpreters
        assert got[999_999_999] == 0  # no such process
    finally:
        for p in _descendants(task.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        task.kill()
        task.wait(10)


def _descendants(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return []


def test_a_child_polling_for_its_next_message_reads_it_whole_and_sees_the_end() -> None:
    # the child's side of busy polling (the daemon's --busy-poll, after each batch): a
    # message that comes while it polls, one that comes after it went to sleep, and the end
    # of the stream while it polls, which must end it at once rather than at the deadline
    from elsewhere.peer.child import MessageReader, send_message

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        reader = MessageReader(theirs)
        # more than one read takes, and more than the socket holds: sent while it is read
        sender = threading.Thread(target=send_message, args=(ours, {"op": "run", "n": 1}, [b"x" * 300_000]))
        sender.start()
        header, body, _fds = reader.read_one(time.monotonic() + 30)
        sender.join(10)
        assert header == {"op": "run", "n": 1} and bytes(body) == b"x" * 300_000

        sender = threading.Timer(0.2, send_message, (ours, {"op": "release", "ids": [3]}))
        sender.start()
        t0 = time.monotonic()
        header, _body, _fds = reader.read_one(t0 + 0.05)  # polls 50 ms, then sleeps until it comes
        sender.join()
        assert header == {"op": "release", "ids": [3]}
        assert reader.polls > 0

        closer = threading.Timer(0.05, ours.shutdown, (socket.SHUT_WR,))
        closer.start()
        t0 = time.monotonic()
        assert reader.read_one(t0 + 30) is None
        closer.join()
        assert time.monotonic() - t0 < 20  # ended by the end of the stream, not by the deadline
