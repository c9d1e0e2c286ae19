"""Group key files: created private, refused when others can read them."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from elsewhere.peer import keys
from elsewhere.peer.keys import (
    KEY_BYTES,
    LOOPBACK_ONLY,
    GroupKey,
    find_key,
    format_key_file,
    generate_key,
    is_loopback_only,
    load_key,
    parse_key_file,
    write_key,
)
from elsewhere.util.errors import ConfigError, PeerError


def test_generate_key_is_random_and_32_bytes() -> None:
    a, b = generate_key(), generate_key()
    assert len(a) == len(b) == KEY_BYTES == 32
    assert a != b


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    path = write_key("lab", tmp_path / "lab.key")
    key = load_key(path, "lab")
    assert key.group == "lab" and len(key.secret) == 32
    text = path.read_text()
    assert text.startswith("elsewhere-peer-key v1 lab ") and text.endswith("\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_key_file_is_never_readable_by_others_even_with_a_lax_umask(tmp_path: Path) -> None:
    """Watch the folder while the file is written: no moment with a wider mode."""
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for entry in os.scandir(tmp_path):
                try:
                    seen.add(stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))
                except FileNotFoundError:
                    pass

    old = os.umask(0)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(50):
            write_key("lab", tmp_path / f"k{i}.key")
    finally:
        stop.set()
        watcher.join(5)
        os.umask(old)
    assert seen == {0o600}


def test_umask_that_removes_owner_write_still_gives_0600(tmp_path: Path) -> None:
    old = os.umask(0o277)
    try:
        path = write_key("lab", tmp_path / "k.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_refuses_to_overwrite_unless_asked(tmp_path: Path) -> None:
    path = write_key("lab", tmp_path / "lab.key")
    first = load_key(path)
    with pytest.raises(ConfigError, match="exists"):
        write_key("lab", path)
    assert load_key(path) == first
    write_key("lab", path, overwrite=True)
    assert load_key(path) != first
    assert [p.name for p in tmp_path.iterdir()] == ["lab.key"]  # no temporary files left


def test_default_path_is_in_the_user_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    path = write_key("lab")
    assert path == tmp_path / "cfg" / "elsewhere" / "peer" / "lab.key"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert find_key("lab") == load_key(path)
    assert find_key("other") is LOOPBACK_ONLY


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o610, 0o620])
def test_load_refuses_keys_others_can_read_or_write(tmp_path: Path, mode: int) -> None:
    path = write_key("lab", tmp_path / "lab.key")
    path.chmod(mode)
    with pytest.raises(PeerError, match=r"chmod 600"):
        load_key(path)
    with pytest.raises(PeerError):
        find_key("lab", path)  # never a silent fall-back to loopback-only


def test_load_refuses_a_key_of_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_key("lab", tmp_path / "lab.key")
    real_uid = os.getuid()
    monkeypatch.setattr(keys.os, "getuid", lambda: real_uid + 1000)
    with pytest.raises(PeerError, match="owned by uid"):
        load_key(path)


def test_load_names_the_wrong_group(tmp_path: Path) -> None:
    path = write_key("lab", tmp_path / "lab.key")
    with pytest.raises(ConfigError, match="group 'lab', not 'other'"):
        load_key(path, "other")


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no peer key file"):
        load_key(tmp_path / "none.key")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "one line"),
        ("ssh-rsa AAAA lab x", "not an elsewhere peer key"),
        ("elsewhere-peer-key v2 lab AAAA", "not supported"),
        ("elsewhere-peer-key v1 lab !!!!", "base64"),
        ("elsewhere-peer-key v1 lab AAAA", "3 bytes"),
        ("elsewhere-peer-key v1 l/b " + "A" * 43 + "=", "group name"),
        ("elsewhere-peer-key v1 lab " + "A" * 43 + "=" + "\nsecond line", "one line"),
    ],
)
def test_malformed_key_files(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_key_file(text)


def test_comments_and_blank_lines_are_ignored() -> None:
    key = GroupKey("lab", generate_key())
    text = "# the lab's key\n\n" + format_key_file(key)
    assert parse_key_file(text) == key


def test_repr_never_shows_the_secret() -> None:
    key = GroupKey("lab", bytes(range(32)))
    assert "secret" not in repr(key) and str(bytes(range(32))) not in repr(key)
    assert len(key.fingerprint) == 16
    assert key.fingerprint != GroupKey("lab", bytes(32)).fingerprint


def test_group_key_validates() -> None:
    with pytest.raises(ConfigError, match="32 bytes"):
        GroupKey("lab", b"short")
    with pytest.raises(ConfigError, match="group name"):
        GroupKey("", generate_key())


def test_loopback_only_flag() -> None:
    assert is_loopback_only(LOOPBACK_ONLY)
    assert not is_loopback_only(GroupKey("lab", generate_key()))
