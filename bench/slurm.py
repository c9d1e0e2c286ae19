"""elsewhere on the real SLURM, side by side with submitit's ``map_array``.

    .venv/bin/python bench/slurm.py [--n 1000] [--rounds 1] [--only elsewhere,submitit,chunked] [--json FILE]

For N trivial tasks (default 1 000) it measures, per contender:

- submit: from the call that submits until it returns (payload written, sbatch done);
- all back: from that call until every result is in the caller's hands;
- the scheduler commands called (sbatch, squeue, sacct, scancel, scontrol, ...), counted by
  wrapper scripts put first on PATH in a temporary folder: each appends one line (time,
  name, arguments) to a log, then execs the real command. Calls made by the client and calls
  made inside the jobs (submitit's job script runs ``srun``) are counted apart.

Contenders: ``elsewhere`` (``ew.submit(f, range(N), on=ew.slurm(partition=...))``, defaults:
the tasks packed into as many array elements as the partition's usable CPUs, which claim them;
the elements are counted from the job's submissions), ``submitit`` (``AutoExecutor.map_array``, one array element per
task as well) and, for information, ``chunked`` (elsewhere with ``tasks_per_element`` so the
array has as many elements as the partition has CPUs). Each measurement runs in a fresh
interpreter (``_common.run_child``); rounds are interleaved; the median is reported.

Targets (reported, never an exit status): elsewhere calls sbatch once for the N tasks (twice if
the array had to be split); at most one status call per poll interval whatever the number of
jobs (the shortest gap between two squeue calls is at least the interval); time until all
results are back no worse than 1.0x submitit's.
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
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import child_main, fmt_time, median, run_child, table, verdict

SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun", "sstat")
STATUS_INTERVAL_S = 5.0  # elsewhere's default status_interval_s


def noop(x: int) -> int:
    return x


# -- wrappers that count scheduler commands ------------------------------------------
def make_wrappers(folder: Path) -> dict[str, str]:
    """One logging wrapper per SLURM command found on PATH; name -> real path."""
    real: dict[str, str] = {}
    for name in SLURM_COMMANDS:
        path = shutil.which(name)
        if path is None:
            continue
        real[name] = path
        script = folder / name
        script.write_text(
            "#!/bin/sh\n"
            # a call from inside a job (SLURM_JOB_ID set) is the job's own, not the client's
            f'printf "%s {name}%s %s\\n" "$(date +%s.%N)" "${{SLURM_JOB_ID:+@job}}" "$*" '
            '>> "$EWBENCH_CMDLOG"\n'
            f'exec {path} "$@"\n'
        )
        script.chmod(0o755)
    return real


def read_log(path: Path) -> list[tuple[float, str, str]]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        t, _, rest = line.partition(" ")
        name, _, args = rest.partition(" ")
        try:
            out.append((float(t), name, args))
        except ValueError:
            continue
    return out


# -- the measurements (in fresh children) ---------------------------------------------
def m_elsewhere(n: int, partition: str, tasks_per_element: int | None = None) -> dict[str, Any]:
    import elsewhere as ew

    cl = ew.slurm(
        partition=partition,
        tasks_per_element=tasks_per_element,
        status_interval_s=STATUS_INTERVAL_S,
    )
    t0 = time.monotonic()
    job = ew.submit(noop, range(n), on=cl, name=f"bench-{os.getpid()}")
    t_submit = time.monotonic() - t0
    try:
        job.wait(timeout=900, progress=False)
        res = job.results()
        t_all = time.monotonic() - t0
    except BaseException:
        job.cancel()  # only this job's own array
        raise
    ok = res == list(range(n))
    subs = cl.get_job_cluster_data(job)["submissions"]
    return {
        "submit_s": t_submit,
        "all_s": t_all,
        "ok": ok,
        "elements": sum(s["elements"] for s in subs),
        "native_ids": [s["native_id"] for s in subs],
    }


def m_submitit(n: int, partition: str) -> dict[str, Any]:
    import submitit

    folder = tempfile.mkdtemp(prefix="ewbench-submitit-")
    try:
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
        ex.update_parameters(
            slurm_partition=partition, timeout_min=30, slurm_array_parallelism=n, cpus_per_task=1
        )
        t0 = time.monotonic()
        jobs = ex.map_array(noop, range(n))
        t_submit = time.monotonic() - t0
        try:
            res = [j.result() for j in jobs]
            t_all = time.monotonic() - t0
        except BaseException:
            if jobs:
                subprocess.run(
                    ["scancel", jobs[0].job_id.split("_")[0]], check=False
                )  # our own array
            raise
        return {
            "submit_s": t_submit,
            "all_s": t_all,
            "ok": res == list(range(n)),
            "elements": len(jobs),
            "native_ids": sorted({j.job_id.split("_")[0] for j in jobs}),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


TABLE = {"elsewhere": m_elsewhere, "submitit": m_submitit}


def measure(name: str, params: dict[str, Any], wrap_dir: Path) -> dict[str, Any]:
    log = wrap_dir / f"calls-{name}-{time.monotonic_ns()}.log"
    env = {"PATH": f"{wrap_dir}{os.pathsep}{os.environ['PATH']}", "EWBENCH_CMDLOG": str(log)}
    fn = "submitit" if name == "submitit" else "elsewhere"
    res = run_child(__file__, fn, params, home=True, timeout_s=1200, env=env)
    calls = read_log(log)
    res["calls"] = dict(Counter(c[1] for c in calls if not c[1].endswith("@job")))
    res["job_calls"] = dict(Counter(c[1][:-4] for c in calls if c[1].endswith("@job")))
    status_t = [t for t, cmd, _ in calls if cmd == "squeue"]
    gaps = [b - a for a, b in pairwise(status_t)]
    res["min_status_gap_s"] = min(gaps) if gaps else float("nan")
    res["status_per_call_jobs"] = max(
        (len(a.split(",")) for _, cmd, a in calls if cmd == "squeue"), default=0
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--only", default="elsewhere,submitit,chunked")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    args = ap.parse_args()
    from report import Figures

    record = Figures("slurm", sys.argv[1:])
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
    cpus = 8
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-p", args.partition, "-o", "%C"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()  # A/I/O/T
        cpus = int(out.split("/")[-1]) if out else cpus
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    params = {
        "elsewhere": {"n": args.n, "partition": args.partition},
        "submitit": {"n": args.n, "partition": args.partition},
        "chunked": {
            "n": args.n,
            "partition": args.partition,
            "tasks_per_element": -(-args.n // cpus),
        },
    }
    others = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    print(
        f"# {args.n} trivial tasks on SLURM partition {args.partition!r} ({cpus} CPUs); "
        f"{len(others)} other job(s) in the queue at start; {args.rounds} round(s)",
        flush=True,
    )
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
                print(
                    f"  round {r + 1} {w}: submit {fmt_time(res['submit_s'])}, all back "
                    f"{fmt_time(res['all_s'])}, ok={res['ok']}, calls {json.dumps(res['calls'])}, "
                    f"inside jobs {json.dumps(res['job_calls'])}",
                    flush=True,
                )
    report(results, args.n)
    if args.json:
        figures_json(record, results, args.n)
        record.write(args.json)


SYSTEMS = {"elsewhere": "ew.submit (defaults)", "chunked": "ew.submit (tasks_per_element = tasks / CPUs)",
           "submitit": "submitit map_array"}  # fmt: skip


def figures_json(fig, results: dict[str, list[dict[str, Any]]], n: int) -> None:
    """The figures of the contenders measured, for ``--json`` (``fig``: a ``report.Figures``)."""

    def med(w: str, key: str) -> float:
        return median(r[key] for r in results.get(w, []))

    what = f"{n:_} no-op tasks".replace("_", " ")
    variants = [(SYSTEMS["chunked"], med("chunked", "all_s"))]
    fig.compare("all back", f"{what}: all results back", (SYSTEMS["elsewhere"], med("elsewhere", "all_s")),
                [(SYSTEMS["submitit"], med("submitit", "all_s"))], "s", variants=variants)  # fmt: skip
    fig.compare("submit", f"{what}: time to submit", (SYSTEMS["elsewhere"], med("elsewhere", "submit_s")),
                [(SYSTEMS["submitit"], med("submitit", "submit_s"))], "s",
                variants=[(SYSTEMS["chunked"], med("chunked", "submit_s"))])  # fmt: skip
    for w, system in SYSTEMS.items():
        rs = results.get(w, [])
        if rs:
            fig.add("calls", f"{what}: array elements", system, median(r["elements"] for r in rs), "",
                    elsewhere=w != "submitit")  # fmt: skip
            fig.add("calls", f"{what}: sbatch calls", system, median(r["calls"].get("sbatch", 0) for r in rs), "",
                    elsewhere=w != "submitit")  # fmt: skip
            fig.add("calls", f"{what}: status calls (squeue, sacct) while waiting", system,
                    median(r["calls"].get("squeue", 0) + r["calls"].get("sacct", 0) for r in rs), "",
                    elsewhere=w != "submitit")  # fmt: skip


def report(results: dict[str, list[dict[str, Any]]], n: int) -> None:
    def med(w: str, key: str) -> float:
        return median(r[key] for r in results.get(w, []))

    def calls(w: str, cmd: str) -> str:
        got = [r["calls"].get(cmd, 0) for r in results.get(w, [])]
        return str(int(median(got))) if got else "n/a"

    rows = []
    ref = "submitit" if results.get("submitit") else None
    for w, rs in results.items():
        if not rs:
            continue
        rows.append(
            [
                w,
                str(int(median(r["elements"] for r in rs))),
                fmt_time(med(w, "submit_s")),
                fmt_time(med(w, "all_s")),
                f"{med(ref, 'all_s') / med(w, 'all_s'):.2f}" if ref else "n/a",
                calls(w, "sbatch"),
                calls(w, "squeue"),
                calls(w, "sacct"),
                str(
                    sum(
                        int(median(r["calls"].get(c, 0) for r in rs))
                        for c in SLURM_COMMANDS
                        if c not in ("sbatch", "squeue", "sacct")
                    )
                ),
                str(int(median(sum(r["job_calls"].values()) for r in rs))),
                fmt_time(med(w, "min_status_gap_s")),
            ]
        )
    print()
    print(
        table(
            [
                "contender",
                "elements",
                "submit",
                "all back",
                "submitit/this (all back)",
                "sbatch",
                "squeue",
                "sacct",
                "other cmds",
                "cmds inside jobs",
                "min gap between squeue",
            ],
            rows,
        )
    )
    print()
    ew_rs = results.get("elsewhere", [])
    targets = []
    if ew_rs:
        sb = median(r["calls"].get("sbatch", 0) for r in ew_rs)
        targets.append(
            ["sbatch calls for the tasks", "<= 2", f"{sb:.0f}", "PASS" if sb <= 2 else "FAIL"]
        )
        gap = med("elsewhere", "min_status_gap_s")
        ok = gap != gap or gap >= 0.9 * STATUS_INTERVAL_S
        targets.append(
            [
                "status calls: at most one per poll interval",
                f"gap >= {STATUS_INTERVAL_S:.0f} s",
                fmt_time(gap),
                "PASS" if ok else "FAIL",
            ]
        )
        if results.get("submitit"):
            ratio = med("submitit", "all_s") / med("elsewhere", "all_s")
            targets.append(
                [
                    "time until all results back vs submitit",
                    ">= 1.00x",
                    f"{ratio:.2f}x",
                    verdict(ratio, 1.0),
                ]
            )
        if not all(r["ok"] for r in ew_rs):
            targets.append(["results right", "all", "NO", "FAIL"])
    if targets:
        print(table(["target", "wanted", "measured", "verdict"], targets))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(TABLE, sys.argv[2:])
    else:
        main()
