"""Where elsewhere keeps things: the home folder follows the environment at every call, though
it is worked out once for each environment (a submission asks for it several times)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsewhere.util import paths


def test_the_home_follows_elsewhere_home_as_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELSEWHERE_HOME", str(tmp_path / "a"))
    assert paths.home() == tmp_path / "a"
    monkeypatch.setenv("ELSEWHERE_HOME", str(tmp_path / "b"))
    assert paths.home() == tmp_path / "b"
    assert paths.default_storage() == tmp_path / "b" / "jobs"
    monkeypatch.setenv("ELSEWHERE_HOME", str(tmp_path / "a"))
    assert paths.home() == tmp_path / "a"


def test_without_elsewhere_home_it_is_the_user_data_folder_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ELSEWHERE_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data1"))
    assert paths.home() == tmp_path / "data1" / "elsewhere"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data2"))
    assert paths.home() == tmp_path / "data2" / "elsewhere"


def test_a_relative_elsewhere_home_is_taken_from_the_working_folder_of_each_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELSEWHERE_HOME", "here")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    monkeypatch.chdir(tmp_path / "one")
    assert paths.home() == tmp_path / "one" / "here"
    monkeypatch.chdir(tmp_path / "two")
    assert paths.home() == tmp_path / "two" / "here"
