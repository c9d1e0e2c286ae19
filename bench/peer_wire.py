"""How fast is the peer wire codec? MAC throughput and tiny-frame cost.

    .venv/bin/python bench/peer_wire.py [--mib 100] [--rounds 5]

Prints, best of ``rounds``:

1. raw MACs over one buffer: GMAC one-shot (AESGCM.encrypt, empty plaintext),
   GMAC streamed over 1 MiB slices, HMAC-SHA256;
2. the codec in memory on a TASK with one large buffer: encode (MAC) + receive
   (copied into place the way ``recv_into`` would, MAC checked) with a group key,
   without one (no MAC), and without one plus HMAC-SHA256 on both sides (what an
   HMAC-based codec would cost);
3. the same over a real TCP loopback connection between two processes (the
   sender streams parts with ``sendall``; the receiver ``recv_into`` the
   connection's own, reused buffers);
4. a tiny frame (PING) encode + decode, in microseconds.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import hmac
import multiprocessing
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

try:
    import elsewhere  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from elsewhere.peer.keys import GroupKey, generate_key
from elsewhere.peer.messages import Accept, Ask, Identity, Ping, Task
from elsewhere.peer.wire import Connection, HandshakeComplete, Limits, Received, Role

SLICE = 1 << 20


def best(rounds: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


class Pool:
    """An allocator handing out one reused, pre-touched buffer (as a daemon would)."""

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)  # zero-filled: pages touched once, here

    def __call__(self, size: int) -> memoryview:
        return memoryview(self.buf)[:size]


def pair(key: GroupKey | None, allocate: Callable[[int], object]) -> tuple[Connection, Connection]:
    limits = Limits(max_body_bytes=1 << 34)
    a = Connection(Role.INITIATOR, key, Identity("a"), limits=limits)
    b = Connection(Role.RESPONDER, key, Identity("b"), limits=limits, allocate=allocate)  # type: ignore[arg-type]
    for _ in range(3):
        for f in a.data_to_send():
            b.feed(f.tobytes())
        for f in b.data_to_send():
            a.feed(f.tobytes())
    return a, b


def admit(a: Connection, b: Connection, task_id: str) -> None:
    a.send(Ask(task_id))
    for f in a.data_to_send():
        b.feed(f.tobytes())
    b.send(Accept(task_id))
    for f in b.data_to_send():
        a.feed(f.tobytes())


def in_memory(key: GroupKey | None, data: bytearray, rounds: int, hmac_too: bool = False) -> float:
    a, b = pair(key, Pool(len(data)))
    counter = iter(range(10**9))
    mac_key = os.urandom(32)

    def once() -> None:
        task_id = f"t{next(counter)}"
        admit(a, b, task_id)
        if hmac_too:
            sent_tag = hmac.new(mac_key, data, hashlib.sha256).digest()
        a.send(Task(task_id), [data])
        events: list[object] = []
        for frame in a.data_to_send():
            for part in frame.iter_parts(SLICE):  # MAC while "sending"
                view = part
                while view:  # what recv_into does: copy into the receiver's buffer
                    target = b.receive_buffer()
                    n = min(len(target), len(view))
                    target[:n] = view[:n]
                    events += b.received(n)
                    view = view[n:]
        got = events[-1]
        assert isinstance(got, Received)
        if hmac_too:
            tag = hmac.new(mac_key, got.buffers[0], hashlib.sha256).digest()
            if not hmac.compare_digest(tag, sent_tag):
                raise RuntimeError("HMAC mismatch")

    return len(data) / best(rounds, once) / 1e9


def _flush(conn: Connection, sock: socket.socket) -> None:
    for frame in conn.data_to_send():
        for part in frame.iter_parts(SLICE):  # MAC each slice just before it is sent
            sock.sendall(part)


class _Endpoint:
    """A connection on a blocking socket, keeping events that arrive early."""

    def __init__(self, conn: Connection, sock: socket.socket) -> None:
        self.conn, self.sock = conn, sock
        self.pending: collections.deque[object] = collections.deque()

    def wait(self, want: Callable[[object], bool]) -> object:
        """Receive (into the connection's own buffers) until an event ``want`` accepts."""
        conn, sock = self.conn, self.sock
        while True:
            while self.pending:
                event = self.pending.popleft()
                if want(event):
                    return event
            if conn.next_size() >= 65536:
                n = sock.recv_into(conn.receive_buffer())
                events = conn.received(n) if n else conn.receive_eof()
            else:
                chunk = sock.recv(262144)
                events = conn.feed(chunk) if chunk else conn.receive_eof()
            _flush(conn, sock)
            self.pending.extend(events)
            if not events and conn.state.value == "closed":
                raise RuntimeError("connection closed")


def _sender(key: GroupKey | None, address: tuple[str, int], data: bytearray, rounds: int) -> None:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Connection(
        Role.INITIATOR, key, Identity("sender"), limits=Limits(max_body_bytes=1 << 34)
    )
    end = _Endpoint(conn, sock)
    _flush(conn, sock)
    end.wait(lambda e: isinstance(e, HandshakeComplete))
    for i in range(rounds):
        conn.send(Ask(f"t{i}"))
        _flush(conn, sock)
        end.wait(lambda e: isinstance(e, Received) and isinstance(e.message, Accept))
        conn.send(Task(f"t{i}"), [data])
        _flush(conn, sock)
    sock.close()


def over_tcp(key: GroupKey | None, data: bytearray, rounds: int) -> float:
    """A sender process streams TASK frames to this process over TCP loopback."""
    server = socket.create_server(("127.0.0.1", 0))
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_sender, args=(key, server.getsockname(), data, rounds))
    child.start()
    sock, _ = server.accept()
    server.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pool = Pool(len(data))
    conn = Connection(Role.RESPONDER, key, Identity("receiver"),
                      limits=Limits(max_body_bytes=1 << 34), allocate=pool)  # fmt: skip
    end = _Endpoint(conn, sock)
    times = []
    try:
        end.wait(lambda e: isinstance(e, HandshakeComplete))
        for _ in range(rounds):
            ask = end.wait(lambda e: isinstance(e, Received))
            assert isinstance(ask, Received) and isinstance(ask.message, Ask)
            t0 = time.perf_counter()
            conn.send(Accept(ask.message.task_id))
            _flush(conn, sock)
            end.wait(lambda e: isinstance(e, Received) and isinstance(e.message, Task))
            times.append(time.perf_counter() - t0)
    finally:
        sock.close()
        child.join(30)
        if child.is_alive():
            child.kill()
    return len(data) / min(times) / 1e9


