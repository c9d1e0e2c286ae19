"""The ``crypt`` group of ``bench/peer.py``: 100 MB each way, encrypted and not, beside the cipher.

One child (``crypt_big``) times, in the same minute and in turn (best of 3 each):

- the cipher alone on one core: AES-256-GCM over 100 MB in 1 MiB slices, encrypting into a
  reused 1 MiB buffer and decrypting in place (what the wire does), and GMAC alone (what it
  does with encryption off); ChaCha20-Poly1305 (one call on 16 MiB, scaled) for the choice;
- a bare loopback TCP echo of 100 MB between two Python processes: clear, with a GMAC over
  every byte each way, and encrypted with AES-256-GCM each way (the same slices);
- the peer wire (a bare controller on a daemon: ``peer.WireClient``) echoing a 100 MB
  argument (the task returns it) and taking a 100 MB argument only (``sum``), to a worker
  that encrypts (the default) and to one started with ``--no-encrypt`` (the controller's
  connection then clear too).

Targets: the encrypted wire within 1.3x of the cipher's own single-core time (one pass over
the bytes per direction: the echo against two passes, the argument against one); the ratio
column is the cipher's time over the wire's, so within 1.3x is a ratio of at least 0.77.
"""

from __future__ import annotations

import os
import time

pc = time.perf_counter
SLICE = 1 << 20


def _aes(key: bytes, nonce: bytes, decrypt: bool = False):
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    c = Cipher(algorithms.AES(key), modes.GCM(nonce))
    return c.decryptor() if decrypt else c.encryptor()


def _cipher_times(src: memoryview) -> dict:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    key, nonce = os.urandom(32), os.urandom(12)
    ring = memoryview(bytearray(SLICE))
    work = memoryview(bytearray(src))

    def enc() -> float:
        ctx = _aes(key, nonce)
        t0 = pc()
        for i in range(0, len(src), SLICE):
            piece = src[i : i + SLICE]
            ctx.update_into(piece, ring[: len(piece)])
        ctx.finalize()
        return pc() - t0

    def dec() -> float:
        ctx = _aes(key, nonce, decrypt=True)
        t0 = pc()
        for i in range(0, len(work), SLICE):
            piece = work[i : i + SLICE]
            ctx.update_into(piece, piece)
        return pc() - t0  # (no tag to check: only the pass over the bytes is timed)

    def gmac() -> float:
        ctx = _aes(key, nonce)
        t0 = pc()
        for i in range(0, len(src), SLICE):
            ctx.authenticate_additional_data(src[i : i + SLICE])
        ctx.finalize()
        return pc() - t0

    def chacha() -> float:
        part = src[: 16 << 20]
        t0 = pc()
        ChaCha20Poly1305(key).encrypt(nonce, part, b"")
        return (pc() - t0) * len(src) / len(part)

    return {"cipher": min(enc() for _ in range(5)), "decipher": min(dec() for _ in range(5)),
            "gmac": min(gmac() for _ in range(5)), "chacha": min(chacha() for _ in range(3))}  # fmt: skip


# -- a bare echo: clear, GMAC or AES-GCM over every byte each way ---------------------------
def _send(s, view, mode: str, key: bytes, ring) -> None:
    ctx = _aes(key, b"n" * 12) if mode != "clear" else None
    for start in range(0, len(view), SLICE):
        piece = view[start : start + SLICE]
        if mode == "gmac":
            ctx.authenticate_additional_data(piece)
        elif mode == "aes":
            out = ring[: len(piece)]
            ctx.update_into(piece, out)
            piece = out
        s.sendall(piece)
    if ctx is not None:
        ctx.finalize()


def _recv_all(s, view, mode: str, key: bytes) -> bool:
    pos = 0
    ctx = _aes(key, b"n" * 12, decrypt=mode == "aes") if mode != "clear" else None
    while pos < len(view):
        n = s.recv_into(view[pos : pos + SLICE])
        if not n:
            return False
        if mode == "gmac":
            ctx.authenticate_additional_data(view[pos : pos + n])
        elif mode == "aes":
            ctx.update_into(view[pos : pos + n], view[pos : pos + n])
        pos += n
    return True


def _partner(port: int, nbytes: int, mode: str, key: bytes) -> None:
    import socket

    s = socket.create_connection(("127.0.0.1", port))
    view = memoryview(bytearray(nbytes))
    ring = memoryview(bytearray(SLICE))
    while _recv_all(s, view, mode, key):
        _send(s, view, mode, key, ring)
    s.close()


