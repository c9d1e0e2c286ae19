"""100 MB each way over a shaped link: the peer wire encrypted and not, beside a bare socket.

    .venv/bin/python bench/peer_link.py [--rate 1gbit] [--mb 100] [--rounds 3] [--json FILE]      (as root)

Two network namespaces (``ewlink-<pid>-a``, ``-b``) joined by one veth pair, each end
shaped by ``tc`` (tbf at ``--rate``): nothing is sent outside them, and they are removed at
the end. In ``a`` run two ``elsewhere peer worker`` daemons of one group, one encrypting (the
default) and one started with ``--no-encrypt``, and a bare echo partner. In ``b`` one process
times, in turn (best of ``--rounds`` each): a bare TCP echo of 100 MB (clear, and AES-256-GCM
over every byte each way, as ``_encrypted.py`` does), and the peer wire (``peer.WireClient``,
a bare controller) echoing a 100 MB argument to each worker (the task returns it).
Target: the encrypted wire at >= 0.95x the bare socket's speed on a 1 Gbit/s link.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
A_ADDR, B_ADDR = "10.79.0.1", "10.79.0.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _netns(prefix: str, rate: str) -> tuple[str, str]:
    a, b = f"{prefix}-a", f"{prefix}-b"
    _ip("netns", "add", a)
    _ip("netns", "add", b)
    _ip("-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b)
    for ns, addr in ((a, A_ADDR), (b, B_ADDR)):
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                        "rate", rate, "burst", "1mb", "latency", "50ms"], check=True, timeout=10)  # fmt: skip
    return a, b


def _in(ns: str, *cmd: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ip", "netns", "exec", ns, *cmd], start_new_session=True, **kw)  # type: ignore[call-overload]


def _partner(port: int) -> None:
    """The bare echo's other end (in namespace a): for each connection (a thread each), echo
    ``nbytes`` (its first 9 bytes say the mode and the size) until it closes."""
    import threading

    import _encrypted

    def serve(s: socket.socket) -> None:
        hello = s.recv(9, socket.MSG_WAITALL)
        mode = {b"c": "clear", b"a": "aes"}[hello[:1]]
        nbytes = int.from_bytes(hello[1:], "big")
        key = b"k" * 32
        view = memoryview(bytearray(nbytes))
        ring, landing = memoryview(bytearray(_encrypted.SLICE)), memoryview(bytearray(_encrypted.SLICE))
        while _encrypted._recv_all(s, view, mode, key, landing):
            _encrypted._send(s, view, mode, key, ring)
        s.close()

    server = socket.create_server((A_ADDR, port))
    while True:  # a connection each for the clear and the encrypted echo, used in turn
        threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()


def _measure(params: dict) -> dict:
    """In namespace b: the bare echoes and the wire's, in turn; best of ``rounds`` each."""
    import pickle

    import _encrypted
    import numpy as np

    import peer

    a = np.random.default_rng(1).random(params["mb"] * (1 << 20) // 8)
    src = memoryview(a).cast("B")
    key = b"k" * 32
    ring, landing = memoryview(bytearray(_encrypted.SLICE)), memoryview(bytearray(_encrypted.SLICE))
    back = memoryview(bytearray(len(src)))
    bare = {}
    for mode, tag in (("clear", b"c"), ("aes", b"a")):
        s = socket.create_connection((A_ADDR, params["echo_port"]))
        s.sendall(tag + len(src).to_bytes(8, "big"))
        bare[mode] = s
    clients = {"enc": peer.WireClient(params["port"], params["key"], host=A_ADDR),
               "clear": peer.WireClient(params["clear_port"], params["key"], encrypt=False, host=A_ADDR)}  # fmt: skip
    for c in clients.values():
        c.run(peer.noop, 1)
    times: dict[str, list[float]] = {}
    for _ in range(params["rounds"]):
        for mode, s in bare.items():
            t0 = time.perf_counter()
            _encrypted._send(s, src, mode, key, ring)
            assert _encrypted._recv_all(s, back, mode, key, landing)
            times.setdefault(f"bare_{mode}", []).append(time.perf_counter() - t0)
        for name, c in clients.items():
            t0 = time.perf_counter()
            ev = c.run(peer.ident, a)
            b = pickle.loads(bytes(ev.buffers[0][: ev.message.info["groups"][0][0]]), buffers=ev.buffers[2:])[0]
            times.setdefault(f"wire_{name}", []).append(time.perf_counter() - t0)
            assert b.shape == a.shape and b[7] == a[7]
            del b
            for buf in ev.buffers:
                c.buffers.free(buf)
            del ev
    return {k: min(v) for k, v in times.items()}


def main(argv: list[str]) -> int:
    import argparse

    if argv[:1] == ["--partner"]:
        _partner(int(argv[1]))
        return 0
    if argv[:1] == ["--measure"]:
        print("RESULT " + json.dumps(_measure(json.loads(argv[1]))), flush=True)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", default="1gbit", help="tc rate of each end of the link (default 1gbit)")
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    args = p.parse_args(argv)
    from report import Figures

    record = Figures("peer_link", argv)
    if os.geteuid() != 0:
        print("bench/peer_link.py needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    from _common import venv_python

    from elsewhere.peer.keys import write_key

    py = venv_python()
    prefix = f"ewlink-{os.getpid()}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ns_a, ns_b = _netns(prefix, args.rate)
        with tempfile.TemporaryDirectory(prefix="ewlink-") as tmp:
            key = str(write_key("link", os.path.join(tmp, "link.key")))
            ports = []
            for i, extra in enumerate(([], ["--no-encrypt"])):
                stats = os.path.join(tmp, f"w{i}.json")
                procs.append(_in(ns_a, py, "-m", "elsewhere.api.peer_cli", "peer", "worker", "--key", key,
                                 "--interface", A_ADDR, "--slots", "1", "--log-level", "warning",
                                 "--multicast-group", "none", "--peer", B_ADDR, "--stats-file", stats, *extra,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
                deadline = time.monotonic() + 30
                while True:
                    try:
                        ports.append(json.loads(Path(stats).read_text())["port"])
                        break
                    except (OSError, ValueError, KeyError):
                        if time.monotonic() > deadline:
                            raise RuntimeError("a worker did not start") from None
                        time.sleep(0.05)
            echo_port = 7999
            procs.append(_in(ns_a, py, str(Path(__file__).resolve()), "--partner", str(echo_port)))
            time.sleep(1.0)
            params = {"port": ports[0], "clear_port": ports[1], "key": key, "echo_port": echo_port,
                      "mb": args.mb, "rounds": args.rounds}  # fmt: skip
            out = subprocess.run(["ip", "netns", "exec", ns_b, py, str(Path(__file__).resolve()), "--measure",
                                  json.dumps(params)], capture_output=True, text=True, timeout=900)  # fmt: skip
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(out.stdout + out.stderr, file=sys.stderr)
                return 1
            r = json.loads(line[7:])
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in (f"{prefix}-a", f"{prefix}-b"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    nbytes = 2 * args.mb * (1 << 20)
    print(f"# bench/peer_link.py: {args.mb} MB each way over a veth pair shaped to {args.rate} each way, "
          f"best of {args.rounds}; load {os.getloadavg()[0]:.2f}\n")
    bare = r["bare_clear"]
    for name, label in (("bare_clear", "bare TCP echo"), ("bare_aes", "bare TCP echo + AES-256-GCM"),
                        ("wire_clear", "peer wire, --no-encrypt"), ("wire_enc", "peer wire, encrypted")):  # fmt: skip
        t = r[name]
        verdict = f"  (target >= 0.95x: {'PASS' if bare / t >= 0.95 else 'FAIL'})" if name == "wire_enc" else ""
        print(f"  {label:32s} {t:6.2f} s  {nbytes / t / 1e6:7.1f} MB/s  {bare / t:5.2f}x the bare echo{verdict}")
    if args.json:
        record.compare("link", f"{args.mb} MB each way over a link shaped to {args.rate} (two network namespaces)",
                       ("peer wire, encrypted", r["wire_enc"]),
                       [("bare TCP echo, clear", r["bare_clear"]), ("bare TCP echo + AES-256-GCM", r["bare_aes"])],
                       "s", variants=[("peer wire, --no-encrypt", r["wire_clear"])])  # fmt: skip
        record.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
