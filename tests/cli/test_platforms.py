"""Where elsewhere cannot run it says so in one clear line: a Python without ``fcntl`` (Windows;
simulated here by hiding the module) and a system without ``/proc`` (a peer worker; simulated
by a mount namespace with an empty ``/proc``)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import elsewhere as ew
from cli.conftest import COMMAND
from elsewhere.util.system import require_proc

pytestmark = pytest.mark.timeout(120)

WITHOUT_FCNTL = "import sys, runpy; sys.modules['fcntl'] = None  # as on Windows\n"


def test_a_python_without_fcntl_is_told_so_by_the_shell_and_the_api(shell):
    p = subprocess.run([sys.executable, "-c", WITHOUT_FCNTL + "sys.argv = ['elsewhere', 'jobs']\n"
                        "runpy.run_module('elsewhere', run_name='__main__')"],
                       capture_output=True, text=True, timeout=60, env=shell.env)  # fmt: skip
    assert p.returncode == 1 and p.stdout == "", (p.stdout, p.stderr)
    (line,) = p.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("elsewhere: this Python on ") and "has no fcntl module" in line
    assert "runs on Linux" in line
    api = shell.python(
        WITHOUT_FCNTL
        + """
import elsewhere as ew
try:
    ew.map(abs, [-1])
except ImportError as exc:  # an elsewhere.UnsupportedPlatform, also an ImportError
    print(type(exc).__name__, exc)
"""
    )
    assert api.startswith("UnsupportedPlatform this Python on ") and "runs on Linux" in api
    assert not shell.home.exists()  # nothing was made on the way


def test_a_peer_worker_without_proc_says_so(shell, tmp_path):
    with pytest.raises(ew.ElsewhereError, match=r"a peer worker needs Linux's .*there is none"):
        require_proc("a peer worker", proc=str(tmp_path))  # no self/stat there
    require_proc("a peer worker")  # here there is one
    unshare = shutil.which("unshare")
    hide = "mount -t tmpfs none /proc"
    probe = (
        subprocess.run([unshare, "-rm", "sh", "-c", hide], capture_output=True, timeout=30)
        if unshare
        else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip("no mount namespace here (unshare -rm) to hide /proc in")
    words = " ".join(f"'{w}'" for w in [*COMMAND, "peer", "worker", "--multicast-group", "none",
                                         "--peer", "127.0.0.1:9", "--tcp-port", "0"])  # fmt: skip
    p = subprocess.run([unshare, "-rm", "sh", "-c", f"{hide} && exec {words}"],
                       capture_output=True, text=True, timeout=60, env=shell.env)  # fmt: skip
    assert p.returncode == 1, (p.stdout, p.stderr)
    last = p.stderr.strip().splitlines()[-1]
    assert "Traceback" not in p.stderr and last.startswith(
        "elsewhere: a peer worker needs Linux's /proc"
    )
