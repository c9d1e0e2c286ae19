"""Encryption against real processes: what a capture of a real job on loopback shows, and
ends that disagree about encryption.

The capture is an ``AF_PACKET`` socket on ``lo`` (what ``tcpdump -i lo`` reads; it needs root
or CAP_NET_RAW, else these tests skip): every TCP stream is put back together in sequence
order, so that a marker cut between two segments is still found, and every UDP datagram is
kept. The same job with encryption off at both ends proves the capture sees the markers.
"""

from __future__ import annotations

import secrets
import socket
import struct
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from peer_procs import Workers, free_port

import elsewhere as ew
from elsewhere.peer.keys import write_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4  # (each loopback packet is seen going out and coming in: keep one)


class LoopbackCapture(threading.Thread):
    """Every TCP stream and UDP datagram on ``lo`` while it runs (a context manager)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        except (PermissionError, AttributeError, OSError) as exc:
            pytest.skip(f"cannot capture on lo (needs root or CAP_NET_RAW): {exc}")
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.05)
        self.segments: dict[tuple[int, int], dict[int, bytes]] = defaultdict(dict)
        self.datagrams: list[bytes] = []
        self.stopping = False

    def __enter__(self) -> LoopbackCapture:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # what is still in flight
        self.stopping = True
        self.join(5)
        self.sock.close()

    def run(self) -> None:
        while not self.stopping:
            try:
                frame, addr = self.sock.recvfrom(1 << 18)
            except TimeoutError:
                continue
            if addr[2] == _PACKET_OUTGOING or len(frame) < 34 or frame[12:14] != b"\x08\x00":
                continue
            ip = frame[14:]
            ihl = (ip[0] & 0x0F) * 4
            total = struct.unpack_from(">H", ip, 2)[0]
            proto, payload = ip[9], ip[ihl:total]
            if proto == 6:  # TCP
                sport, dport, seq = struct.unpack_from(">HHI", payload)
                data = payload[(payload[12] >> 4) * 4 :]
                if data:
                    self.segments[(sport, dport)][seq] = data
            elif proto == 17:  # UDP
                self.datagrams.append(payload[8:])

    def streams(self) -> list[bytes]:
        """Each TCP stream's bytes in order (retransmissions overlap harmlessly)."""
        out = []
        for segs in self.segments.values():
            first = min(segs)  # (a test's streams are far shorter than the 4 GiB sequence wrap)
            buf = bytearray()
            for seq in sorted(segs):
                at = seq - first
                data = segs[seq]
                if at > len(buf):
                    buf += bytes(at - len(buf))
                buf[at : at + len(data)] = data
            out.append(bytes(buf))
        return out

    def everything(self) -> bytes:
        return b"\0".join([*self.streams(), *self.datagrams])


def secret_task(text: str) -> str:
    print("LOG-" + text[4:])  # the task's output: its log travels back with the result
    return text.replace("ARG-", "RES-")  # the result: not a substring of anything sent


def _run_job(tmp: Path, encrypt: bool) -> tuple[bytes, dict[str, bytes]]:
    key = write_key("lab", tmp / f"lab-{encrypt}.key")
    port = free_port()
    tag = secrets.token_hex(8)
    markers = {"argument": f"ARG-{tag}", "result": f"RES-{tag}", "log": f"LOG-{tag}",
               "job name": f"job-{tag}"}  # fmt: skip
    cluster = ew.peers("lab", key=key, port=port, interface="127.0.0.1", encrypt=encrypt, detach=False)
    with Workers(tmp, 1, port=port, key=key, args=[] if encrypt else ["--no-encrypt"]) as workers:
        with LoopbackCapture() as capture:
            job = ew.submit(secret_task, [markers["argument"]], on=cluster, name=markers["job name"])
            job.wait(timeout=60, progress=False)
            assert job.get() == [markers["result"]]
            assert markers["log"] in job.log(0)
            time.sleep(1.5)  # announcements of the worker while it ran, and after
        assert "encrypted" in workers[0].log() if encrypt else "clear text" in workers[0].log()
    return capture.everything(), {name: m.encode() for name, m in markers.items()}


def test_a_capture_of_an_encrypted_job_holds_nothing_of_it(tmp_path: Path) -> None:
    seen, markers = _run_job(tmp_path, encrypt=True)
    assert len(seen) > 2000  # the job's frames and announcements were captured
    found = [name for name, m in markers.items() if m in seen]
    assert found == [], f"readable on the wire: {found}"


def test_the_capture_reads_a_job_whose_two_ends_turned_encryption_off(tmp_path: Path) -> None:
    seen, markers = _run_job(tmp_path, encrypt=False)
    found = [name for name, m in markers.items() if m in seen]
    assert found == list(markers), f"only {found} found: the capture misses what it should see"


@pytest.mark.parametrize("worker_encrypts", [True, False])
def test_ends_that_disagree_run_nothing_and_the_controller_says_why(tmp_path: Path,
                                                                    worker_encrypts: bool) -> None:  # fmt: skip
    key = write_key("lab", tmp_path / "lab.key")
    port = free_port()
    cluster = ew.peers("lab", key=key, port=port, interface="127.0.0.1", encrypt=not worker_encrypts,
                       detach=False)  # fmt: skip
    with Workers(tmp_path, 1, port=port, key=key, args=[] if worker_encrypts else ["--no-encrypt"]) as w:
        job = ew.submit(abs, [-1], on=cluster)
        try:
            deadline = time.monotonic() + 20
            while "encrypt" not in str(job.check()) and time.monotonic() < deadline:
                time.sleep(0.1)
            note = str(job.check())
            assert job.state == "queued"
            if worker_encrypts:
                assert "it encrypts" in note and "encrypt=False" in note and "--no-encrypt" in note
            else:
                assert "started with --no-encrypt" in note and "encrypt=False" in note
            assert w[0].stats().get("tasks", 0) == 0
        finally:
            job.cancel()


def test_peer_list_shows_whether_each_worker_encrypts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from elsewhere.api.peer_cli import main as peer_main
    from elsewhere.peer.ciphers import offered_ciphers

    key = write_key("lab", tmp_path / "lab.key")
    port = free_port()
    with Workers(tmp_path, 2, port=port, key=key, per_worker=[[], ["--no-encrypt"]]):
        where = ["--key", str(key), "--port", str(port), "--interface", "127.0.0.1", "--wait", "1.5"]
        assert peer_main(["peer", "list", *where, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        cipher = offered_ciphers()[0]  # (shown: the cipher a connection from here would use)
        assert sorted((r["encrypt"], r["wire"]) for r in rows) == [(False, "clear (--no-encrypt)"),
                                                                 (True, f"encrypted ({cipher})")]  # fmt: skip
        assert peer_main(["peer", "list", *where]) == 0
        table = capsys.readouterr().out
        assert "wire" in table.splitlines()[0] and "clear (--no-encrypt)" in table and "encrypted" in table
