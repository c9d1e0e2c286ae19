"""Many clients on one name or one job at once: same-name submits from several processes at
the same moment (one job gets the name; the others are told it is in use, never a traceback
or a half-made job), and several processes recovering and waiting on one running job (each
gets every value).

Clients are real processes, released together by a file they all watch for.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import elsewhere as ew
from chaos.conftest import Tally, scaled

pytestmark = pytest.mark.timeout(240)

CLIENTS = 6

SAME_NAME = """
import os, sys, time
import elsewhere as ew
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.001)
try:
    job = ew.submit(time.sleep, [1.0, 1.0], name=sys.argv[2])
    print("submitted", job.id, flush=True)
    job.wait(timeout=60, progress=False)
    print("results", job.results(), flush=True)
except ew.NameInUse as exc:
    print("in use:", exc, flush=True)
"""

WAITER = """
import os, sys, time
import elsewhere as ew
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.001)
job = ew.recover(sys.argv[2])
job.wait(timeout=60, progress=False)
print("results", job.results(), flush=True)
"""


def _clients(code: str, go: Path, name: str, tally: Tally) -> list[str]:
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(go), name], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(CLIENTS)]  # fmt: skip
    time.sleep(0.5)  # all of them importing, then watching
    go.touch()
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            tally.hang(f"a client of {name!r} ran over 120 s")
        tally.check_output(f"client of {name!r}", out + err)
        outs.append(out)
    go.unlink()
    return outs


def test_same_name_submits_at_once_give_one_job_and_clear_refusals(ew_home: Path, tmp_path: Path,
                                                                   tally: Tally) -> None:  # fmt: skip
    for trial in range(scaled(3)):
        name = f"same-{trial}"
        tally.trial()
        outs = _clients(SAME_NAME, tmp_path / "go", name, tally)
        submitted = [o for o in outs if o.startswith("submitted")]
        refused = [o for o in outs if o.startswith("in use:")]
        if len(submitted) != 1 or len(refused) != CLIENTS - 1:
            tally.lose(1, f"trial {trial}: {len(submitted)} submitted, {len(refused)} refused: {outs}")
            continue
        if "results [None, None]" not in submitted[0]:
            tally.lose(1, f"trial {trial}: the job that got the name did not end well: {submitted[0]}")
        assert "already" in refused[0] or "in use" in refused[0]
        assert [j for j in ew.jobs() if j["name"] == name], "the job is not registered"


def test_clients_recovering_and_waiting_on_one_job_each_get_every_value(ew_home: Path, tmp_path: Path,
                                                                        tally: Tally) -> None:  # fmt: skip
    for trial in range(scaled(3)):
        name = f"shared-{trial}"
        job = ew.submit(pow, [2] * 40, list(range(40)), name=name)
        tally.trial()
        outs = _clients(WAITER, tmp_path / "go", name, tally)
        want = f"results {[2**i for i in range(40)]}"
        tally.lose(sum(1 for o in outs if want not in o), f"trial {trial}: clients missed values: {outs}")
        job.wait(timeout=60)
        job.purge()
