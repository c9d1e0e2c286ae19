"""The peer daemon under abuse: idle-connection floods, bad-frame floods, a daemon killed
mid-job, controllers with the wrong key; and, in this process, the rules that keep the
connections of strangers apart from the controllers'.

Real worker daemons on 127.0.0.1 (started with tests/peer's helpers), real controllers
(``ew.submit``, ``ew.map``), attackers in threads of this process; nothing is sent anywhere
but 127.0.0.1. Every wait has a timeout, and no assertion is on a time: what each
experiment measured (job times, the daemon's RSS and open descriptors) is printed (``-s``
shows it). The limits under test are in docs/peer-protocol.md, "Limits under abuse".
"""

from __future__ import annotations

import errno
import os
import random
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peer"))  # tests/peer's helpers

from peer_procs import WorkerProc, Workers, free_port, wait_until
from test_daemon import Client
from test_security_live import _handshake, _mutate, _throw_all

import elsewhere as ew
from chaos.conftest import Tally, run_cli, scaled
from elsewhere.backends.peer import PeerCluster, peers
from elsewhere.peer.admission import Peer
from elsewhere.peer.announce import new_peer_id
from elsewhere.peer.daemon import PeerWorker
from elsewhere.peer.handshake import HANDSHAKE_DEADLINE_S
from elsewhere.peer.inbound import MAX_AUTHENTICATED, MAX_UNAUTHENTICATED
from elsewhere.peer.keys import GroupKey, generate_key, load_key, write_key
from elsewhere.peer.messages import Ask, Error, Identity, Ping
from elsewhere.peer.options import WorkerOptions
from elsewhere.peer.wire import Connection, HandshakeComplete, Received, Role
from elsewhere.util.errors import ProtocolError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(scaled(240))]

RSS_BOUND_MB = 30  # the daemon's RSS after a flood, over its figure after its first job
_LINGER = struct.pack("ii", 1, 0)


def nap(x: int) -> int:
    time.sleep(0.05)
    return x * x


def square(x: int) -> int:
    return x * x


def slow_square(x: int) -> int:
    time.sleep(0.4)
    return x * x


# ---------------------------------------------------------------- measuring


def fd_count(pid: int) -> int:
    """Descriptors the process has open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


FDS_PER_CHILD = 3  # a task child's socket, output memfd and status memfd, in the daemon


def own_fds(w: WorkerProc) -> int:
    """The daemon's descriptors but its task children's (it may start one more for a job
    of another controller, and keeps it)."""
    return fd_count(w.pid) - FDS_PER_CHILD * len(w.live_children())


def tcp_sockets(pid: int) -> int:
    """The process's TCP sockets (listening or connected) now."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            inodes |= {line.split()[9] for line in list(f)[1:]}
    links = []
    for d in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{d}"))
        except OSError:  # closed meanwhile
            pass
    return sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes)


