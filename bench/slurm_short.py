"""Short tasks on the real SLURM, with no option set: ``ew.map`` against submitit's ``map_array``.

    .venv/bin/python bench/slurm_short.py [--tasks 1000] [--rounds 1] [--only elsewhere,submitit,start]

N tasks of 10 ms each (default 1 000), both contenders in the same run, each in a fresh
interpreter (``_common.run_child``), rounds interleaved, medians reported:

- ``elsewhere``: ``ew.map(nap, range(N), on=ew.slurm())``, no option at all: the batch backend
  sizes the array from the partition's usable CPUs (sinfo) and packs the tasks into that many
  elements, which claim them from the job's queue (``src/elsewhere/backends/packing.py``);
- ``submitit``: ``submitit.AutoExecutor(folder).map_array(nap, range(N))``, one array
  element per task (its only way), on the same partition;
- ``start``: what an array element costs before its first task, the figure the packing
  decision goes by: an array of 2 x CPUs elements that start Python and import
  ``elsewhere.worker``; the first starts after ``sbatch`` returns, a new wave every so often.

Reported per contender: the time from the call until every result is back, the array's
elements, the SLURM commands the client ran (sbatch, squeue, sinfo, ... counted by wrapper
scripts put first on PATH) and, for elsewhere, when its first element joined after sbatch.
Then the ratio (submitit's time over elsewhere's); the target is >= 50x with one sbatch.

submitit needs one element per task: on the 8 CPUs here 1 000 tasks take it about 300 s
(about 8 elements a second). ``--tasks`` scales both sides alike (``--tasks 200``: about a
minute); the ratio grows with N, so a smaller N understates it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import child_main, fmt_time, median, run_child, table, venv_python, verdict
from slurm import make_wrappers, read_log

TASK_S = 0.01  # each task sleeps this long
TARGET = 50.0  # elsewhere back this many times sooner than submitit


def nap(x: int) -> int:
    time.sleep(TASK_S)
    return x


def _cluster(partition: str | None) -> Any:
    import elsewhere as ew

    return ew.slurm(partition=partition) if partition else ew.slurm()  # no option: the point


# -- the measurements (in fresh children) ---------------------------------------------
def m_elsewhere(n: int, partition: str | None) -> dict[str, Any]:
    import elsewhere as ew

    cl = _cluster(partition)
    name = f"short-{os.getpid()}"
    t0 = time.monotonic()
    try:
        res = ew.map(nap, range(n), on=cl, name=name, keep=True, timeout=900, progress=False)
    except BaseException:
        ew.recover(name).cancel()  # only this job's own array
        raise
    t_all = time.monotonic() - t0
    job = ew.recover(name)
    subs = cl.get_job_cluster_data(job)["submissions"]
    joined = [float(m.get("joined", 0)) for m in job.handle.store.queue().members.values()]
    first = min(joined) - float(subs[0]["submitted"]) if joined else float("nan")
    return {
        "all_s": t_all,
        "ok": res == list(range(n)),
        "elements": sum(int(s["elements"]) for s in subs),
        "packing": subs[0].get("packing", ""),
        "first_join_s": first,
    }


def m_submitit(n: int, partition: str | None) -> dict[str, Any]:
    import submitit

    folder = tempfile.mkdtemp(prefix="ewbench-submitit-")
    try:
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
        params: dict[str, Any] = {
            "timeout_min": 30,
            "slurm_array_parallelism": n,
            "cpus_per_task": 1,
        }
        if partition:
            params["slurm_partition"] = partition
        ex.update_parameters(**params)
        t0 = time.monotonic()
        jobs = ex.map_array(nap, range(n))
        try:
            res = [j.result() for j in jobs]
        except BaseException:
            if jobs:
                subprocess.run(
                    ["scancel", jobs[0].job_id.split("_")[0]], check=False
                )  # our own array
            raise
        return {"all_s": time.monotonic() - t0, "ok": res == list(range(n)), "elements": len(jobs)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def m_start(elements: int, partition: str | None) -> dict[str, Any]:
    """An array of ``elements`` that start Python and import the worker: when each began."""
    folder = Path(tempfile.mkdtemp(prefix="ewbench-start-"))
    try:
        code = "import time; t = time.time(); import elsewhere.worker; print(t, time.time())"
        argv = ["sbatch", "--parsable", f"--array=0-{elements - 1}", "-o", str(folder / "out_%a.txt"),
                "-J", "ewbench-start", "--wrap", f"{venv_python()} -c {json.dumps(code)}"]  # fmt: skip
        if partition:
            argv[2:2] = ["-p", partition]
        t0 = time.time()
        job = (
            subprocess.run(argv, capture_output=True, text=True, check=True)
            .stdout.strip()
            .split(";")[0]
        )
        deadline = time.monotonic() + 300
        while len(list(folder.glob("out_*.txt"))) < elements or _listed(job):
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job], check=False)
                raise TimeoutError(f"array {job} did not end within 300 s")
            time.sleep(0.2)
        starts, imports = [], []
        for f in folder.glob("out_*.txt"):
            a, b = (float(x) for x in f.read_text().split()[:2])
            starts.append(a - t0)
            imports.append(b - a)
        starts.sort()
        return {"starts": starts, "import_s": median(imports)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _listed(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True)
    return bool(out.stdout.strip())


TABLE = {"elsewhere": m_elsewhere, "submitit": m_submitit, "start": m_start}


def measure(name: str, params: dict[str, Any], wrap_dir: Path) -> dict[str, Any]:
    log = wrap_dir / f"calls-{name}-{time.monotonic_ns()}.log"
    env = {"PATH": f"{wrap_dir}{os.pathsep}{os.environ['PATH']}", "EWBENCH_CMDLOG": str(log)}
    res = run_child(__file__, name, params, home=True, timeout_s=1800, env=env)
    res["calls"] = dict(Counter(c[1] for c in read_log(log) if not c[1].endswith("@job")))
    return res


def free_cpus(partition: str | None) -> int:
    """The partition's usable CPUs, as the backend reads them (sinfo), else 8."""
    got = _cluster(partition).free_cpus()
    return got.usable if got else 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1000, help="tasks of 10 ms (both contenders)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--partition", default=None, help="default: SLURM's default partition")
    ap.add_argument("--only", default="elsewhere,submitit,start")
    ap.add_argument(
        "--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)"
    )
    args = ap.parse_args()
    from report import Figures

    record = Figures("slurm_short", sys.argv[1:])
    if shutil.which("sbatch") is None:
        print("no sbatch on PATH: SLURM is not here (ci/services/up.sh slurm)")
        return
    want = [w.strip() for w in args.only.split(",") if w.strip()]
    try:
        import submitit  # noqa: F401
    except ImportError:
        print(
            "submitit is not installed (.venv/bin/pip install submitit): measuring elsewhere alone"
        )
        want = [w for w in want if w != "submitit"]
    cpus = free_cpus(args.partition)
    params = {
        "elsewhere": {"n": args.tasks, "partition": args.partition},
        "submitit": {"n": args.tasks, "partition": args.partition},
        "start": {"elements": 2 * cpus, "partition": args.partition},
    }
    print(f"# {args.tasks} tasks of {TASK_S * 1000:.0f} ms on SLURM partition {args.partition or '(default)'} "
          f"({cpus} usable CPUs); {args.rounds} round(s)", flush=True)  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {w: [] for w in want}
    with tempfile.TemporaryDirectory(prefix="ewbench-slurmwrap-") as tmp:
        make_wrappers(Path(tmp))
        for r in range(args.rounds):
            for w in want:
                try:
                    res = measure(w, params[w], Path(tmp))
                except Exception as exc:  # a failed contender is reported, not fatal
                    print(f"  round {r + 1} {w}: FAILED: {str(exc)[-800:]}", flush=True)
                    continue
                results[w].append(res)
                if w == "start":
                    print(f"  round {r + 1} start: first element ran Python {fmt_time(res['starts'][0])} after "
                          f"sbatch, last {fmt_time(res['starts'][-1])}", flush=True)  # fmt: skip
                else:
                    print(f"  round {r + 1} {w}: all back {fmt_time(res['all_s'])}, ok={res['ok']}, "
                          f"{res['elements']} elements, calls {json.dumps(res['calls'])}", flush=True)  # fmt: skip
    report(results, args.tasks, cpus)
    if args.json:
        figures_json(record, results, args.tasks)
        record.write(args.json)


