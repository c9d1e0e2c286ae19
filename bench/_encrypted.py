"""The ``crypt`` group of ``bench/peer.py``: 100 MB each way, encrypted and not, beside the cipher;
and the bare TCP echo that ``bench/peer.py`` (``big``) and ``bench/peer_link.py`` time too.

One child (``crypt_big``) times, in the same minute and in turn (best of 3 each):

- each cipher alone on one core, as the wire runs it: AES-256-GCM over 100 MB in 1 MiB
  slices, encrypting into a reused 1 MiB buffer and decrypting in place, GMAC alone (what it
  does with encryption off), and the same for ChaCha20-Poly1305 (streamed as the wire streams
  it, ``elsewhere.peer.ciphers.ChaChaPolyStream``; and in one call on 16 MiB, scaled);
- a bare loopback TCP echo of 100 MB between two Python processes (:class:`Echo`): clear,
  with a GMAC over every byte each way, and encrypted with AES-256-GCM or ChaCha20-Poly1305
  each way (the same slices);
- the peer wire (a bare controller on a daemon: ``peer.WireClient``) echoing a 100 MB
  argument (the task returns it) and taking a 100 MB argument only (``sum``), to a worker
  that encrypts (the default; AES-256-GCM here, and ChaCha20-Poly1305 asked for by the
  controller) and to one started with ``--no-encrypt`` (the controller's connection then
  clear too).

Targets: the encrypted wire within 1.3x of the cipher's own single-core time (one pass over
the bytes per direction: the echo against two passes, the argument against one); the ratio
column is the cipher's time over the wire's, so within 1.3x is a ratio of at least 0.77.

The report also gives the least time the machine's cores can take for an encrypted echo,
whatever the program: each direction's bytes are encrypted once and decrypted once (four passes
in all) and copied through the kernel as in the clear echo (its CPU, both processes, read from
/proc), all of it shared by the cores. Where that least time is over 1.3x the cipher's two
passes, as on a 2-core machine, the loopback target cannot be met by any wire.
"""

from __future__ import annotations

import os
import time
from typing import Any

pc = time.perf_counter
SLICE = 1 << 20
MODES = ("clear", "gmac", "aes", "chacha")
"""What :class:`Echo` does to every byte each way: nothing, a GMAC, AES-256-GCM, ChaCha20-Poly1305."""
_NONCE = b"n" * 12


def _ctx(mode: str, key: bytes, decrypt: bool = False) -> Any:
    """A streaming context of ``mode`` (None for ``clear``); ``gmac`` is an AES-GCM encryptor
    fed associated data only."""
    if mode == "chacha":
        from elsewhere.peer.ciphers import ChaChaPolyStream

        return ChaChaPolyStream(key, _NONCE, decrypt)
    if mode in ("aes", "gmac"):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        c = Cipher(algorithms.AES(key), modes.GCM(_NONCE))
        return c.decryptor() if decrypt and mode == "aes" else c.encryptor()
    return None


def _cipher_times(src: memoryview) -> dict:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    key = os.urandom(32)
    ring = memoryview(bytearray(SLICE))
    work = memoryview(bytearray(src))

    def enc(mode: str) -> float:
        ctx = _ctx(mode, key)
        t0 = pc()
        for i in range(0, len(src), SLICE):
            piece = src[i : i + SLICE]
            ctx.update_into(piece, ring[: len(piece)])
        ctx.finalize()
        return pc() - t0

    def dec(mode: str) -> float:
        ctx = _ctx(mode, key, decrypt=True)
        t0 = pc()
        for i in range(0, len(work), SLICE):
            piece = work[i : i + SLICE]
            ctx.update_into(piece, ring[: len(piece)])  # (an output may not overlap the input)
        return pc() - t0  # (no tag to check: only the pass over the bytes is timed)

    def mac(mode: str) -> float:  # GMAC, or Poly1305 (ChaCha20-Poly1305 of no plaintext)
        ctx = _ctx(mode, key)
        t0 = pc()
        for i in range(0, len(src), SLICE):
            ctx.authenticate_additional_data(src[i : i + SLICE])
        ctx.finalize()
        return pc() - t0

    def chacha_call() -> float:
        part = src[: 16 << 20]
        t0 = pc()
        ChaCha20Poly1305(key).encrypt(_NONCE, part, b"")
        return (pc() - t0) * len(src) / len(part)

    return {"cipher": min(enc("aes") for _ in range(5)), "decipher": min(dec("aes") for _ in range(5)),
            "gmac": min(mac("gmac") for _ in range(5)), "chacha": min(chacha_call() for _ in range(3)),
            "chacha_cipher": min(enc("chacha") for _ in range(3)),
            "chacha_decipher": min(dec("chacha") for _ in range(3)),
            "poly": min(mac("chacha") for _ in range(3))}  # fmt: skip