def tiny(key: GroupKey | None, n: int = 20000) -> float:
    a, b = pair(key, bytearray)

    def once() -> None:
        for i in range(n):
            a.send(Ping(i))
            for frame in a.data_to_send():
                b.feed(frame.parts()[0])

    return best(3, once) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    size = args.mib << 20
    data = bytearray(os.urandom(1 << 20)) * args.mib
    key = GroupKey("bench", generate_key())
    mac_key = os.urandom(32)
    nonce = os.urandom(12)
    aead = AESGCM(mac_key)

    def gmac_stream() -> None:
        enc = Cipher(algorithms.AES(mac_key), modes.GCM(nonce)).encryptor()
        view = memoryview(data)
        for i in range(0, size, SLICE):
            enc.authenticate_additional_data(view[i : i + SLICE])
        enc.finalize()

    gmac_once = size / best(args.rounds, lambda: aead.encrypt(nonce, b"", data)) / 1e9
    gmac_sliced = size / best(args.rounds, gmac_stream) / 1e9
    hmac_speed = (
        size / best(args.rounds, lambda: hmac.new(mac_key, data, hashlib.sha256).digest()) / 1e9
    )
    copy_speed = size / best(args.rounds, lambda: bytearray(data)) / 1e9

    print(f"peer wire benchmark: {args.mib} MiB, best of {args.rounds}, {os.cpu_count()} cores")
    print("\n1. MAC alone over one buffer (GB/s)")
    print(f"   GMAC one call (AESGCM.encrypt)  {gmac_once:7.2f}")
    print(f"   GMAC streamed, 1 MiB slices     {gmac_sliced:7.2f}")
    print(f"   HMAC-SHA256                     {hmac_speed:7.2f}")
    print(f"   (bytearray copy, for scale      {copy_speed:7.2f})")
    print(f"   GMAC / HMAC-SHA256              {gmac_sliced / hmac_speed:7.1f}x")

    keyed = in_memory(key, data, args.rounds)
    plain = in_memory(None, data, args.rounds)
    with_hmac = in_memory(None, data, args.rounds, hmac_too=True)
    print("\n2. codec in memory: encode + receive a TASK with one buffer (GB/s)")
    print(f"   keyed (GMAC)                    {keyed:7.2f}")
    print(f"   no key (no MAC)                 {plain:7.2f}")
    print(f"   no key + HMAC-SHA256 both sides {with_hmac:7.2f}")
    print(f"   GMAC codec / no MAC             {keyed / plain:7.2f}")
    print(f"   GMAC codec / HMAC codec         {keyed / with_hmac:7.2f}x")

    tcp_keyed = over_tcp(key, data, args.rounds)
    tcp_plain = over_tcp(None, data, args.rounds)
    print("\n3. over TCP loopback, sender process -> receiver process (GB/s)")
    print(f"   keyed (GMAC)                    {tcp_keyed:7.2f}")
    print(f"   no key (no MAC)                 {tcp_plain:7.2f}")
    print(f"   keyed / no key                  {tcp_keyed / tcp_plain:7.2f}")

    print("\n4. tiny frame (PING): encode + decode (us)")
    tiny_keyed, tiny_plain = tiny(key), tiny(None)
    print(f"   keyed                           {tiny_keyed:7.1f}")
    print(f"   no key                          {tiny_plain:7.1f}")


if __name__ == "__main__":
    main()
