"""benchfigures.py and the peers view's wire column: where the benchmark figures are found, which
figure of a kind is shown, and how a peer's encryption is named. Pure: files in tmp_path only."""

from __future__ import annotations

import json
from pathlib import Path

from elsewhere.api.web import benchfigures as B
from elsewhere.api.web.peers import CIPHER_NAMES, wire_of
from elsewhere.peer import ciphers

FIXTURE = Path(__file__).with_name("bench_figures.json")


def test_the_figures_are_found_by_option_then_environment_then_in_the_checkout(tmp_path):
    assert B.locate(tmp_path / "a", {B.ENV: str(tmp_path / "b")})[:2] == (tmp_path / "a", "option")
    assert B.locate(None, {B.ENV: str(tmp_path / "b")})[:2] == (tmp_path / "b", "environment")
    folder, how, _ = B.locate(None, {})
    # these tests run from a source checkout, whose bench/figures the view finds by itself
    assert how == "checkout" and folder == Path(__file__).resolve().parents[2] / "bench" / "figures"


def test_the_newest_figure_of_each_kind_is_shown_and_other_files_are_named(tmp_path):
    doc = json.loads(FIXTURE.read_text())
    (tmp_path / "old.json").write_text(json.dumps(doc))
    newer = {**doc, "date": "2026-12-06", "command": "bench/local.py --only cold10k",
             "figures": [{**doc["figures"][0], "value": 0.1, "date": "2026-12-06"}]}  # fmt: skip
    (tmp_path / "new.json").write_text(json.dumps(newer))
    (tmp_path / "notes.json").write_text('{"something": "else"}')
    table = B.BenchFigures(tmp_path).table()
    assert table["found"] and table["how"] == "option"
    assert table["problems"] == ["notes.json: not a benchmark figures file (format None)"]
    (local,) = table["benches"]
    assert [r["command"] for r in local["runs"]] == [
        "bench/local.py --rounds 3",
        "bench/local.py --only cold10k",
    ]
    cold, sweep = local["measurements"]
    assert [(f["system"], f["value"], f["date"]) for f in cold["figures"]] == [
        ("ew.map", 0.1, "2026-12-06"), ("PPE.map(chunksize)", 0.037, "2026-12-05"),
        ("loky, one submit per task", 2.92, "2026-12-05")]  # fmt: skip
    assert sorted((f["system"], f["tasks"]) for f in sweep["figures"]) == [
        ("PPE.map(chunksize)", 100), ("PPE.map(chunksize)", 100_000), ("ew.map", 100), ("ew.map", 100_000)]  # fmt: skip
    assert cold["unit"] == "s" and sweep["unit"] == "tasks/s" and sweep["better"] == "higher"


def test_no_figures_says_where_it_looked(tmp_path):
    table = B.BenchFigures(tmp_path / "nowhere").table()
    assert not table["found"] and table["benches"] == []
    assert table["message"] == f"no benchmark figures in {tmp_path / 'nowhere'}: no such folder"
    (tmp_path / "nowhere").mkdir()
    figures = B.BenchFigures(tmp_path / "nowhere")
    assert "no benchmark figures (*.json) in it" in figures.table()["message"]
    (tmp_path / "nowhere" / "local.json").write_text(FIXTURE.read_text())  # read again once there
    assert figures.table()["found"]


def test_the_wire_column_names_the_cipher_or_says_not_encrypted(monkeypatch):
    monkeypatch.setenv(ciphers.CIPHER_ENV, "aes")  # this end: AES-256-GCM alone
    assert wire_of(True, "lab", ciphers.CIPHERS) == {
        "wire": "encrypted: AES-256-GCM",
        "cipher": ciphers.AES_GCM,
    }
    monkeypatch.delenv(ciphers.CIPHER_ENV)
    assert wire_of(True, "lab", (ciphers.CHACHA,)) == {"wire": "encrypted: ChaCha20-Poly1305",
                                                      "cipher": ciphers.CHACHA}  # fmt: skip
    monkeypatch.setenv(ciphers.CIPHER_ENV, "aes")
    assert wire_of(True, "lab", (ciphers.CHACHA,))["cipher"] == ""  # none in common
    assert wire_of(False, "lab", ())["wire"] == "not encrypted (--no-encrypt)"
    assert wire_of(False, "", ())["wire"] == "not encrypted (loopback only)"
    assert set(CIPHER_NAMES) == set(ciphers.CIPHERS)  # a name for every cipher a peer may use
