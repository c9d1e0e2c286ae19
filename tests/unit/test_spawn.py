"""The spawn helper's pure parts: the environment and the interpreter path it starts with.

The starts themselves (sessions, logs, posix_spawn and its fallback) are in
tests/remote/test_spawn.py.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

import elsewhere
from elsewhere.hosts.spawn import package_root, python_env, python_path


def test_package_root_is_the_folder_that_holds_this_elsewhere() -> None:
    root = Path(package_root())
    assert (root / "elsewhere" / "__init__.py").is_file()
    assert Path(elsewhere.__file__).resolve().parent == (root / "elsewhere").resolve()


def test_pythonpath_is_led_by_the_package_root() -> None:
    root = package_root()
    assert python_env({"A": "1"}) == {"A": "1", "PYTHONPATH": root}
    assert python_env({"PYTHONPATH": "/x:/y"})["PYTHONPATH"] == f"{root}{os.pathsep}/x:/y"
    # a process started by one started here gets it once, not twice
    once = python_env({"PYTHONPATH": "/x"})
    assert python_env(once) == once


def test_not_importable_leaves_the_environment_as_given() -> None:
    assert python_env({"PYTHONPATH": "/x", "B": "2"}, importable=False) == {"PYTHONPATH": "/x", "B": "2"}
    assert python_env({}, importable=False) == {}


def test_default_environment_is_this_processs_and_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EW_SPAWN_TEST", "here")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = python_env()
    assert env["EW_SPAWN_TEST"] == "here" and env["PYTHONPATH"] == package_root()
    env["EW_SPAWN_TEST"] = "changed"
    assert os.environ["EW_SPAWN_TEST"] == "here"


def test_interpreter_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert python_path() == sys.executable
    sh = shutil.which("sh")
    assert sh and python_path("sh") == sh  # a bare name is looked up on PATH
    link = tmp_path / "py"
    link.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    assert python_path("./py") == str(link)  # made absolute, the symlink kept (a venv's python)
    assert python_path(Path("py").absolute()) == str(link)
    assert python_path("no-such-python-ew") == "no-such-python-ew"  # Popen says it is missing