def report(results: dict[str, list[dict[str, Any]]], n: int, cpus: int) -> None:
    def med(w: str, key: str) -> float:
        return median(r[key] for r in results.get(w, []))

    rows = []
    for w in ("elsewhere", "submitit"):
        rs = results.get(w, [])
        if rs:
            rows.append([w, str(int(med(w, "elements"))), fmt_time(med(w, "all_s")),
                         str(int(median(r["calls"].get("sbatch", 0) for r in rs))),
                         str(int(median(r["calls"].get("squeue", 0) + r["calls"].get("sacct", 0) for r in rs)))])  # fmt: skip
    if rows:
        print()
        print(table(["contender", "elements", "all back", "sbatch", "status calls"], rows))
    starts = [r["starts"] for r in results.get("start", [])]
    if starts:
        first = median(s[0] for s in starts)
        # the second wave of elements starts when the first has ended: its first start, less the
        # first wave's, is what one element of an array costs on a busy partition
        wave = median(s[cpus] - s[0] for s in starts if len(s) > cpus)
        print()
        print(f"an array element here: Python runs {fmt_time(first)} after sbatch, the worker imported "
              f"{fmt_time(med('start', 'import_s'))} later; a new wave of {cpus} every {fmt_time(wave)} "
              f"(elsewhere's ELEMENT_START_S is the second figure)")  # fmt: skip
    ew_rs = results.get("elsewhere", [])
    if ew_rs:
        print(f"elsewhere's packing: {ew_rs[0].get('packing')}; its first element joined "
              f"{fmt_time(med('elsewhere', 'first_join_s'))} after sbatch")  # fmt: skip
        targets = []
        sb = median(r["calls"].get("sbatch", 0) for r in ew_rs)
        targets.append(
            ["sbatch calls for the job", "<= 2", f"{sb:.0f}", "PASS" if sb <= 2 else "FAIL"]
        )
        el = med("elsewhere", "elements")
        targets.append(
            ["array elements", f"< {n} tasks", f"{el:.0f}", "PASS" if el < n else "FAIL"]
        )
        if results.get("submitit"):
            ratio = med("submitit", "all_s") / med("elsewhere", "all_s")
            targets.append(["all back, submitit's time / elsewhere's", f">= {TARGET:.0f}x", f"{ratio:.1f}x",
                            verdict(ratio, TARGET)])  # fmt: skip
        if not all(r["ok"] for r in ew_rs):
            targets.append(["results right", "all", "NO", "FAIL"])
        print()
        print(table(["target", "wanted", "measured", "verdict"], targets))


def figures_json(fig: Any, results: dict[str, list[dict[str, Any]]], n: int) -> None:
    """The figures measured, for ``--json`` (``fig``: a ``report.Figures``)."""

    def med(w: str, key: str) -> float:
        return median(r[key] for r in results.get(w, []))

    what = f"{n:_} tasks of {TASK_S * 1000:.0f} ms, no option".replace("_", " ")
    fig.compare("short", f"{what}: all results back", ("ew.map (slurm, defaults)", med("elsewhere", "all_s")),
                [("submitit map_array", med("submitit", "all_s"))], "s")  # fmt: skip
    for w, system in (
        ("elsewhere", "ew.map (slurm, defaults)"),
        ("submitit", "submitit map_array"),
    ):
        if results.get(w):
            fig.add(
                "short",
                f"{what}: array elements",
                system,
                med(w, "elements"),
                "",
                elsewhere=w == "elsewhere",
            )
    if results.get("start"):
        fig.add("short", "an array element: Python runs after sbatch", "SLURM",
                median(r["starts"][0] for r in results["start"]), "s")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(TABLE, sys.argv[2:])
    else:
        main()