def rss_mb(pid: int) -> float:
    """The process's resident memory now (VmRSS), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class Sampler(threading.Thread):
    """The most descriptors a daemon held (:func:`own_fds`), and the most connections it had
    in their handshake (from its stats file), while the sampler ran."""

    def __init__(self, w: WorkerProc) -> None:
        super().__init__(daemon=True)
        self.w = w
        self.max_fds = 0
        self.max_handshaking = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.01):
            try:
                self.max_fds = max(self.max_fds, own_fds(self.w))
            except OSError:
                return
            self.max_handshaking = max(
                self.max_handshaking, int(self.w.stats().get("handshaking", 0))
            )

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def run_job(tally: Tally, on: PeerCluster, fn: Any, n: int, *, timeout: float = 120.0,
            **kw: Any) -> float:  # fmt: skip
    """Submit ``fn`` (one that returns the square of its argument) over ``range(n)``, wait,
    check every result; returns the seconds taken. A wrong or missing result counts as
    lost, a wait past ``timeout`` as a hang."""
    t0 = time.monotonic()
    job = ew.submit(fn, range(n), on=on, **kw)
    tally.trial(n)
    try:
        job.wait(timeout=timeout)
    except ew.TimeoutError as exc:
        tally.hang(f"job {job.name}: {exc}")
        job.cancel()
        return time.monotonic() - t0
    seconds = time.monotonic() - t0
    got = job.results(partial=True)
    wrong = [i for i in range(n) if got[i] != i * i]
    tally.lose(
        len(wrong), f"job {job.name}: tasks {wrong[:10]} came back as {[got[i] for i in wrong[:3]]}"
    )
    job.purge()
    return seconds


def cluster(key: Path, port: int) -> PeerCluster:
    """The peers of group "lab" under ``key`` found on discovery ``port`` of loopback."""
    on = peers("lab", key=key, port=port, interface="127.0.0.1")
    assert isinstance(on, PeerCluster)
    return on


def start_worker(tmp: Path, key: Path, *args: str) -> tuple[WorkerProc, int, int]:
    """A worker daemon on loopback: (process, its TCP port, its discovery port)."""
    port = free_port()
    w = WorkerProc(["--port", str(port), "--interface", "127.0.0.1", "--key", str(key), *args],
                   tmp / f"w{port}.json")  # fmt: skip
    return w, int(w.wait_started()["port"]), port


@pytest.fixture
def lab_key(tmp_path: Path, ew_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ELSEWHERE_CONFIG", str(tmp_path / "config"))
    return write_key("lab", tmp_path / "lab.key")


# ---------------------------------------------------------------- (a) idle connections


class IdleFlood(threading.Thread):
    """Keeps ``n`` connections open to a port that send nothing (or, given ``hello``, that
    and then nothing: a stranger's HELLO, answered, whose AUTH never comes): each one the
    daemon closes is opened again at once, until :meth:`stop`."""

    def __init__(self, port: int, n: int, hello: bytes = b"") -> None:
        super().__init__(daemon=True)
        self.port, self.n, self.hello = port, n, hello
        self.opened = 0
        self.halt = threading.Event()

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self.halt.is_set():
                while len(sel.get_map()) < self.n and not self.halt.is_set():
                    s = socket.socket()
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
                    s.setblocking(False)
                    if s.connect_ex(("127.0.0.1", self.port)) not in (0, errno.EINPROGRESS):
                        s.close()
                        break  # out of ports for a moment: let the daemon's closes catch up
                    sel.register(s, selectors.EVENT_WRITE if self.hello else selectors.EVENT_READ)
                    self.opened += 1
                for key, mask in sel.select(0.02):
                    s = key.fileobj
                    assert isinstance(s, socket.socket)
                    try:
                        if mask & selectors.EVENT_WRITE:  # connected: say HELLO, then nothing
                            s.send(self.hello)
                            sel.modify(s, selectors.EVENT_READ)
                            continue
                        if s.recv(65536):
                            continue  # the CHALLENGE: never answered
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                    sel.unregister(s)  # the daemon closed it
                    s.close()
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


@pytest.mark.parametrize("hello", [False, True], ids=["silent", "hello-then-nothing"])
def test_a_flood_of_idle_connections_does_not_slow_a_job(
    tally: Tally, tmp_path: Path, lab_key: Path, hello: bool
) -> None:
    w, tcp, port = start_worker(tmp_path, lab_key, "--slots", "2")
    on = cluster(lab_key, port)
    try:
        run_job(tally, on, nap, 40)  # the first job starts the children
        quiet_s = run_job(tally, on, nap, 40)
        fds_before = own_fds(w)
        n = scaled(1000)
        stranger = GroupKey("lab", generate_key())  # a HELLO is not tagged: anyone can say it
        said = Connection(Role.INITIATOR, stranger, Identity(new_peer_id())).data_to_send()
        flood = IdleFlood(tcp, n, said[0].tobytes() if hello else b"")
        sampler = Sampler(w)
        sampler.start()
        flood.start()
        try:
            wait_until(lambda: flood.opened >= n, 30, f"{n} idle connections")
            flooded_s = run_job(tally, on, nap, 40)
            fds_during = own_fds(w)
        finally:
            flood.stop()
            sampler.stop()
        # the connections that never proved the key held at most their own few places (and,
        # for a moment, the one accepted before the one it pushes out is closed; and the
        # controller's, and a task child started meanwhile before it shows as one)
        assert sampler.max_handshaking <= MAX_UNAUTHENTICATED, sampler.max_handshaking
        assert sampler.max_fds <= fds_before + MAX_UNAUTHENTICATED + 8, (
            sampler.max_fds,
            fds_before,
        )
        wait_until(lambda: own_fds(w) <= fds_before, 10, "the daemon's descriptors back")
        wait_until(lambda: tcp_sockets(w.pid) == 1, 10, "every connection closed but the listener")
        stats = w.stats()
        print(f"\nidle flood ({'hello' if hello else 'silent'}): 40-task job {quiet_s:.2f} s quiet, "
              f"{flooded_s:.2f} s under {n} idle connections ({flood.opened} opened, "
              f"{stats.get('handshakes_pushed_out', 0)} pushed out); daemon descriptors "
              f"{fds_before} before, {fds_during} during (at most {sampler.max_fds}), "
              f"{own_fds(w)} after (without its children's)")  # fmt: skip
        assert w.proc.poll() is None
    finally:
        w.stop()


# ---------------------------------------------------------------- (b) bad frames


class BadFrames:
    """Frames the daemon must refuse, each for a connection of its own: random bytes,
    damaged, cut and plausible headers, handshakes under another key, recorded sessions
    replayed (whole, or bit-flipped)."""

    def __init__(self, rng: random.Random, key: GroupKey, port: int) -> None:
        self.rng = rng
        self.hello = (
            Connection(Role.INITIATOR, key, Identity(new_peer_id())).data_to_send()[0].tobytes()
        )
        self.wrong_key = [self._wrong_key_session() for _ in range(8)]
        self.recorded = _record_session(port, key)

    def _wrong_key_session(self) -> bytes:
        """HELLO and AUTH (and a PING) of a full handshake under another key with the same
        group name: what an outsider who guessed the name would send."""
        other = GroupKey("lab", generate_key())
        a = Connection(Role.INITIATOR, other, Identity(new_peer_id(), "mallory", "evil"))
        b = Connection(Role.RESPONDER, other, Identity(new_peer_id()))
        hello = b"".join(f.tobytes() for f in a.data_to_send())
        b.feed(hello)
        a.feed(b"".join(f.tobytes() for f in b.data_to_send()))
        a.send(Ping(1))
        return hello + b"".join(f.tobytes() for f in a.data_to_send())

    def __call__(self, n: int) -> Iterator[bytes]:
        rng = self.rng
        for i in range(n):
            kind = i % 7
            if kind == 0:
                yield rng.randbytes(rng.randint(1, 200))
            elif kind == 1:
                yield _mutate(rng, self.hello)
            elif kind == 2:
                yield self.hello[: rng.randrange(1, len(self.hello))]  # cut, then the stream ends
            elif kind == 3:
                mtype = rng.choice([1, 2, 3, 10, 13, 14, 31, 99])
                yield b"ELSW\x01" + bytes([mtype]) + rng.randbytes(rng.randint(26, 300))
            elif kind == 4:
                yield rng.choice(self.wrong_key)
            elif kind == 5:
                yield self.recorded  # a real session again: new nonces, its AUTH fails
            else:
                yield _mutate(rng, self.recorded, allow_append=False)


def _record_session(port: int, key: GroupKey) -> bytes:
    """The bytes a real controller sent in a session (HELLO, AUTH, PING, ASK)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = Connection(Role.INITIATOR, key, Identity(new_peer_id(), "rec", "rec"))
    sent: list[bytes] = []

    def flush() -> None:
        for frame in conn.data_to_send():
            sent.append(frame.tobytes())
            sock.sendall(sent[-1])

    try:
        flush()
        ready = False
        while not ready:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the worker closed the connection during the handshake")
            ready = any(isinstance(e, HandshakeComplete) for e in conn.feed(data))
            flush()
        conn.send(Ping(7))
        conn.send(Ask("recorded", 1, 1.0, 1))
        flush()
    finally:
        sock.close()
    return b"".join(sent)


def _authenticated_bad_frame(port: int, key: GroupKey, rng: random.Random, i: int) -> bool:
    """A real handshake, then a damaged, cut or replayed frame; True once the daemon closed."""
    try:
        sock, conn = _handshake(port, key)
    except (OSError, ProtocolError):
        return False
    try:
        conn.send(Ping(i) if i % 2 else Ask(f"bad{i}", 1, 1.0, 1))
        frame = conn.data_to_send()[0].tobytes()
        kind = i % 3
        if kind == 0:
            data = _mutate(rng, frame, allow_append=False)
        elif kind == 1:
            data = frame + frame  # the same frame twice: its sequence number again
        else:
            data = frame[: rng.randrange(1, len(frame))]  # cut inside the frame
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        while sock.recv(65536):
            pass
        return True
    except OSError:
        return True  # reset by the daemon: refused too
    finally:
        sock.close()


class FrameFlood(threading.Thread):
    """Throws ``n`` refused frames at a daemon (one in ``auth_every`` after a real handshake)."""

    def __init__(self, port: int, key: GroupKey, n: int, auth_every: int = 25) -> None:
        super().__init__(daemon=True)
        self.port, self.key, self.n, self.auth_every = port, key, n, auth_every
        self.thrown = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            rng = random.Random(20261205)
            frames = BadFrames(rng, self.key, self.port)
            chunk = 500
            while self.thrown < self.n:
                k = min(chunk, self.n - self.thrown)
                raw = k - k // self.auth_every
                self.thrown += _throw_all(self.port, frames(raw))
                for i in range(k - raw):
                    self.thrown += _authenticated_bad_frame(
                        self.port, self.key, rng, self.thrown + i
                    )
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_flood_of_bad_frames_leaves_memory_and_descriptors_as_they_were(
    tally: Tally, tmp_path: Path, lab_key: Path
) -> None:
    w, tcp, port = start_worker(tmp_path, lab_key, "--slots", "2")
    on = cluster(lab_key, port)
    try:
        run_job(tally, on, square, 20)
        first = w.stats()
        fds_first, rss_first = own_fds(w), rss_mb(w.pid)
        n_frames, n_jobs = scaled(10_000), scaled(10)
        flood = FrameFlood(tcp, load_key(lab_key), n_frames)
        flood.start()
        for _ in range(n_jobs):  # real jobs while the flood goes on
            run_job(tally, on, square, 20)
        flood.join(600)
        if flood.is_alive():
            tally.hang("the flood of bad frames did not end within 600 s")
        assert flood.error is None, flood.error
        run_job(tally, on, square, 20)  # and one after it
        tally.trial(flood.thrown)
        assert w.proc.poll() is None, w.log()  # it survived
        wait_until(
            lambda: w.stats().get("handshaking", 1) == 0, 10, "no connection in its handshake"
        )
        wait_until(lambda: own_fds(w) <= fds_first, 10, "the daemon's descriptors back")
        wait_until(
            lambda: tcp_sockets(w.pid) == 1, 10, "every connection closed (the listener left)"
        )
        stats = wait_until(lambda: (s := w.stats()).get("tasks", 0) >= 20 * (n_jobs + 2) and s, 10,
                           "fresh stats")  # fmt: skip
        refused = stats.get("protocol_errors", 0) - first.get("protocol_errors", 0)
        time.sleep(1.0)  # settle: whatever the loop frees at its next ticks
        rss_after = rss_mb(w.pid)
        print(f"\nbad frames: {flood.thrown} thrown, {refused} refused, {n_jobs + 2} jobs; daemon RSS "
              f"{rss_first:.1f} MB after the first job, {rss_after:.1f} MB after the flood; "
              f"descriptors {fds_first}, {own_fds(w)} (without its children's)")  # fmt: skip
        assert stats["tasks"] == 20 * (n_jobs + 2)  # only the real tasks ever ran
        assert refused >= flood.thrown, (refused, flood.thrown)  # every one looked at and refused
        assert rss_after <= rss_first + RSS_BOUND_MB, (rss_first, rss_after)
    finally:
        w.stop()


# ---------------------------------------------------------------- (c) a daemon killed


def test_a_daemon_killed_mid_job_loses_nothing(tally: Tally, tmp_path: Path, lab_key: Path) -> None:
    for trial in range(scaled(1)):
        port = free_port()
        with Workers(tmp_path, 2, port=port, key=lab_key, slots=2) as workers:
            job = ew.submit(slow_square, range(12), on=cluster(lab_key, port), retries=1)
            tally.trial(12)
            try:
                wait_until(lambda j=job: j.check().running >= 3, 30, "tasks on both workers")
                workers[trial % 2].kill()  # SIGKILL: the daemon and its children, mid-task
                job.wait(timeout=60)
            except (AssertionError, ew.TimeoutError) as exc:
                tally.hang(f"trial {trial}: {exc}")
                job.cancel()
                continue
            got = job.results(partial=True)
            wrong = [i for i in range(12) if got[i] != i * i]
            tally.lose(len(wrong), f"trial {trial}: tasks {wrong} gave {[got[i] for i in wrong]}")
            job.purge()


# ---------------------------------------------------------------- (d) wrong keys


def test_a_controller_with_the_wrong_key_is_told_and_runs_nothing(tally: Tally, tmp_path: Path,
                                                                  lab_key: Path) -> None:  # fmt: skip
    w, tcp, port = start_worker(tmp_path, lab_key)
    bad = write_key("lab", tmp_path / "bad.key")  # the same group name, another secret
    try:
        # straight at the TCP port: the handshake says what is wrong
        for key, says in ((load_key(bad), "wrong group key"), (None, "group key")):
            tally.trial()
            with pytest.raises(ProtocolError) as caught:
                Client(tcp, key)
            assert says in str(caught.value), caught.value
        # a job: the worker is never even seen (its announcements fail the key), and the
        # wait ends with the reason the tasks wait, not a traceback
        job = ew.submit(square, range(3), on=cluster(bad, port))
        tally.trial()
        with pytest.raises(ew.TimeoutError) as timed_out:
            job.wait(timeout=3)
        assert "waiting for peers" in str(timed_out.value), timed_out.value
        p = run_cli(tally, "wait", job.name, "--timeout", "2")
        assert p.returncode != 0 and "waiting for peers" in p.stderr, (p.returncode, p.stderr)
        job.cancel()
        job.purge()
        assert w.stats().get("tasks", 0) == 0 and w.proc.poll() is None
        run_job(tally, cluster(lab_key, port), square, 4)  # and it serves its group as before
    finally:
        w.stop()


# ---------------------------------------------------------------- the rules, in this process


def _waiting(worker: PeerWorker, address: str, *, hello: bool, key: GroupKey) -> Peer:
    """A connection in its handshake (over a socketpair), that said HELLO or nothing."""
    ours, theirs = socket.socketpair()
    theirs.close()
    peer = Peer(ours, address)
    conn = Connection(Role.RESPONDER, key, Identity(new_peer_id()))
    peer.connect(conn)
    if hello:
        conn.feed(
            Connection(Role.INITIATOR, key, Identity(new_peer_id())).data_to_send()[0].tobytes()
        )
    worker.peers.add(peer)
    worker.handshaking[peer] = None
    return peer


@pytest.mark.parametrize(
    "others",
    ["10.0.0.9 silent", "10.0.0.9 hello", "127.0.0.1 silent", "each its own silent"],
)
def test_a_newcomer_pushes_out_a_flood_s_connection_not_a_handshake_under_way(
    tally: Tally, others: str
) -> None:
    key = GroupKey("lab", generate_key())
    worker = PeerWorker(WorkerOptions(slots=1))
    address, said = others.rsplit(" ", 1)
    controller = _waiting(worker, "127.0.0.1", hello=True, key=key)  # the oldest
    hello = said == "hello"
    flood = []
    for i in range(MAX_UNAUTHENTICATED - 1):
        where = f"10.1.{i}.1" if address == "each its own" else address
        flood.append(_waiting(worker, where, hello=hello, key=key))
    for _ in range(3 * MAX_UNAUTHENTICATED):  # newcomers of the flood, one by one
        tally.trial()
        worker._make_room()
        assert not controller.closed, others
        flood.append(_waiting(worker, flood[0].address, hello=hello, key=key))
        assert len(worker.handshaking) == MAX_UNAUTHENTICATED
    assert sum(p.closed for p in flood) == 3 * MAX_UNAUTHENTICATED
    worker._expire_handshakes(time.monotonic() + HANDSHAKE_DEADLINE_S + 0.01)
    assert controller.closed and not worker.handshaking and not worker.peers
    worker.sel.close()


def test_one_controller_over_the_cap_is_told_and_closed(tally: Tally) -> None:
    key = GroupKey("lab", generate_key())
    worker = PeerWorker(WorkerOptions(slots=1))
    worker.by_controller = {
        f"c{i}": Peer(socket.socket(), "127.0.0.1") for i in range(MAX_AUTHENTICATED)
    }
    ctrl = Connection(Role.INITIATOR, key, Identity(new_peer_id()))
    work = Connection(Role.RESPONDER, key, Identity(new_peer_id()))
    ours, theirs = socket.socketpair()
    peer = Peer(ours, "127.0.0.1")
    peer.connect(work)
    worker.peers.add(peer)
    worker.handshaking[peer] = None
    events = []
    for _ in range(3):  # HELLO, CHALLENGE, AUTH
        for frame in ctrl.data_to_send():
            events += work.feed(frame.tobytes())
        for frame in work.data_to_send():
            ctrl.feed(frame.tobytes())
    tally.trial()
    worker._on_handshake(peer, events[0])
    assert peer.closed and worker.stats["controllers_over_cap"] == 1 and not worker.handshaking
    theirs.settimeout(5)
    told = [e.message for e in ctrl.feed(theirs.recv(65536)) if isinstance(e, Received)]
    assert [(m.code, m.message) for m in told if isinstance(m, Error)] == [
        ("busy", f"this worker serves at most {MAX_AUTHENTICATED} controllers at once")
    ]
    for p in worker.by_controller.values():
        p.sock.close()
    theirs.close()
    worker.sel.close()
