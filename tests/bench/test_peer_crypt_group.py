"""The encrypted wire's benchmark measures: ``bench/peer.py --quick --only crypt`` gives every
figure of its group. Its bare echo once decrypted in place, which ``cryptography`` 51 refuses:
the group failed, measured nothing, and the wire's own slowdown with that version went unseen.
No figure is judged here (the machine is shared); only that each was measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = pytest.mark.timeout(300)

SYSTEMS = {
    "peer wire, encrypted",
    "peer wire, --no-encrypt",
    "peer wire, ChaCha20-Poly1305",
    "bare TCP echo, clear",
    "bare TCP echo + AES-256-GCM",
    "bare TCP echo + ChaCha20-Poly1305",
    "AES-256-GCM alone, one core",
    "AES-256-GCM alone, one core, both ways",
    "ChaCha20-Poly1305 alone, one core, both ways",
}


def test_the_peer_benchmark_measures_every_figure_of_its_crypt_group(tmp_path: Path) -> None:
    out = tmp_path / "crypt.json"
    run = subprocess.run(
        [sys.executable, str(BENCH / "peer.py"), "--quick", "--only", "crypt", "--json", str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "failed" not in said, said[-3000:]
    figures = json.loads(out.read_text())["figures"]
    assert {f["group"] for f in figures} == {"crypt"}
    assert {f["system"] for f in figures} >= SYSTEMS, said[-3000:]
    assert all(f["value"] > 0 for f in figures)
