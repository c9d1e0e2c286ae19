"""How fast is the peer wire codec? Cipher and MAC throughput and tiny-frame cost.

    .venv/bin/python bench/peer_wire.py [--mib 100] [--rounds 5] [--json FILE]

Prints, best of ``rounds``:

1. raw MACs and ciphers over one buffer: GMAC one-shot (AESGCM.encrypt, empty plaintext),
   GMAC streamed over 1 MiB slices, HMAC-SHA256; AES-256-GCM and ChaCha20-Poly1305
   encrypting (one call; AES-256-GCM also in 1 MiB slices into a reused buffer, as the
   wire does);
2. the codec in memory on a TASK with one large buffer: encode (encrypt or MAC) + receive
   (copied into place the way ``recv_into`` would, decrypted or MAC checked) with a group
   key, encrypted (the default) and not (``encrypt=False``: GMAC only), without one (no
   MAC), and without one plus HMAC-SHA256 on both sides (what an HMAC-based codec would cost);
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
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

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


def pair(key: GroupKey | None, allocate: Callable[[int], object],
         encrypt: bool = True) -> tuple[Connection, Connection]:  # fmt: skip
    limits = Limits(max_body_bytes=1 << 34)
    a = Connection(Role.INITIATOR, key, Identity("a"), limits=limits, encrypt=encrypt)
    b = Connection(Role.RESPONDER, key, Identity("b"), limits=limits, allocate=allocate, encrypt=encrypt)  # type: ignore[arg-type]
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


def in_memory(key: GroupKey | None, data: bytearray, rounds: int, hmac_too: bool = False,
              encrypt: bool = True) -> float:  # fmt: skip
    a, b = pair(key, Pool(len(data)), encrypt)
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


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sender(key: GroupKey | None, address: tuple[str, int], data: bytearray, rounds: int,
            encrypt: bool, cpu: object) -> None:  # fmt: skip
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Connection(
        Role.INITIATOR, key, Identity("sender"), limits=Limits(max_body_bytes=1 << 34), encrypt=encrypt
    )
    end = _Endpoint(conn, sock)
    _flush(conn, sock)
    end.wait(lambda e: isinstance(e, HandshakeComplete))
    for i in range(rounds):
        conn.send(Ask(f"t{i}"))
        _flush(conn, sock)
        end.wait(lambda e: isinstance(e, Received) and isinstance(e.message, Accept))
        c0 = _cpu()
        conn.send(Task(f"t{i}"), [data])
        _flush(conn, sock)
        cpu.put(_cpu() - c0)  # type: ignore[attr-defined]
    sock.close()


def over_tcp(key: GroupKey | None, data: bytearray, rounds: int, encrypt: bool = True) -> tuple[float, float, float]:
    """A sender process streams TASK frames to this process over TCP loopback: GB/s of the
    fastest, and the CPU seconds the sender and the receiver spent on it."""
    server = socket.create_server(("127.0.0.1", 0))
    ctx = multiprocessing.get_context("fork")
    cpu_q = ctx.Queue()
    child = ctx.Process(target=_sender, args=(key, server.getsockname(), data, rounds, encrypt, cpu_q))
    child.start()
    sock, _ = server.accept()
    server.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pool = Pool(len(data))
    conn = Connection(Role.RESPONDER, key, Identity("receiver"),
                      limits=Limits(max_body_bytes=1 << 34), allocate=pool, encrypt=encrypt)  # fmt: skip
    end = _Endpoint(conn, sock)
    times: list[float] = []
    cpus: list[float] = []
    try:
        end.wait(lambda e: isinstance(e, HandshakeComplete))
        for _ in range(rounds):
            ask = end.wait(lambda e: isinstance(e, Received))
            assert isinstance(ask, Received) and isinstance(ask.message, Ask)
            t0, c0 = time.perf_counter(), _cpu()
            conn.send(Accept(ask.message.task_id))
            _flush(conn, sock)
            end.wait(lambda e: isinstance(e, Received) and isinstance(e.message, Task))
            times.append(time.perf_counter() - t0)
            cpus.append(_cpu() - c0)
    finally:
        sock.close()
        sent_cpu = [cpu_q.get(timeout=30) for _ in times]
        child.join(30)
        if child.is_alive():
            child.kill()
    best = times.index(min(times))
    return len(data) / times[best] / 1e9, sent_cpu[best], cpus[best]


def tiny(key: GroupKey | None, n: int = 20000, encrypt: bool = True) -> float:
    a, b = pair(key, bytearray, encrypt)

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
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    args = parser.parse_args()
    from report import Figures

    record = Figures("peer_wire", sys.argv[1:])
    print(f"load {os.getloadavg()[0]:.2f} at the start", flush=True)
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
    ring = memoryview(bytearray(SLICE))

    def aes_stream() -> None:
        enc = Cipher(algorithms.AES(mac_key), modes.GCM(nonce)).encryptor()
        view = memoryview(data)
        for i in range(0, size, SLICE):
            enc.update_into(view[i : i + SLICE], ring)
        enc.finalize()

    aes_sliced = size / best(args.rounds, aes_stream) / 1e9
    aes_once = size / best(args.rounds, lambda: aead.encrypt(nonce, data, b"")) / 1e9
    chacha = ChaCha20Poly1305(mac_key)
    chacha_once = size / best(args.rounds, lambda: chacha.encrypt(nonce, data, b"")) / 1e9

    print(f"peer wire benchmark: {args.mib} MiB, best of {args.rounds}, {os.cpu_count()} cores")
    print("\n1. MAC alone over one buffer (GB/s)")
    print(f"   GMAC one call (AESGCM.encrypt)  {gmac_once:7.2f}")
    print(f"   GMAC streamed, 1 MiB slices     {gmac_sliced:7.2f}")
    print(f"   HMAC-SHA256                     {hmac_speed:7.2f}")
    print(f"   (bytearray copy, for scale      {copy_speed:7.2f})")
    print(f"   GMAC / HMAC-SHA256              {gmac_sliced / hmac_speed:7.1f}x")
    print(f"   AES-256-GCM, 1 MiB slices       {aes_sliced:7.2f}")
    print(f"   AES-256-GCM one call (new out)  {aes_once:7.2f}")
    print(f"   ChaCha20-Poly1305 one call      {chacha_once:7.2f}")
    print(f"   AES-256-GCM / ChaCha20-Poly1305 {aes_once / chacha_once:7.1f}x")

    encrypted = in_memory(key, data, args.rounds)
    keyed = in_memory(key, data, args.rounds, encrypt=False)
    plain = in_memory(None, data, args.rounds)
    with_hmac = in_memory(None, data, args.rounds, hmac_too=True)
    print("\n2. codec in memory: encode + receive a TASK with one buffer (GB/s)")
    print(f"   keyed, encrypted (AES-256-GCM)  {encrypted:7.2f}")
    print(f"   keyed, not encrypted (GMAC)     {keyed:7.2f}")
    print(f"   no key (no MAC)                 {plain:7.2f}")
    print(f"   no key + HMAC-SHA256 both sides {with_hmac:7.2f}")
    print(f"   GMAC codec / no MAC             {keyed / plain:7.2f}")
    print(f"   GMAC codec / HMAC codec         {keyed / with_hmac:7.2f}x")

    tcp_encrypted, *cpu_enc = over_tcp(key, data, args.rounds)
    tcp_keyed, *cpu_keyed = over_tcp(key, data, args.rounds, encrypt=False)
    tcp_plain, *cpu_plain = over_tcp(None, data, args.rounds)
    print("\n3. over TCP loopback, sender process -> receiver process (GB/s; CPU ms of the")
    print("   fastest at the sender / the receiver)")
    for label, gbs, (c_send, c_recv) in (("keyed, encrypted (AES-256-GCM) ", tcp_encrypted, cpu_enc),
                                         ("keyed, not encrypted (GMAC)    ", tcp_keyed, cpu_keyed),
                                         ("no key (no MAC)                ", tcp_plain, cpu_plain)):  # fmt: skip
        print(f"   {label} {gbs:7.2f}   {c_send * 1e3:5.0f} / {c_recv * 1e3:3.0f} ms")
    print(f"   keyed / no key                  {tcp_keyed / tcp_plain:7.2f}")
    print(f"   encrypted / cipher alone        {tcp_encrypted / aes_sliced:7.2f}")

    print("\n4. tiny frame (PING): encode + decode (us)")
    tiny_encrypted, tiny_keyed, tiny_plain = tiny(key), tiny(key, encrypt=False), tiny(None)
    print(f"   keyed, encrypted                {tiny_encrypted:7.1f}")
    print(f"   keyed, not encrypted            {tiny_keyed:7.1f}")
    print(f"   no key                          {tiny_plain:7.1f}")
    print(f"\nload {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        mib = f"{args.mib} MiB"
        record.compare("mac", f"A MAC over one {mib} buffer, one core", ("GMAC, 1 MiB slices (the wire's)", gmac_sliced),
                       [("HMAC-SHA256", hmac_speed)], "GB/s", better="higher",
                       variants=[("GMAC, one call", gmac_once)])  # fmt: skip
        record.compare("mac", f"A cipher over one {mib} buffer, one core",
                       ("AES-256-GCM, 1 MiB slices (the wire's)", aes_sliced),
                       [("ChaCha20-Poly1305, one call", chacha_once)], "GB/s", better="higher",
                       variants=[("AES-256-GCM, one call", aes_once)])  # fmt: skip
        record.compare("codec", f"The frame codec in memory: a TASK with one {mib} buffer, encoded and received",
                       ("keyed, encrypted (the default)", encrypted),
                       [("no key, no MAC", plain), ("no key, HMAC-SHA256 on both sides", with_hmac)],
                       "GB/s", better="higher", variants=[("keyed, not encrypted (GMAC)", keyed)])  # fmt: skip
        record.compare("tcp", f"The frame codec over TCP loopback, one process to another, {mib}",
                       ("keyed, encrypted (the default)", tcp_encrypted), [("no key, no MAC", tcp_plain)],
                       "GB/s", better="higher", variants=[("keyed, not encrypted (GMAC)", tcp_keyed)])  # fmt: skip
        record.compare("tiny", "A tiny frame (PING), encoded and decoded", ("keyed, encrypted", tiny_encrypted / 1e6),
                       [("no key", tiny_plain / 1e6)], "s",
                       variants=[("keyed, not encrypted", tiny_keyed / 1e6)])  # fmt: skip
        record.write(args.json)


if __name__ == "__main__":
    main()
