"""What keeps the memory of a warm worker and of a peer daemon flat over many jobs and under
a flood of frames they must refuse (issue 24: within 10% of their first job's RSS after 100
jobs of 1 000 tasks and 100 000 refused frames; ``bench/memory.py`` measures that).

The bounds are checked by counting, not by timing: the objects alive in a warm local worker
(its ``gc`` count, read by a task that runs in it) after many jobs, against their count after
the first few; and the daemon's own structures (its connections, its controllers, what it
remembers of controllers gone, its shared buffers, every ``Peer`` object it made) after jobs
and after a flood, with the daemon running in this process on loopback. Each fails if a job
or a refused connection left something behind that grows with their number.

Real components: a real local worker pool (``ew.local``), a real daemon loop with its task
child, real controllers (``ew.map(on=ew.peers(...))``) and TCP connections on 127.0.0.1.
"""

from __future__ import annotations

import gc
import os
import random
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import elsewhere as ew
from elsewhere.peer.admission import Peer
from elsewhere.peer.announce import new_peer_id
from elsewhere.peer.daemon import PeerWorker
from elsewhere.peer.discovery import DiscoveryConfig
from elsewhere.peer.keys import GroupKey, generate_key, load_key, write_key
from elsewhere.peer.messages import Identity, Ping
from elsewhere.peer.options import WorkerOptions
from elsewhere.peer.wire import Connection, HandshakeComplete, Role

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_LINGER = struct.pack("ii", 1, 0)  # closed with a reset: no TIME_WAIT pile-up on loopback


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return value