class Echo:
    """A 100 MB echo over a bare loopback TCP socket between this process and a partner it
    starts: ``mode`` clear, ``gmac`` (a GMAC over every byte each way) or ``aes`` (AES-256-GCM
    each way, 1 MiB slices, as the wire does)."""

    def __init__(self, src: memoryview, mode: str) -> None:
        import multiprocessing
        import socket

        self.src, self.mode, self.key = src, mode, os.urandom(32)
        self.back = memoryview(bytearray(len(src)))
        self.ring = memoryview(bytearray(SLICE))
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        self.proc = multiprocessing.get_context("spawn").Process(
            target=_partner, args=(lsock.getsockname()[1], len(src), mode, self.key))
        self.proc.start()
        lsock.settimeout(60)
        self.sock, _ = lsock.accept()
        self.sock.settimeout(60)
        lsock.close()
        self.echo()

    def echo(self) -> float:
        t0 = pc()
        _send(self.sock, self.src, self.mode, self.key, self.ring)
        if not _recv_all(self.sock, self.back, self.mode, self.key):
            raise RuntimeError("the echo partner went away")
        return pc() - t0

    def close(self) -> None:
        self.sock.close()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def m_crypt_big(port: int, key: str, clear_port: int, clear_key: str, mb: int) -> dict:
    import pickle

    import numpy as np

    import peer

    a = np.random.default_rng(1).random(mb * (1 << 20) // 8)
    src = memoryview(a).cast("B")
    out = _cipher_times(src)
    clients = {"enc": peer.WireClient(port, key), "clear": peer.WireClient(clear_port, clear_key, encrypt=False)}
    for c in clients.values():
        c.run(peer.noop, 1)
    echoes = {mode: Echo(src, mode) for mode in ("clear", "gmac", "aes")}
    times: dict[str, list[float]] = {}
    for _ in range(3):
        for mode, e in echoes.items():
            times.setdefault(f"bare_{mode}", []).append(e.echo())
        for name, c in clients.items():
            t0 = pc()
            ev = c.run(peer.ident, a)
            b = pickle.loads(bytes(ev.buffers[0][: ev.message.info["groups"][0][0]]), buffers=ev.buffers[2:])[0]
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
    return {**out, **{k: min(v) for k, v in times.items()}, "bytes": len(src)}


CHILDREN = {"crypt_big": m_crypt_big}


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
    rows = [["crypt", "AES-256-GCM alone, one core: encrypt 100 MB (1 MiB slices)", rate(cipher), "", "", ""],
            ["crypt", "  decrypt in place", rate(decipher), "", "", "info"],
            ["crypt", "  GMAC alone (encryption off)", rate(m("gmac")), "", "", "info"],
            ["crypt", "  ChaCha20-Poly1305 alone (one call on 16 MB, scaled)", rate(m("chacha")),
             f"{cipher / m('chacha'):.2f}x", "", "info"]]  # fmt: skip
    for mode, label in (("clear", "bare TCP echo"), ("gmac", "bare TCP echo + GMAC"), ("aes", "bare TCP echo + AES-GCM")):
        rows.append(["crypt", f"{label}, 100 MB each way", rate(m(f"bare_{mode}"), 2), "", "", "info"])
    # ratio: the cipher's time over the wire's (1: the wire as fast as the cipher alone);
    # within 1.3x of the cipher's time is a ratio of at least 1 / 1.3
    enc, clear = m("wire_enc"), m("wire_clear")
    r = 2 * one / enc
    rows.append(["crypt", "peer wire, encrypted: 100 MB argument, 100 MB result", rate(enc, 2),
                 f"{r:.2f}x", ">= 0.77x", verdict(r, 1 / 1.3)])  # fmt: skip
    rows.append(["crypt", "peer wire, --no-encrypt: the same", rate(clear, 2), f"{clear / enc:.2f}x", "", "info"])
    rows.append(["crypt", "  the bare AES-GCM echo against the encrypted wire", fmt_time(m("bare_aes")),
                 f"{m('bare_aes') / enc:.2f}x", "", "info"])  # fmt: skip
    arg_enc, arg_clear = m("arg_enc"), m("arg_clear")
    r = one / arg_enc
    rows.append(["crypt", "peer wire, encrypted: 100 MB argument only (sum)", rate(arg_enc), f"{r:.2f}x",
                 ">= 0.77x", verdict(r, 1 / 1.3)])  # fmt: skip
    rows.append(["crypt", "peer wire, --no-encrypt: the same", rate(arg_clear), f"{arg_clear / arg_enc:.2f}x",
                 "", "info"])  # fmt: skip
    return rows
