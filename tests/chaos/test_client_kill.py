"""Chaos: the client SIGKILLed at any moment of ``ew.submit``, ``ew.map`` and ``wait``.

Afterwards, in another process, the job is either registered, and ``ew.recover(name).wait()``
gets every value, or it is not there at all: no registry entry, and the folder it may have
begun is removed by housekeeping (here without its grace period), the workers started early
in it having left it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import elsewhere as ew
from chaos.conftest import Tally, scaled
from elsewhere.core.submit import sweep_unsubmitted
from elsewhere.folder import housekeeping

pytestmark = pytest.mark.timeout(300)

N = 24

TASKS = """
import time

def slow(x):
    time.sleep(0.03)
    return x * x
"""

#: the client: imports, says "ready", then runs ``CALL`` (with ``KILL_AT`` patched in first)
CLIENT = """
import os, signal, sys
import elsewhere as ew
from tasks import slow

def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)

def at(owner, name, when):
    orig = getattr(owner, name)
    def patched(*a, **k):
        if when == "before":
            die()
        out = orig(*a, **k)
        if when == "after":
            die()
        return out
    setattr(owner, name, patched)

{patch}
print("ready", flush=True)
{call}
print("done", flush=True)
"""

CALLS = {
    "map": "ew.map(slow, range({n}), name={name!r}, keep=True, on=ew.local(cores=2))",
    "submit+wait": "ew.submit(slow, range({n}), name={name!r}, on=ew.local(cores=2)).wait(timeout=60)",
}

#: points inside submit where the client dies, and whether the job is registered by then
POINTS = {
    "while the folder is made": ("from elsewhere.folder.store import JobStore as S; at(S, 'create', 'after')", False),
    "after prepare": ("from elsewhere.backends.local import LocalCluster as C; at(C, 'prepare', 'after')", False),
    "after the payload": ("from elsewhere.folder.payload import PayloadWriter as P; at(P, 'write_tasks', 'after')",
                          False),
    "before registering": ("from elsewhere.folder.registry import Registry as R; at(R, 'add', 'before')", False),
    "after registering": ("from elsewhere.folder.registry import Registry as R; at(R, 'add', 'after')", True),
    "before the hand-over": (
        "from elsewhere.backends.local import LocalCluster as C; at(C, 'submit_independent', 'before')", True),
    "after the hand-over": (
        "from elsewhere.backends.local import LocalCluster as C; at(C, 'submit_independent', 'after')", True),
}  # fmt: skip


def _start_client(tmp_path: Path, name: str, call: str, patch: str = "") -> subprocess.Popen:
    (tmp_path / "tasks.py").write_text(TASKS)
    code = CLIENT.format(patch=patch, call=CALLS[call].format(n=N, name=name))
    p = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "ready", (
        f"the client did not start: {line!r} {p.stderr.read() if p.stderr else ''}"
    )
    return p


def _reap(tally: Tally, p: subprocess.Popen, what: str) -> None:
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        tally.hang(f"{what}: the client ran over 60 s")
        return
    tally.check_output(what, err)


def _check_recovered(
    tally: Tally, name: str, home: Path, what: str, *, registered: bool | None
) -> None:
    """The job is registered and gets every value, or nothing of it is left."""
    try:
        job = ew.recover(name)
    except ew.JobNotFound:
        if registered:
            tally.lose(N, f"{what}: job {name} should have been registered")
            return
        _check_nothing_left(tally, name, home, what)
        return
    if registered is False:
        tally.lose(N, f"{what}: job {name} was registered before the client got there")
    try:
        job.wait(timeout=60)
    except ew.TimeoutError as exc:
        tally.hang(f"{what}: {exc}")
        return
    got = job.results()
    wrong = [i for i, v in enumerate(got) if v != i * i]
    tally.lose(
        len(wrong),
        f"{what}: tasks {wrong[:10]} of {name} gave {[got[i] for i in wrong[:3]]!r:.200}",
    )
    job.purge()


def _check_nothing_left(tally: Tally, name: str, home: Path, what: str) -> None:
    """No registry entry; the folder the client began, if any, is removed by housekeeping once
    the workers started early in it have left it."""
    if any(r["name"] == name for r in ew.jobs(refresh=False)):
        tally.lose(N, f"{what}: job {name} is in the registry, but cannot be recovered")
    root = home / "jobs"
    folders = [f for f in root.iterdir() if not f.name.startswith(".")] if root.is_dir() else []
    for folder in folders:
        deadline = time.monotonic() + 15
        while _waiting_members(folder) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _waiting_members(folder):
            tally.hang(f"{what}: workers still wait in {folder.name}, whose client is gone")
    sweep_unsubmitted(
        root, grace_s=0, foreign_grace_s=0
    )  # (a job.json not written yet names no client)
    housekeeping.finish()
    left = [f.name for f in root.iterdir() if not f.name.startswith(".")] if root.is_dir() else []
    if left:
        tally.lose(N, f"{what}: unregistered job folders left behind: {left}")


def _waiting_members(folder: Path) -> list[str]:
    from elsewhere.folder.store import JobStore

    try:
        q = JobStore(folder).queue()
    except (OSError, ValueError):
        return []
    return [w for w, m in q.members.items() if m.get("state") in ("active", "waiting")]


def test_client_killed_at_random_moments(ew_home, tmp_path, tally):
    """Killed at a random moment from the start of ``ew.map`` (or ``submit`` and ``wait``) to
    well past its end: the job is recovered whole in another process, or was never made."""
    rng = random.Random(23)
    for trial in range(scaled(6)):
        name = f"rnd{trial}"
        call = list(CALLS)[trial % len(CALLS)]
        p = _start_client(tmp_path, name, call)
        time.sleep(rng.uniform(0.0, 0.6))
        p.send_signal(signal.SIGKILL)
        _reap(tally, p, f"{call} killed")
        tally.trial()
        _check_recovered(tally, name, ew_home, f"{call} killed at random", registered=None)


@pytest.mark.parametrize("point", list(POINTS))
def test_client_killed_inside_submit(ew_home, tmp_path, tally, point):
    """Killed at each step of ``submit``: before the job is registered nothing is left (the
    workers started early leave the folder, housekeeping removes it); after, the job is
    recovered whole (a poll hands it over if the client could not)."""
    patch, registered = POINTS[point]
    name = "inside-" + point.replace(" ", "-")
    p = _start_client(tmp_path, name, "submit+wait", patch)
    _reap(tally, p, f"submit killed {point}")
    if p.returncode != -signal.SIGKILL:
        pytest.fail(f"the client was not killed {point} (exit {p.returncode})")
    tally.trial()
    _check_recovered(tally, name, ew_home, f"killed {point}", registered=registered)


def test_orphaned_folder_kept_while_its_client_lives(ew_home, tmp_path, tally):
    """Housekeeping removes no folder whose client still runs (a submit in progress), nor a
    registered or submitted job's."""
    job = ew.create_job(name="pending")  # made, not submitted: its client (this process) lives
    done = ew.submit(abs, [-1, -2], name="done")
    done.wait(timeout=60)
    sweep_unsubmitted(ew_home / "jobs", grace_s=0)
    housekeeping.finish()
    tally.trial(2)
    for j in (job, done):
        if not j.path.is_dir():
            tally.lose(1, f"the folder of {j.name} was removed by housekeeping")
    meta = json.loads((job.path / "job.json").read_text())
    if meta["client"]["pid"] != os.getpid():
        tally.lose(1, f"job.json names client {meta['client']}, not this process")
