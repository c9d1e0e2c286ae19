"""Fixtures of the transport tests: the CI sshd and transports to it.

How the tests find sshd
-----------------------
``ci/services/sshd.sh`` starts a private sshd on 127.0.0.1:2222 (key login only)
and writes its files into ``$ELSEWHERE_CI_SSH_DIR`` (default
``/var/lib/elsewhere-ci/ssh``): ``ssh_config`` with the host alias ``ci``, the
client key, a pinned ``known_hosts``, ``sshd.log`` and ``sshd.pid``. ``.ci/run``
should call it before pytest (it is idempotent: a running sshd is left alone).

The session fixture :func:`sshd` checks in a fraction of a second that the
config exists, that the pid in ``sshd.pid`` is alive and that the port accepts a
TCP connection. When something is missing it skips every test that needs sshd,
with a reason that names what is missing and how to start it. Tests never
start services on their own, with one opt-in exception: with
``ELSEWHERE_TEST_START_SSHD=1`` and running as root, the fixture runs
``sshd.sh`` once for the session. Tests never stop the sshd.

The "remote" host is this machine, so tests look at remote files directly.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

if importlib.util.find_spec("elsewhere") is None:  # not installed: test the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from elsewhere.hosts import LocalTransport, SSHTransport, Transport

REPO = Path(__file__).resolve().parents[2]
SSHD_SCRIPT = REPO / "ci" / "services" / "sshd.sh"
# an interpreter on the "remote" host (this machine) that has zstandard, and one without
PYTHON_WITH_ZSTD = sys.executable
PYTHON_WITHOUT_ZSTD = "/usr/bin/python3"

MakeSSH = Callable[..., SSHTransport]


@dataclass(frozen=True)
class SSHD:
    """The running CI sshd: where its files are and how to reach it."""

    folder: Path
    ssh_config: Path
    port: int
    log: Path
    pid: int


def _ssh_dir() -> Path:
    return Path(os.environ.get("ELSEWHERE_CI_SSH_DIR", "/var/lib/elsewhere-ci/ssh"))


def _port(folder: Path) -> int:
    try:
        for line in (folder / "env").read_text().splitlines():
            if line.startswith("ELSEWHERE_CI_SSH_PORT="):
                return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        pass
    return int(os.environ.get("ELSEWHERE_CI_SSH_PORT", "2222"))


def _problem(folder: Path) -> str | None:
    """What is missing for the tests to use the CI sshd, or None."""
    if shutil.which("ssh") is None:
        return "the OpenSSH client `ssh` is not installed"
    if not (folder / "ssh_config").is_file():
        return f"no {folder}/ssh_config: the CI sshd was never started"
    try:
        pid = int((folder / "sshd.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return f"the CI sshd is not running (no live pid in {folder}/sshd.pid)"
    port = _port(folder)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            pass
    except OSError as exc:
        return f"nothing accepts connections on 127.0.0.1:{port} ({exc})"
    return None


@pytest.fixture(scope="session")
def sshd() -> SSHD:
    """The CI sshd, or a skip naming what is missing (see the module docstring)."""
    folder = _ssh_dir()
    problem = _problem(folder)
    if problem and os.environ.get("ELSEWHERE_TEST_START_SSHD") == "1" and os.geteuid() == 0:
        done = subprocess.run(
            ["bash", str(SSHD_SCRIPT)], capture_output=True, text=True, timeout=600, check=False
        )
        problem = _problem(folder)
        if problem:
            problem += f"; ci/services/sshd.sh said: {done.stdout}{done.stderr}"
    if problem:
        pytest.skip(
            f"{problem}. Start it with `bash ci/services/sshd.sh` (as root), "
            "or set ELSEWHERE_TEST_START_SSHD=1"
        )
    return SSHD(
        folder=folder,
        ssh_config=folder / "ssh_config",
        port=_port(folder),
        log=folder / "sshd.log",
        pid=int((folder / "sshd.pid").read_text().strip()),
    )


@pytest.fixture
def control_dir() -> Iterator[str]:
    """A fresh, short folder for master sockets: each test opens its own master."""
    folder = tempfile.mkdtemp(prefix="ewcm-", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def make_ssh(sshd: SSHD, control_dir: str) -> Iterator[MakeSSH]:
    """A factory of SSHTransports to ``ci`` with a private control folder; all closed after."""
    made: list[SSHTransport] = []

    def factory(destination: str = "ci", **kw: object) -> SSHTransport:
        kw.setdefault("ssh_config", sshd.ssh_config)
        kw.setdefault("control_dir", control_dir)
        transport = SSHTransport(destination, **kw)  # type: ignore[arg-type]
        made.append(transport)
        return transport

    yield factory
    for transport in made:
        transport.close()


@pytest.fixture
def ssh(make_ssh: MakeSSH) -> SSHTransport:
    """An SSHTransport to the CI sshd (rsync for files)."""
    return make_ssh("ci", python=PYTHON_WITH_ZSTD)


@pytest.fixture(params=["local", "ssh"])
def transport(request: pytest.FixtureRequest) -> Transport:
    """Each transport in turn: the behaviour suite runs against all of them."""
    if request.param == "local":
        return LocalTransport()
    ssh: SSHTransport = request.getfixturevalue("ssh")
    return ssh


@pytest.fixture(params=["local", "ssh-rsync", "ssh-tar-zstd", "ssh-tar-plain"])
def file_transport(request: pytest.FixtureRequest) -> Transport:
    """Each way of moving files: local copies, rsync, and the tar fallback with and
    without zstandard on the far side."""
    if request.param == "local":
        return LocalTransport()
    make: MakeSSH = request.getfixturevalue("make_ssh")
    if request.param == "ssh-rsync":
        return make("ci", transfer="rsync")
    if request.param == "ssh-tar-zstd":
        return make("ci", transfer="tar", python=PYTHON_WITH_ZSTD)
    if not os.path.exists(PYTHON_WITHOUT_ZSTD):
        pytest.skip(f"no {PYTHON_WITHOUT_ZSTD} (a Python without zstandard) on this machine")
    return make("ci", transfer="tar", python=PYTHON_WITHOUT_ZSTD)
