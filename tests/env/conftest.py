"""Fixtures of the python= tests: the fake container runtime, the sshd, podman where it runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # services
sys.path.insert(0, str(HERE))  # env_wrappers
import env_wrappers

import services


@pytest.fixture
def fake_container(tmp_path) -> env_wrappers.FakeContainer:
    """A fresh ``fake-container`` (see env_wrappers.py) and its log."""
    return env_wrappers.FakeContainer.make(tmp_path)


@pytest.fixture
def odd_image() -> str:
    """An image name with spaces, quotes, ``$``, backticks and ``;``."""
    return env_wrappers.ODD_IMAGE


@pytest.fixture
def sshd():
    """The loopback sshd of ci/services/sshd.sh; skips with the reason when it is not there."""
    info = services.ssh()
    if info is None:
        pytest.skip(services.why_no_ssh())
    return info


@pytest.fixture(scope="session")
def podman(tmp_path_factory) -> Path:
    """A root file system podman runs a container from, here; skips with the reason when it
    cannot (no podman, or a machine where it starts no container)."""
    if shutil.which("podman") is None:
        pytest.skip("no podman here (Debian: apt-get install podman runc)")
    root = env_wrappers.podman_rootfs(tmp_path_factory.mktemp("podman"))
    argv = env_wrappers.podman_command(root, env_wrappers.python_prefixes())
    try:
        res = subprocess.run([*argv, "-c", "print('inside')"], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip("podman did not start a container within 120 s")
    if res.returncode != 0 or res.stdout.strip() != "inside":
        pytest.skip(f"podman cannot run a container here: {res.stderr.strip()[-300:]}")
    return root
