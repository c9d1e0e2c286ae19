"""python= as a command line on ssh nodes, against the real sshd on loopback (ci/services/sshd.sh).

The agent (and so every worker it starts, and the host probe it answers) runs through the
wrapper; the interpreter probe of ``doctor`` (remote_python_info) runs through it too.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

import elsewhere as ew
from elsewhere.hosts import SSHTransport, remote_python_info
from elsewhere.util.errors import RemoteSetupError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_wrappers import inside

pytestmark = pytest.mark.timeout(120)


def test_agent_and_workers_run_through_the_wrapper_after_the_setup(
    ew_home, sshd, fake_container, odd_image, tmp_path
):
    python = f"export EW_SETUP_MARK=\"a 'b'\" && {fake_container.command(odd_image)}"
    cl = ew.ssh({sshd.host: 2}, ssh_config=str(sshd.config), python=python,
                remote_storage=str(tmp_path / "remote"))  # fmt: skip
    try:
        job = ew.submit(inside, range(3), on=cl)
        job.wait(timeout=90)
        assert job.results() == [(x, odd_image, "a 'b'") for x in range(3)]
    finally:
        cl.close()
    runs = fake_container.runs()
    assert [image for _, image, _ in runs] == [odd_image] * len(runs) and runs
    assert any(
        cmd.startswith(f"{sys.executable} -m elsewhere.hosts.agent serve") for *_, cmd in runs
    )


def test_the_interpreter_probe_runs_through_the_same_command_line(sshd, fake_container, odd_image):
    with SSHTransport(sshd.host, ssh_config=str(sshd.config)) as transport:
        info = remote_python_info(transport, [str(fake_container.path), "exec", odd_image,
                                              sys.executable])  # fmt: skip
        assert info["python_version"] == ".".join(map(str, sys.version_info[:3]))
        assert [(image, cmd.split()[:2]) for _, image, cmd in fake_container.runs()] == [
            (odd_image, [sys.executable, "-c"])
        ]
        with pytest.raises(RemoteSetupError) as err:  # the wrapper is there, its python not
            remote_python_info(transport, fake_container.command("img", "/no/such/python3"))
    assert "could not start" in str(err.value) and shlex.quote(str(fake_container.path)) in str(
        err.value
    )
