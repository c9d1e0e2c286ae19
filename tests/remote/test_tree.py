"""The tree code that packs and unpacks folders on both sides (no sshd needed)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from elsewhere.hosts.tree import TREE_SCRIPT, tree_functions

PATHS = ["a.pkl", "sub/b.pkl", "sub/deeper/c.log", "results/x/1.txt", "results/2.txt", "top.txt"]


def _select(patterns: list[str]) -> list[str]:
    tree = tree_functions()
    compiled = tree["compile_patterns"](patterns)
    return [p for p in PATHS if tree["matches"](p, compiled)]


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        ([], PATHS),
        (["*.pkl"], ["a.pkl", "sub/b.pkl"]),  # no '/': the name, at any depth
        (["/*.pkl"], ["a.pkl"]),  # leading '/': anchored at the root
        (["results/*"], ["results/2.txt"]),  # '*' stops at '/'
        (["results/**"], ["results/x/1.txt", "results/2.txt"]),
        (["deeper/*"], ["sub/deeper/c.log"]),  # unanchored: matches the end of the path
        (["?.pkl", "*.log"], ["a.pkl", "sub/b.pkl", "sub/deeper/c.log"]),
        (["[ab].pkl"], ["a.pkl", "sub/b.pkl"]),
        (["[!a].pkl"], ["sub/b.pkl"]),
    ],
)
def test_include_patterns_follow_rsync(patterns: list[str], expected: list[str]) -> None:
    assert _select(patterns) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "patterns",
    [["*.pkl"], ["/*.pkl"], ["results/*"], ["results/**"], ["deeper/*"], ["[!a].pkl", "*.log"]],
)
def test_include_patterns_agree_with_real_rsync(patterns: list[str], tmp_path: Path) -> None:
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed")
    src, dst = tmp_path / "src", tmp_path / "dst"
    for path in PATHS:
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(path)
    filters = ["--include=*/", *(f"--include={p}" for p in patterns), "--exclude=*"]
    subprocess.run(["rsync", "-r", "-m", *filters, f"{src}/", f"{dst}/"], check=True, timeout=30)
    copied = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    assert copied == sorted(_select(patterns))


def _tar_stream(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    header = b"EWTREE1 " + json.dumps({"codec": "none", "kind": "dir", "name": "x"}).encode()
    return b"login banner noise\n" + header + b"\n" + body.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info, None


@pytest.mark.parametrize("name", ["../escape", "/etc/escape", "a/../../escape"])
def test_unpack_refuses_paths_that_leave_the_folder(name: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    stream = io.BufferedReader(io.BytesIO(_tar_stream([_file(name)])))
    with pytest.raises(ValueError, match="unsafe"):
        tree_functions()["unpack"](str(root), stream)
    assert not list(tmp_path.rglob("escape"))


def test_unpack_skips_symlinks_that_point_outside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    members = [_link("evil", "/etc"), _link("up", "../.."), _link("ok", "sub/f"), _file("sub/f")]
    stream = io.BufferedReader(io.BytesIO(_tar_stream(members)))
    tree_functions()["unpack"](str(root), stream)
    assert sorted(os.listdir(root)) == ["ok", "sub"]


def test_unpack_never_writes_through_an_existing_symlink(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "d").symlink_to(outside)
    stream = io.BufferedReader(io.BytesIO(_tar_stream([_file("d/x")])))
    with pytest.raises(ValueError, match="symlink"):
        tree_functions()["unpack"](str(root), stream)
    assert not (outside / "x").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_pack_pipe_unpack_round_trip(codec: str, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "big.bin").write_bytes(os.urandom(3_000_000))
    (src / "small.txt").write_text("hello")
    opts = json.dumps({"codec": codec, "skip": {"small.txt": [5, 0]}}) + "\n"
    pack = subprocess.run(
        [sys.executable, "-c", TREE_SCRIPT, "pack", str(src)],
        input=opts.encode(),
        capture_output=True,
        check=True,
        timeout=30,
    )
    unpack = subprocess.run(
        [sys.executable, "-c", TREE_SCRIPT, "unpack", str(dst)],
        input=pack.stdout,
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert json.loads(unpack.stdout) == {"files": 2, "bytes": 3_000_005}
    assert (dst / "sub" / "big.bin").read_bytes() == (src / "sub" / "big.bin").read_bytes()
    assert not list(dst.rglob(".*ewtmp*"))  # temporary names are all renamed