# -- a bare echo: clear, or a GMAC, AES-GCM or ChaCha20-Poly1305 over every byte each way -----
def _send(s, view, mode: str, key: bytes, ring) -> None:
    ctx = _ctx(mode, key)
    for start in range(0, len(view), SLICE):
        piece = view[start : start + SLICE]
        if mode == "gmac":
            ctx.authenticate_additional_data(piece)
        elif ctx is not None:
            out = ring[: len(piece)]
            ctx.update_into(piece, out)
            piece = out
        s.sendall(piece)
    if ctx is not None:
        ctx.finalize()


def _recv_all(s, view, mode: str, key: bytes, ring) -> bool:
    """Fill ``view`` from ``s`` in reads of at most 1 MiB, each authenticated (and, encrypted,
    read into ``ring`` and decrypted into place: an output may not overlap its input) as it
    lands: False when the socket closed first."""
    pos = 0
    ctx = _ctx(mode, key, decrypt=True)
    while pos < len(view):
        if mode in ("aes", "chacha"):
            n = s.recv_into(ring[: min(SLICE, len(view) - pos)])
            if n:
                ctx.update_into(ring[:n], view[pos : pos + n])
        else:
            n = s.recv_into(view[pos : pos + SLICE])
            if n and mode == "gmac":
                ctx.authenticate_additional_data(view[pos : pos + n])
        if not n:
            return False
        pos += n
    if mode == "gmac":
        ctx.finalize()
    return True


def _partner(port: int, nbytes: int, mode: str, key: bytes) -> None:
    """The other process of :class:`Echo`: receive ``nbytes``, send them back, until the
    socket closes."""
    import socket

    s = socket.create_connection(("127.0.0.1", port))
    view = memoryview(bytearray(nbytes))
    ring, back = memoryview(bytearray(SLICE)), memoryview(bytearray(SLICE))
    while _recv_all(s, view, mode, key, back):
        _send(s, view, mode, key, ring)
    s.close()


