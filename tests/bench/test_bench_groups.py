"""Every benchmark script still measures: each run here with its smallest settings, and asked
for every figure of the groups it ran (the systems side by side in each), each a number.

No figure is judged (the machine is shared and noisy): a benchmark that stops measuring is
what fails. A library update once did that unseen: ``cryptography`` 51 refused the in-place
decryption of the encrypted wire's bare echo, the crypt group measured nothing, and the
wire's own slowdown with that version went unnoticed until a run by hand. A wait that timed
out fails too: the script says so and leaves that figure out (``web.py``'s page once waited
for updates the folder layer had rightly failed as damaged). Scripts that need a service
(sshd, SLURM, MPI, network namespaces, a browser) skip, saying what is missing, where it is
not running. The slowest groups of ``local.py`` and ``peer.py`` (cpu, sweep, latency,
memory, tput, big, blas: 20-50 s each) and ``joblib_gridsearch.py`` (over a minute at its
smallest) run only with ``ELSEWHERE_BENCH_ALL=1`` (a few minutes more).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import services

BENCH = Path(__file__).resolve().parents[2] / "bench"

_PPE = "ProcessPoolExecutor"
_PACE = ("every second, at once on a change (version 1's pace)", "paced by the group's size")
_SLURM_SYSTEMS = {"ew.submit (defaults)", "ew.submit (tasks_per_element = tasks / CPUs)", "submitit map_array"}


@dataclass(frozen=True)
class Case:
    script: str
    args: tuple[str, ...]
    systems: dict[str, set[str]]  # group -> the systems measured in it (at least these)
    needs: tuple[tuple[Callable[[], object], Callable[[], str]], ...] = field(default=())
    timeout_s: float = 240.0
    long: bool = False  # run only with ELSEWHERE_BENCH_ALL=1


LONG = os.environ.get("ELSEWHERE_BENCH_ALL", "0") not in ("", "0")


_SSH = (services.ssh, services.why_no_ssh)
_SLURM = (services.slurm, services.why_no_slurm)
_MPI = (services.mpi, services.why_no_mpi)
_NETNS = (services.netns, services.why_no_netns)
_BROWSER = (services.browser, services.why_no_browser)

# fmt: off
CASES = [
    Case("local.py", ("--quick", "--only", "cold10k,warm10k,first,big,large"), {
        "cold10k": {"ew.map", "ew.map(seed=False)", "ew.submit().wait(); get()", "PPE.map(chunksize)",
                    "PPE, one submit per task", "mp.Pool.map(chunksize)", "mp.Pool, apply_async per task",
                    "loky map(chunksize)", "loky, one submit per task"},
        "warm10k": {"ew.map", "ew.map(seed=False)", "ew.submit().wait(); get()", "warm PPE.map(chunksize)",
                    "warm PPE.map(chunksize), each job right after one of ew.map's, paired",
                    "warm mp.Pool.map(chunksize)", "warm loky map(chunksize)"},
        "warm10k_b2b": {"ew.map", "warm PPE.map(chunksize)"},
        "first": {"ew.map([x])", "ew.submit().wait(); results()", "ew.Executor().submit().result()",
                  "PPE, start to first result", "dask LocalCluster, start to first result"},
        "big": {"ew.map", "ew.submit().wait(); get()", "warm PPE"},
        "large": {"ew.map", "PPE.map(chunksize)"},
    }),
    Case("peer.py", ("--quick", "--only", "rt,crypt"), {
        "rt": {"ew.Executor", f"{_PPE}, same process", "dask client.submit", "the peer wire alone (a bare controller)"},
        "crypt": {"peer wire, encrypted", "peer wire, --no-encrypt", "peer wire, ChaCha20-Poly1305",
                  "bare TCP echo, clear", "bare TCP echo + AES-256-GCM", "bare TCP echo + ChaCha20-Poly1305",
                  "AES-256-GCM alone, one core", "AES-256-GCM alone, one core, both ways",
                  "ChaCha20-Poly1305 alone, one core, both ways"},
    }),
    Case("checksum.py", ("--rounds", "1", "--mb", "8"), {
        "hash": {"xxh3_64 (xxhash; used)", "xxh64 (xxhash)", "xxh32 (xxhash)", "crc32 (zlib, stdlib)",
                 "adler32 (zlib, stdlib)"},
        "results": {"with XXH3-64", "with CRC32 instead", "without a checksum"},
    }),
    Case("peer_wire.py", ("--rounds", "1", "--mib", "8"), {
        "mac": {"AES-256-GCM, one call", "AES-256-GCM, 1 MiB slices (the wire's)", "GMAC, one call",
                "GMAC, 1 MiB slices (the wire's)", "ChaCha20-Poly1305, one call", "HMAC-SHA256"},
        "codec": {"keyed, encrypted (the default)", "keyed, not encrypted (GMAC)", "no key, HMAC-SHA256 on both sides",
                  "no key, no MAC"},
        "tcp": {"keyed, encrypted (the default)", "keyed, not encrypted (GMAC)", "no key, no MAC"},
        "tiny": {"keyed, encrypted", "keyed, not encrypted", "no key"},
    }),
    Case("peer_sim.py", ("--rounds", "1", "--sizes", "10,100", "--seconds", "5"), {
        group: set(_PACE)
        for group in ("sent", "recv", "verified", "mem-worker", "mem-controller", "cpu-worker", "cpu-controller")
    }),
    Case("peer_loop.py", ("--calls", "2", "--tasks", "8", "--task-ms", "10"), {
        "loop": {"ew.map", "dask client.map + gather", "peer workers"},
    }),
    Case("memory.py", ("--jobs", "3", "--tasks", "100", "--every", "1", "--frames", "2000"), {
        "local": {"ew.local pool", "ew.local worker", _PPE, f"{_PPE} worker"},
        "peer": {"ew peer daemon", "dask worker"},
    }),
    Case("ssh.py", ("--rounds", "1"), {
        "many": {"ew.ssh", "ew.submit", "ew.submit().wait(); results()"},
        "big": {"ew.submit", "plain rsync -a of the same data, its login included",
                "rsync -a over an ssh connection opened beforehand"},
    }, needs=(_SSH,)),
    Case("slurm.py", ("--rounds", "1", "--n", "40"), {
        "submit": _SLURM_SYSTEMS, "all back": _SLURM_SYSTEMS, "calls": _SLURM_SYSTEMS,
    }, needs=(_SLURM,)),
    Case("slurm_short.py", ("--rounds", "1", "--tasks", "40"), {
        "short": {"ew.map (slurm, defaults)", "submitit map_array", "SLURM"},
    }, needs=(_SLURM,)),
    Case("mpi.py", ("--rounds", "1"), {
        "start": {"bare mpiexec -n 2 python -c ...", "ew.submit_communicating on local workers",
                  "the same on SLURM (srun --mpi=pmix)"},
    }, needs=(_MPI, _SLURM)),
    Case("peer_link.py", ("--rounds", "1", "--mb", "8"), {
        "link": {"peer wire, encrypted", "peer wire, --no-encrypt", "bare TCP echo, clear",
                 "bare TCP echo + AES-256-GCM"},
    }, needs=(_NETNS,)),
    Case("peer_scale.py", ("--workers", "4", "--seconds", "2", "--no-dask"), {
        "scale": {"ew.map x 4", "elsewhere peer worker"},
    }, needs=(_NETNS,)),
    Case("web.py", ("--rounds", "1", "--tasks", "1000", "--cpu-tasks", "100", "--updates", "2"), {
        "page": {"elsewhere web", "elsewhere web, the server's first read", "elsewhere status",
                 "elsewhere status, run after it"},
        "cpu": {"elsewhere web", "elsewhere status every second"},
    }, needs=(_BROWSER,)),
    # the long groups (a few minutes in all): ELSEWHERE_BENCH_ALL=1
    Case("local.py", ("--quick", "--only", "cold100k,cpu,sweep,latency,memory"), {
        "cold100k": {"ew.map", "ew.map(seed=False)", "PPE.map(chunksize)", "mp.Pool.map(chunksize)",
                     "loky map(chunksize)"},
        "cpu": {"ew.map", "2 bare multiprocessing.Process"},
        "sweep": {"ew.map", "PPE.map(chunksize)", "PPE, one submit per task", "mp.Pool.map(chunksize)",
                  "loky map(chunksize)"},
        "large": {"ew.map", "PPE.map(chunksize)"},
        "latency": {"ew.Executor", _PPE, "loky reusable executor"},
        "memory": {"ew.Executor", _PPE, "loky reusable executor"},
    }, timeout_s=900, long=True),
    Case("peer.py", ("--quick", "--only", "tput,big,bytes,blas,latency,memory"), {
        "tput": {"ew.map", "dask client.map + gather"},
        "big": {"ew.Executor", "ew.Executor, its first call (cold memory)", "peer wire",
                "bare TCP echo + AES-256-GCM, same minute"},
        "bytes": {"peer wire"},
        "blas": {"ew.map", f"{_PPE}(2).map", "dask client.map", "the same loop in the caller (BLAS on every core)"},
        "latency": {"ew.Executor", _PPE, "loky reusable executor"},
        "memory": {"ew.Executor", _PPE, "loky reusable executor"},
    }, timeout_s=900, long=True),
    Case("joblib_gridsearch.py", ("--quick",), {
        "fit": {"elsewhere, ew.local()", "elsewhere, job path (as on SLURM)", "joblib loky (default)",
                "dask LocalCluster", "sequential (n_jobs=1)"},
    }, timeout_s=900, long=True),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.timeout(c.timeout_s + 60),
                                                id=c.script.removesuffix(".py") + ("-long" if c.long else ""))
                                   for c in CASES])  # fmt: skip
def test_each_benchmark_measures_every_figure_of_the_groups_it_runs(case: Case, tmp_path: Path) -> None:
    if case.long and not LONG:
        pytest.skip("a long run (a minute or more): ELSEWHERE_BENCH_ALL=1 runs it")
    for found, why_not in case.needs:
        if found() is None:
            pytest.skip(why_not())
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, str(BENCH / case.script), *case.args, "--json", str(out)],
                         capture_output=True, text=True, timeout=case.timeout_s, cwd=tmp_path)  # fmt: skip
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-3000:]
    assert not [w for w in ("Traceback", "failed", "timed out") if w in said], said[-3000:]
    figures = json.loads(out.read_text())["figures"]
    measured: dict[str, set[str]] = {}
    for f in figures:
        measured.setdefault(f["group"], set()).add(f["system"])
    assert set(measured) == set(case.systems), said[-3000:]
    for group, systems in case.systems.items():
        assert measured[group] >= systems, (group, systems - measured[group], said[-3000:])
    bad = [f for f in figures if not isinstance(f["value"], (int, float)) or not math.isfinite(f["value"])
           or f["value"] < 0]  # fmt: skip
    assert not bad, bad
