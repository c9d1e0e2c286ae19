"""The probe run by an interpreter on a host through a transport (remote_python_info)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elsewhere.hosts import Transport, interpreter, remote_python_info
from elsewhere.hosts.probe import HostProbe, probe_host

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BARE = "/usr/bin/python3"  # an interpreter without elsewhere, where this machine has one


def test_the_answer_is_the_hosts_probe(transport: Transport) -> None:
    info = remote_python_info(transport, sys.executable)
    here = probe_host()
    there = HostProbe.from_dict(info)
    assert there.usable_cores == here.usable_cores and there.cpu_count == here.cpu_count
    assert there.mem_total_mb == here.mem_total_mb
    assert there.executable == sys.executable and there.elsewhere_version == here.elsewhere_version
    assert info["cpus_usable"] == here.usable_cores  # the name older readers use


def test_a_python_without_elsewhere_still_describes_the_host(transport: Transport) -> None:
    if not os.path.exists(BARE) or subprocess.run([BARE, "-c", "import elsewhere"],
                                                  capture_output=True).returncode == 0:
        pytest.skip(f"no {BARE} without elsewhere on this machine")
    info = remote_python_info(transport, BARE)
    assert info["elsewhere_version"] is None
    assert info["executable"] == BARE
    assert info["usable_cores"] == probe_host().usable_cores


def test_a_python_too_old_for_the_probe_still_says_its_version(
        transport: Transport, monkeypatch: pytest.MonkeyPatch) -> None:
    # the prelude's branch for Python 2 and 3.6, taken here by raising the bar past this one
    script = interpreter.probe_script()
    assert "sys.version_info < (3, 7)" in script
    monkeypatch.setattr(interpreter, "probe_script",
                        lambda: script.replace("sys.version_info < (3, 7)", "True"))
    info = remote_python_info(transport, sys.executable)
    assert info["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert info["executable"] == sys.executable and info["elsewhere_version"] is None
    assert "usable_cores" not in info


def test_the_script_is_plain_ascii() -> None:
    # it crosses a remote login shell whatever the locale there
    assert interpreter.probe_script().isascii()