class Echo:
    """A 100 MB echo over a bare loopback TCP socket between this process and a partner it
    starts: ``mode`` one of :data:`MODES` (each way, 1 MiB slices, as the wire does). What
    the peer wire is judged against, timed in the same process and minute as it."""

    def __init__(self, src: memoryview, mode: str) -> None:
        import multiprocessing
        import socket

        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.src, self.mode, self.key = src, mode, os.urandom(32)
        self.back = memoryview(bytearray(len(src)))
        self.ring, self.landing = memoryview(bytearray(SLICE)), memoryview(bytearray(SLICE))
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        self.proc = multiprocessing.get_context("spawn").Process(
            target=_partner, args=(lsock.getsockname()[1], len(src), mode, self.key)
        )
        self.proc.start()
        lsock.settimeout(60)
        self.sock, _ = lsock.accept()
        self.sock.settimeout(60)
        lsock.close()
        self.echo()  # both ends' buffers warm

    def echo(self) -> float:
        """Seconds for one echo; the CPU both processes spent on it is left in ``self.cpu``."""
        from _common import proc_cpu_s

        c0 = time.process_time() + proc_cpu_s(self.proc.pid)
        t0 = pc()
        _send(self.sock, self.src, self.mode, self.key, self.ring)
        if not _recv_all(self.sock, self.back, self.mode, self.key, self.landing):
            raise RuntimeError("the echo partner went away")
        t = pc() - t0
        self.cpu = time.process_time() + proc_cpu_s(self.proc.pid) - c0
        return t

    def close(self) -> None:
        self.sock.close()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def m_crypt_big(
    port: int, key: str, clear_port: int, clear_key: str, mb: int, chacha_port: int
) -> dict:
    """``port``, ``chacha_port``: two workers of group ``key`` (one slot each: a controller's
    next task holds the slot), the second used with ChaCha20-Poly1305; ``clear_port``: a worker
    of group ``clear_key`` started with ``--no-encrypt``."""
    import pickle

    import numpy as np

    import peer
    from elsewhere.peer.ciphers import CHACHA

    a = np.random.default_rng(1).random(mb * (1 << 20) // 8)
    src = memoryview(a).cast("B")
    out = _cipher_times(src)
    clients = {"enc": peer.WireClient(port, key), "chacha": peer.WireClient(chacha_port, key, ciphers=(CHACHA,)),
               "clear": peer.WireClient(clear_port, clear_key, encrypt=False)}  # fmt: skip
    for c in clients.values():
        c.run(peer.noop, 1)
    assert clients["chacha"].conn.cipher == CHACHA
    echoes = {mode: Echo(src, mode) for mode in MODES}
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # both ends' CPU seconds in the bare echoes (medians kept)
    for _ in range(3):
        for mode, e in echoes.items():
            times.setdefault(f"bare_{mode}", []).append(e.echo())
            cpu.setdefault(f"bare_{mode}_cpu", []).append(e.cpu)
        for name, c in clients.items():
            t0 = pc()
            ev = c.run(peer.ident, a)
            b = pickle.loads(
                bytes(ev.buffers[0][: ev.message.info["groups"][0][0]]), buffers=ev.buffers[2:]
            )[0]
            times.setdefault(f"wire_{name}", []).append(pc() - t0)
            assert b.shape == a.shape and b[7] == a[7]
            del b
            for buf in ev.buffers:
                c.buffers.free(buf)
            del ev
            t0 = pc()
            c.run(peer.arr_sum, a)
            times.setdefault(f"arg_{name}", []).append(pc() - t0)
    for e in echoes.values():
        e.close()
    return {**out, **{k: min(v) for k, v in times.items()}, **{k: sorted(v)[len(v) // 2] for k, v in cpu.items()},
            "bytes": len(src), "cores": os.cpu_count() or 1}  # fmt: skip


CHILDREN = {"crypt_big": m_crypt_big}


def least_time(m: Any) -> float:
    """The least time the measuring machine's cores can take for the encrypted echo, from the
    crypt child's figures (``m(field)``: their median): each direction encrypted once and
    decrypted once, and copied as the clear echo copies it (its CPU, both processes), over the
    cores (nan without those figures)."""
    return (2 * (m("cipher") + m("decipher")) + m("bare_clear_cpu")) / m("cores")


def report(got: dict, med, fmt_time, verdict) -> list[list[str]]:
    """The group's rows for ``peer.report``'s table (``med(name, field)``: the median over rounds)."""
    if not any(r for r in got.get("crypt_big", [])):
        return []

    def m(field: str) -> float:
        return med("crypt_big", field)

    nbytes = m("bytes")

    def rate(t: float, n: float = 1.0) -> str:
        return f"{fmt_time(t)} ({n * nbytes / t / 1e9:.2f} GB/s)" if t == t and t else "n/a"

    cipher, decipher = m("cipher"), m("decipher")
    one = max(cipher, decipher)  # the slower of the two ends sets the pace of one direction
    chacha_one = max(m("chacha_cipher"), m("chacha_decipher"))
    rows = [["crypt", "AES-256-GCM alone, one core: encrypt 100 MB (1 MiB slices)", rate(cipher), "", "", ""],
            ["crypt", "  decrypt in place", rate(decipher), "", "", "info"],
            ["crypt", "  GMAC alone (encryption off)", rate(m("gmac")), "", "", "info"],
            ["crypt", "ChaCha20-Poly1305 alone, one core: encrypt 100 MB (1 MiB slices)", rate(m("chacha_cipher")),
             f"{cipher / m('chacha_cipher'):.2f}x", "", "info"],
            ["crypt", "  decrypt in place", rate(m("chacha_decipher")), "", "", "info"],
            ["crypt", "  in one call (16 MB, scaled)", rate(m("chacha")), "", "", "info"]]  # fmt: skip
    for mode, label in (("clear", "bare TCP echo"), ("gmac", "bare TCP echo + GMAC"),
                        ("aes", "bare TCP echo + AES-GCM"), ("chacha", "bare TCP echo + ChaCha20-Poly1305")):  # fmt: skip
        rows.append(
            ["crypt", f"{label}, 100 MB each way", rate(m(f"bare_{mode}"), 2), "", "", "info"]
        )
    # ratio: the cipher's time over the wire's (1: the wire as fast as the cipher alone);
    # within 1.3x of the cipher's time is a ratio of at least 1 / 1.3
    enc, clear, chacha = m("wire_enc"), m("wire_clear"), m("wire_chacha")
    r = 2 * one / enc
    rows.append(["crypt", "peer wire, encrypted: 100 MB argument, 100 MB result", rate(enc, 2),
                 f"{r:.2f}x", ">= 0.77x", verdict(r, 1 / 1.3)])  # fmt: skip
    # The least time this machine can take for an encrypted echo: each direction is encrypted
    # once and decrypted once (four passes), and its bytes are copied as the clear echo copies
    # them (that echo's CPU, both ends), all on these cores. Its ratio is the best the target's
    # ratio can be here, whatever the wire does.
    cores = m("cores")
    floor = least_time(m)
    if floor == floor:
        rows.append(["crypt", f"  the least time {cores:.0f} cores take for it (4 cipher passes + the clear echo's CPU)",
                     fmt_time(floor), f"{2 * one / floor:.2f}x", "", "info"])  # fmt: skip
        rows.append(["crypt", "  the encrypted wire against that least time", fmt_time(enc), f"{floor / enc:.2f}x",
                     "", "info"])  # fmt: skip
    rows.append(
        [
            "crypt",
            "peer wire, --no-encrypt: the same",
            rate(clear, 2),
            f"{clear / enc:.2f}x",
            "",
            "info",
        ]
    )
    rows.append(["crypt", "  the bare AES-GCM echo against the encrypted wire", fmt_time(m("bare_aes")),
                 f"{m('bare_aes') / enc:.2f}x", "", "info"])  # fmt: skip
    r = 2 * chacha_one / chacha
    rows.append(["crypt", "peer wire, ChaCha20-Poly1305: the same", rate(chacha, 2), f"{r:.2f}x", ">= 0.77x",
                 verdict(r, 1 / 1.3)])  # fmt: skip
    rows.append(["crypt", "  the bare ChaCha20-Poly1305 echo against it", fmt_time(m("bare_chacha")),
                 f"{m('bare_chacha') / chacha:.2f}x", "", "info"])  # fmt: skip
    arg_enc, arg_clear = m("arg_enc"), m("arg_clear")
    r = one / arg_enc
    rows.append(["crypt", "peer wire, encrypted: 100 MB argument only (sum)", rate(arg_enc), f"{r:.2f}x",
                 ">= 0.77x", verdict(r, 1 / 1.3)])  # fmt: skip
    rows.append(["crypt", "peer wire, --no-encrypt: the same", rate(arg_clear), f"{arg_clear / arg_enc:.2f}x",
                 "", "info"])  # fmt: skip
    rows.append(["crypt", "peer wire, ChaCha20-Poly1305: the same", rate(m("arg_chacha")),
                 f"{chacha_one / m('arg_chacha'):.2f}x", ">= 0.77x", verdict(chacha_one / m("arg_chacha"), 1 / 1.3)])  # fmt: skip
    return rows


# -- the choice of cipher: each one alone, with and without the CPU's AES instructions -------
_NO_AES_NI = "~0x200000200000000"
"""``OPENSSL_ia32cap`` that hides AES-NI and PCLMULQDQ from OpenSSL (x86): how AES-GCM runs on
a CPU without them, measured on this one."""


def _cipher_table(mib: int, rounds: int) -> dict[str, float]:
    """GB/s of each cipher as the wire runs it (1 MiB slices, best of ``rounds``)."""
    src = memoryview(bytearray(os.urandom(1 << 20)) * mib)
    t = _cipher_times_rounds(src, rounds)
    return {k: len(src) / v / 1e9 for k, v in t.items()}


def _cipher_times_rounds(src: memoryview, rounds: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(rounds):  # rounds of every cipher in turn, so that a busy minute hits them all
        for k, v in _cipher_times(src).items():
            best[k] = min(v, best.get(k, v))
    return best


def main(argv: list[str]) -> int:
    """``python bench/_encrypted.py [--mib 100] [--rounds 5]``: the throughput of each cipher
    on one core, as the wire runs it, with this CPU's AES instructions and without them."""
    import argparse
    import json
    import subprocess
    import sys

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--mib", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # (the child's answer)
    args = p.parse_args(argv)
    if args.json:
        print(json.dumps(_cipher_table(args.mib, args.rounds)))
        return 0
    from elsewhere.peer.ciphers import aes_in_hardware, offered_ciphers

    cmd = [sys.executable, __file__, "--json", "--mib", str(args.mib), "--rounds", str(args.rounds)]
    runs = {"with": {}, "without": {"OPENSSL_ia32cap": _NO_AES_NI}}
    got = {}
    for name, extra in runs.items():
        out = subprocess.run(
            cmd, env={**os.environ, **extra}, capture_output=True, text=True, check=True
        )
        got[name] = json.loads(out.stdout)
    print(
        f"one core, {args.mib} MiB in 1 MiB slices, best of {args.rounds} (GB/s); load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"this CPU has AES instructions: {aes_in_hardware()}; offered here: {', '.join(offered_ciphers())}"
    )
    print(f"{'':44} {'AES instructions':>17} {'hidden':>8}")
    for key, label in (("cipher", "AES-256-GCM encrypt"), ("decipher", "AES-256-GCM decrypt in place"),
                       ("gmac", "GMAC alone (encryption off)"), ("chacha_cipher", "ChaCha20-Poly1305 encrypt"),
                       ("chacha_decipher", "ChaCha20-Poly1305 decrypt in place"),
                       ("poly", "Poly1305 alone (encryption off)"),
                       ("chacha", "ChaCha20-Poly1305 in one call")):  # fmt: skip
        print(f"{label:44} {got['with'][key]:17.2f} {got['without'][key]:8.2f}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
