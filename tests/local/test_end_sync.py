"""The end of a job: a worker fsyncs the results and journal it has not synced yet before it
leaves, except in the job of an ``ew.map``, which its caller purges once it has read the values
(nothing of it is kept; the fsyncs kept the workers from the next map)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

# A small client (its workers start as its forks, and keep its os.fsync, which says what it
# synced): a submitted job, then a map, each waited for until its worker is idle again
_CLIENT = textwrap.dedent("""
    import os, sys, time
    log = sys.argv[1]
    real = os.fsync

    def logged(fd):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = "?"
        with open(log, "a") as f:
            f.write(name + "\\n")
        real(fd)

    os.fsync = logged
    import elsewhere as ew

    def one(x):
        return x

    def idle_again(cl):
        deadline = time.monotonic() + 20
        while not os.listdir(cl.pool_dir() / "idle"):
            assert time.monotonic() < deadline, "the worker never came back"
            time.sleep(0.01)

    cl = ew.local(cores=1)
    from elsewhere.hosts.forkstart import can_fork
    with open(log, "a") as f:
        f.write(f"-- fork {can_fork(cl.command)}\\n")
    job = ew.submit(one, range(3), on=cl)
    job.wait(timeout=60, progress=False)
    idle_again(cl)
    with open(log, "a") as f:
        f.write("-- map\\n")
    assert ew.map(one, range(3), on=cl, progress=False) == [0, 1, 2]
    idle_again(cl)
    job.purge()
    cl.shutdown()
""")


def test_an_ew_maps_job_is_not_synced_at_its_end_a_submitted_one_is(ew_home, tmp_path):
    log = tmp_path / "fsyncs"
    script = tmp_path / "client.py"
    script.write_text(_CLIENT)
    out = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=90,
                         cwd=tmp_path, env={**os.environ, "ELSEWHERE_HOME": str(ew_home)})  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = log.read_text()
    if "-- fork True" not in text:
        pytest.skip("the workers do not start as forks of the client here (they have their own os.fsync)")
    submitted, _, mapped = text.partition("-- map\n")
    ends = [p for p in submitted.split("\n") if "/results/" in p or "/journal/" in p]
    assert any("/results/" in p for p in ends) and any("/journal/" in p for p in ends), ends
    assert [p for p in mapped.split("\n") if "/results/" in p or "/journal/" in p] == []
