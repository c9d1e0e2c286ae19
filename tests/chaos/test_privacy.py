"""Privacy: everything elsewhere makes under its home and config folders is its user's alone
(folders 0700, files, FIFOs and sockets 0600), whatever the umask.

Each umask runs in a process of its own that sets it before importing elsewhere, then uses
what a user would: ``elsewhere doctor local`` first (it makes the storage folder), local
jobs (one kept, one purged by ``ew.map``), a peer key (``elsewhere peer keygen``), a
background peer worker and a peer job, a job-script template; its child
processes (workers, the peer daemon) inherit the umask. Then every path under the two
folders is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.conftest import Tally, run_cli
from peer.peer_procs import free_port

SCRIPT = textwrap.dedent(r"""
    import os, sys
    os.umask(int(sys.argv[1], 8))  # before elsewhere is imported: as a user's shell would have it
    import json, subprocess, time
    import elsewhere as ew

    def cli(*args):
        p = subprocess.run([sys.executable, "-m", "elsewhere", *args], capture_output=True, text=True,
                           timeout=60)
        return {"args": list(args), "rc": p.returncode, "out": p.stdout + p.stderr}

    def shout(x):
        print("task", x)  # a log
        return x * 2

    ran = [cli("doctor", "local")]  # first: it makes the storage folder (and the home)
    assert ew.map(shout, range(6), on=ew.local(), timeout=60) == [0, 2, 4, 6, 8, 10]  # made, then purged
    job = ew.submit(shout, range(6), on=ew.local(), name="kept")
    job.wait(timeout=60)
    assert job.results() == [0, 2, 4, 6, 8, 10]
    from elsewhere.schedulers import jobscripts
    jobscripts.install("slurm")  # `elsewhere template install slurm`
    ran.append(cli("peer", "keygen", "lab"))
    key = os.path.join(os.environ["ELSEWHERE_CONFIG"], "peer", "lab.key")
    port = sys.argv[2]
    ran.append(cli("peer", "worker", "--detach", "--interface", "127.0.0.1", "--port", port, "--key", key,
                   "--slots", "1"))
    on = ew.peers("lab", key=key, port=int(port), interface="127.0.0.1")
    assert ew.map(shout, range(3), on=on, keep=True, name="peer-kept", timeout=60) == [0, 2, 4]
    seen = {}  # what is there while the peer worker runs (its stats file goes when it stops)
    for root in (os.environ["ELSEWHERE_HOME"], os.environ["ELSEWHERE_CONFIG"]):
        for folder, dirs, files in os.walk(root):
            for p in [folder] + [os.path.join(folder, n) for n in files]:
                seen[p] = os.lstat(p).st_mode
    ran.append(cli("peer", "stop"))
    print(json.dumps({"ran": ran, "seen": seen}))
""")


def modes(root: Path) -> dict[str, int]:
    """{path: st_mode} of ``root`` and everything under it."""
    out = {}
    for folder, _, files in os.walk(root):
        for p in [folder, *(os.path.join(folder, n) for n in files)]:
            out[p] = os.lstat(p).st_mode
    return out


def too_open(seen: dict[str, int]) -> list[str]:
    """The paths whose mode is not private: folders 0700, anything else but symlinks 0600
    (job scripts of batch jobs, 0700, do not occur here)."""
    bad = []
    for p, mode in sorted(seen.items()):
        if stat.S_ISLNK(mode):
            continue
        want = 0o700 if stat.S_ISDIR(mode) else 0o600
        if stat.S_IMODE(mode) != want:
            bad.append(f"{oct(stat.S_IMODE(mode))} {p}")
    return bad


def _stop_peer_workers(home: Path) -> None:
    """Kill the background peer workers a failed run may have left (by their records' pids)."""
    for rec in (home / "peer" / "workers").glob("[0-9]*.json"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(rec.stem), signal.SIGKILL)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("umask", ["000", "022", "077"])
def test_everything_under_home_and_config_is_private_whatever_the_umask(umask: str, ew_home: Path, tmp_path: Path,
                                                                       tally: Tally) -> None:  # fmt: skip
    config = tmp_path / "config"  # not there yet: elsewhere makes it
    script = tmp_path / "use.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "ELSEWHERE_CONFIG": str(config), "ELSEWHERE_HOME": str(ew_home)}
    try:
        p = subprocess.run([sys.executable, str(script), umask, str(free_port())], capture_output=True,
                           text=True, timeout=180, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        tally.hang(f"the umask {umask} run took over 180 s")
        return
    finally:
        _stop_peer_workers(ew_home)
    tally.check_output(f"umask {umask}", p.stderr)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    for r in report["ran"]:
        tally.check_output("elsewhere " + " ".join(r["args"]), r["out"])
        assert r["rc"] == 0, r
    made = [Path(f) for root in (ew_home, config) for f, _, _ in os.walk(root)]
    # what the run was to make is there: the registry, a kept job with results and logs, the
    # local pool, the peer records, the key, the template
    for want in (ew_home / "registry.sqlite", ew_home / "jobs", ew_home / "local", ew_home / "peer" / "workers",
                 config / "peer" / "lab.key", config / "templates" / "slurm.j2"):  # fmt: skip
        assert want.exists(), f"{want} was not made"
    assert any((f / "results").is_dir() and any((f / "results").iterdir()) for f in made)
    assert list((ew_home / "peer" / "workers").glob("*.log"))
    assert any(p.endswith(".stats.json") for p in report["seen"])
    seen = {**report["seen"], **modes(ew_home), **modes(config)}
    bad = too_open(seen)
    tally.trial(len(seen))
    assert not bad, f"umask {umask}: not private:\n  " + "\n  ".join(bad)


def test_an_open_home_and_registry_made_earlier_are_closed(ew_home: Path, tally: Tally) -> None:
    """A home made 0777 and a registry made 0644 (by an older version, or under umask 0) are
    made private by the next command."""
    from elsewhere.folder.registry import Registry

    ew_home.mkdir()
    Registry().all()  # makes the registry
    os.chmod(ew_home / "registry.sqlite", 0o644)
    os.chmod(ew_home, 0o777)
    out = run_cli(tally, "jobs")
    tally.trial()
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(ew_home.stat().st_mode) == 0o700
    assert stat.S_IMODE((ew_home / "registry.sqlite").stat().st_mode) == 0o600
