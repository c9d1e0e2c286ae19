"""Start-up of a 2-rank communicating job to its first result, against bare mpiexec.

    .venv/bin/python bench/mpi.py [--rounds 5] [--json FILE]

Side by side in one run:
- bare:      ``mpiexec -n 2 python -c "from mpi4py import MPI; ...allreduce..."``
             (the time of the whole command);
- local:     ``ew.submit_communicating(f, ranks=2, on=ew.local())`` to the first
             result (every result durable in the job folder; target <= 1.5x bare);
- slurm:     the same on the real SLURM (``srun --mpi=pmix`` inside one sbatch),
             when SLURM runs here (no target: the scheduler's own latency dominates).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_time, median, table, venv_python, verdict

SNIPPET = "from mpi4py import MPI; c = MPI.COMM_WORLD; c.allreduce(c.Get_rank())"


def allreduce(_):
    import elsewhere as ew

    comm = ew.task().comm
    return comm.allreduce(ew.task().rank)


def bare_s() -> float:
    argv = ["mpiexec", "-n", "2"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["--oversubscribe", venv_python(), "-c", SNIPPET]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - t0


def elsewhere_s(on_slurm: bool) -> float:
    code = f"""
import os, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import elsewhere as ew
from mpi import allreduce
cl = ew.slurm(partition="debug", status_interval_s=0.1) if {on_slurm!r} else ew.local()
t0 = time.perf_counter()
job = ew.submit_communicating(allreduce, args=(0,), ranks=2, on=cl)
job.wait(timeout=120, progress=False, poll_interval_s=0.05)
print("RESULT", time.perf_counter() - t0, job.results())
"""
    with tempfile.TemporaryDirectory() as home:
        out = subprocess.run([venv_python(), "-c", code], capture_output=True, text=True, timeout=180,
                             env={**os.environ, "ELSEWHERE_HOME": home})
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(out.stderr[-2000:])
    return float(line.split()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    a = p.parse_args()
    import shutil

    from report import Figures

    record = Figures("mpi", sys.argv[1:])
    print(f"# bench/mpi.py: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, {a.rounds} round(s), "
          f"load {os.getloadavg()[0]:.2f} at start", flush=True)

    if shutil.which("mpiexec") is None:
        print("no mpiexec here: apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py")
        return
    slurm = shutil.which("sbatch") is not None
    bare, local, sl = [], [], []
    for _ in range(a.rounds):  # interleaved rounds spread the machine's noise
        bare.append(bare_s())
        local.append(elsewhere_s(False))
        if slurm:
            sl.append(elsewhere_s(True))
    b = median(bare)
    rows = [["bare mpiexec -n 2 python -c ...", fmt_time(b), "1.00", "", ""],
            ["elsewhere local, submit to first result", fmt_time(median(local)),
             f"{median(local) / b:.2f}", "<= 1.5", verdict(b * 1.5 / median(local), 1.0)]]
    if sl:
        rows.append(["elsewhere on SLURM (srun --mpi=pmix)", fmt_time(median(sl)), f"{median(sl) / b:.2f}", "", ""])
    print(table(["what", "median", "x bare", "target", ""], rows))
    print(f"\nload {os.getloadavg()[0]:.2f} at end")
    if a.json:
        record.compare("start", "Two ranks, submit to the first result (an allreduce)",
                       ("ew.submit_communicating on local workers", median(local)),
                       [("bare mpiexec -n 2 python -c ...", b)], "s",
                       variants=[("the same on SLURM (srun --mpi=pmix)", median(sl) if sl else None)])  # fmt: skip
        record.write(a.json)


if __name__ == "__main__":
    main()