def free_port() -> int:
    """A port free for UDP and TCP on 127.0.0.1 a moment ago."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = int(u.getsockname()[1])
        with socket.socket() as t:
            try:
                t.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


# ---------------------------------------------------------------- a warm local worker


def objects_here(_: int) -> tuple[int, int, int, str]:
    """(pid, objects the cyclic gc tracks, memory blocks allocated, how it started) of the
    process it runs in: a worker's. The blocks count every object, strings and bytes included
    (which the gc does not track)."""
    gc.collect()
    return os.getpid(), len(gc.get_objects()), sys.getallocatedblocks(), sys.argv[0]


def failing(x: int) -> int:
    if x % 7 == 0:
        raise ValueError(f"task {x} fails on purpose")
    return x


def printing(x: int) -> int:
    print("task", x)
    return x


def test_a_warm_local_worker_holds_no_more_objects_after_many_jobs(ew_home: Path) -> None:
    on = ew.local(cores=1)
    idle = on.pool_dir() / "idle"
    xs = list(range(200))

    def job(i: int) -> None:
        # each kind of job a worker meets: by reference, by value (a new function each
        # time), tasks that fail, tasks that print
        if i:
            wait_until(lambda: os.listdir(idle), 10, "the worker idle again")
        kind = i % 4
        if kind == 0:
            assert ew.map(abs, xs, on=on, progress=False) == xs
        elif kind == 1:
            assert ew.map(lambda x, i=i: x + i, xs, on=on, progress=False)[-1] == xs[-1] + i
        elif kind == 2:
            got = ew.map(failing, xs, on=on, progress=False, errors="return")
            assert sum(isinstance(v, ew.TaskError) for v in got) == len(xs[::7])
        else:
            assert ew.map(printing, xs, on=on, progress=False) == xs

    def count() -> tuple[int, int, int, str]:
        wait_until(lambda: os.listdir(idle), 10, "the worker idle again")
        [got] = ew.map(objects_here, [0], on=on, progress=False)
        return got

    for i in range(8):  # the kinds twice: whatever a first job of each imports and caches
        job(i)
    pid, warm, warm_blocks, started = count()
    for i in range(8, 24):
        job(i)
    pid_after, after, after_blocks, started_after = count()
    print(
        f"\nwarm worker {pid}: {warm} objects and {warm_blocks} blocks after 8 jobs, "
        f"{after} and {after_blocks} after 24"
    )
    assert pid_after == pid, "the pool replaced its warm worker: the count says nothing"
    if started_after != started:  # (-c as the pool starts it, a module's path after an exec)
        pytest.skip("the worker started afresh meanwhile: elsewhere's source changed on disk")
    # the same count to the object here (run after run): one container left behind per job
    # shows as 16 more. The blocks grow by a few hundred as the interpreter's caches settle
    # (fewer with every job: 150 in the first 200 jobs, 11 in the fifth 200, measured); one
    # string left behind per task shows as 3 200
    assert after - warm < 8, (warm, after)
    assert after_blocks - warm_blocks < 1600, (warm_blocks, after_blocks)


# ---------------------------------------------------------------- a peer daemon


class Daemon:
    """A :class:`PeerWorker` of one slot serving group "mem" on 127.0.0.1, its loop in a
    thread of this process (a context manager)."""

    def __init__(self, tmp: Path) -> None:
        self.key_path = write_key("mem", tmp / "mem.key")
        self.key = load_key(self.key_path)
        self.discovery = free_port()
        self.worker = PeerWorker(WorkerOptions(
            key=self.key, slots=1, bind="127.0.0.1",
            discovery=DiscoveryConfig(port=self.discovery, interface="127.0.0.1"),
        ))  # fmt: skip
        self.port = self.worker.start()[1]
        self.thread = threading.Thread(target=self.worker.serve, kwargs={"install_signals": False},
                                       name="daemon under test", daemon=True)  # fmt: skip

    def __enter__(self) -> Daemon:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.request_stop(hand_back=True)
        self.thread.join(20)
        assert not self.thread.is_alive(), "the daemon did not stop"

    def quiet(self) -> bool:
        """No connection open, no work held or running, nothing kept for a controller."""
        w = self.worker
        return not (w.peers or w.handshaking or w.by_controller or w.running or w.queued or w.unacked
                    or w.admission.held or w.admission.reserved)  # fmt: skip


def peers_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Peer)


def test_controllers_that_came_and_went_leave_nothing_in_the_daemon(
    tmp_path: Path, ew_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "config"))
    with Daemon(tmp_path) as d:
        on = ew.peers("mem", key=d.key_path, port=d.discovery, interface="127.0.0.1")
        jobs = 3
        for _ in range(jobs):  # a controller each (a new peer id), as ew.map makes
            assert ew.map(abs, range(-40, 0), on=on, progress=False) == list(range(40, 0, -1))
        wait_until(d.quiet, 30, "the controllers gone and their results acknowledged")
        w = d.worker
        assert w.stats["tasks"] == 40 * jobs
        # a controller gone with nothing running here is forgotten at once; only its
        # fair-share use is kept, until it decays (FairShare.prune)
        assert w.gone_since == {}, w.gone_since
        assert len(w.fair.snapshot(time.monotonic())) <= jobs
        assert w.pool._used == {}, "shared buffers of finished tasks still taken"
    assert peers_alive() == 0


class Refused:
    """Connections to 127.0.0.1:``port`` that the daemon must refuse, thrown ``in_flight`` at
    once, each sent whole and ended, then read until the daemon closes it."""

    def __init__(self, port: int, key: GroupKey) -> None:
        self.port, self.key = port, key
        self.rng = random.Random(24)
        self.hello = (
            Connection(Role.INITIATOR, key, Identity(new_peer_id())).data_to_send()[0].tobytes()
        )
        other = GroupKey(key.group, generate_key())  # the group's name, another secret
        a = Connection(Role.INITIATOR, other, Identity(new_peer_id()))
        b = Connection(Role.RESPONDER, other, Identity(new_peer_id()))
        first = b"".join(f.tobytes() for f in a.data_to_send())
        b.feed(first)
        a.feed(b"".join(f.tobytes() for f in b.data_to_send()))
        self.wrong_key = first + b"".join(f.tobytes() for f in a.data_to_send())

    def frames(self, n: int) -> Iterator[bytes]:
        rng = self.rng
        for i in range(n):
            kind = i % 4
            if kind == 0:
                yield rng.randbytes(rng.randint(1, 200))
            elif kind == 1:
                b = bytearray(self.hello)
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                yield bytes(b)
            elif kind == 2:
                yield b"ELSW\x01" + bytes([rng.choice([1, 2, 3, 10, 99])]) + rng.randbytes(60)
            else:
                yield self.wrong_key

    def throw(self, n: int, in_flight: int = 16) -> None:
        sel = selectors.DefaultSelector()
        frames, live, more = self.frames(n), 0, True
        while more or live:
            while more and live < in_flight:
                data = next(frames, None)
                if data is None:
                    more = False
                    break
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
                s.connect(("127.0.0.1", self.port))
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
                live += 1
            for key, _ in sel.select(5.0):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    if s.recv(65536):
                        continue  # a CHALLENGE or an ERROR frame: the close comes next
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                sel.unregister(s)
                s.close()
                live -= 1
        sel.close()

    def authenticated_then_bad(self, i: int) -> None:
        """A real handshake with the group key (a new controller each), then a frame with a
        bad MAC: the connection of a controller that proved the key and ran nothing."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
        conn = Connection(Role.INITIATOR, self.key, Identity(new_peer_id(), "mem", "mem"))
        try:
            done = False
            while not done:
                for f in conn.data_to_send():
                    s.sendall(f.tobytes())
                data = s.recv(65536)
                assert data, "the daemon closed a connection with the right key"
                done = any(isinstance(e, HandshakeComplete) for e in conn.feed(data))
            for f in conn.data_to_send():
                s.sendall(f.tobytes())
            conn.send(Ping(i))
            frame = bytearray(conn.data_to_send()[0].tobytes())
            frame[-1] ^= 0x01  # its tag
            s.sendall(frame)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass  # reset by the daemon: refused
        finally:
            s.close()


def test_a_flood_of_refused_connections_leaves_nothing_in_the_daemon(tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        w = d.worker
        watched = len(w.sel.get_map())  # the listening socket, the waker, the task child
        refused = Refused(d.port, d.key)
        raw, authed = 800, 50
        refused.throw(raw)
        for i in range(authed):
            refused.authenticated_then_bad(i)
        wait_until(lambda: w.stats["connections"] >= raw + authed and d.quiet(), 30,
                   "every connection of the flood closed")  # fmt: skip
        assert w.stats["protocol_errors"] >= raw // 2 + authed, dict(w.stats)
        assert w.stats["handshakes"] >= authed
        assert len(w.sel.get_map()) == watched
        # 50 controllers proved the key, ran nothing and went: none is remembered
        assert w.gone_since == {}, f"{len(w.gone_since)} controllers remembered"
        assert w.fair.snapshot(time.monotonic()) == {}
        assert w.pool._used == {}
    assert peers_alive() == 0  # (while it runs, its loop holds the last one it served)
