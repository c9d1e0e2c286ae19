"""A scikit-learn GridSearchCV through joblib: the elsewhere backend on local workers against
joblib's default (loky) and dask's joblib backend, side by side in one run.

    .venv/bin/python bench/joblib_gridsearch.py [--rounds 3] [--quick] [--cores 2] [--json FILE]

An SVC on 1000 of scikit-learn's digits, a grid of 4 C x 5 gamma with 5-fold cross-validation:
100 fits of some 20-80 ms each. Every measurement runs in a fresh interpreter (a fresh
ELSEWHERE_HOME for elsewhere); each child fits the search twice: "cold" (the workers start
and import scikit-learn during the fit; dask's LocalCluster start is included) and "warm"
(the same search again, workers up). Rounds are interleaved; medians are reported. The
systems, each with ``--cores`` workers (2):

- sequential: ``n_jobs=1`` in the caller (what the fits cost without parallelism);
- loky: ``parallel_config(backend="loky", n_jobs=cores)``, joblib's default;
- elsewhere: ``parallel_config(backend="elsewhere", on=ew.local(cores=cores))``, n_jobs=-1;
- elsewhere, job path: the same on a local cluster without the capability "stream", so the
  backend takes the path of batch schedulers (jobs of ew.submit): what that path costs;
- dask: ``LocalCluster(n_workers=cores, threads_per_worker=1, processes=True)`` and
  ``parallel_config(backend="dask")`` (if dask.distributed is installed).

"ratio" is the alternative's time divided by elsewhere's (above 1: elsewhere is faster).
Every system must find the same best parameters and scores (checked, reported).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

pc = time.perf_counter
GRID = {"C": [0.5, 1.0, 5.0, 10.0], "gamma": [0.0005, 0.001, 0.002, 0.005, 0.01]}
CV = 5
N_SAMPLES = 1000


def _search():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = load_digits(return_X_y=True)
    X, y = X[:N_SAMPLES], y[:N_SAMPLES]

    def fit(n_jobs):
        gs = GridSearchCV(SVC(), GRID, cv=CV, n_jobs=n_jobs).fit(X, y)
        return gs

    return fit


def _out(cold: float, warm: float, gs, **extra) -> dict:
    return {"cold": cold, "warm": warm, "best": repr(sorted(gs.best_params_.items())),
            "scores": [round(float(s), 6) for s in gs.cv_results_["mean_test_score"]], **extra}  # fmt: skip


def _twice(fit, n_jobs) -> tuple[float, float, object]:
    t0 = pc()
    fit(n_jobs)
    t1 = pc()
    gs = fit(n_jobs)
    return t1 - t0, pc() - t1, gs


# -- children -----------------------------------------------------------------------------------
def child_fit(system: str, cores: int) -> dict:
    import joblib

    fit = _search()
    if system == "sequential":
        cold, warm, gs = _twice(fit, 1)
        return _out(cold, warm, gs)
    if system == "loky":
        with joblib.parallel_config(backend="loky", n_jobs=cores):
            cold, warm, gs = _twice(fit, None)
        return _out(cold, warm, gs)
    if system in ("elsewhere", "elsewhere-jobs"):
        from _common import stop_workers

        import elsewhere as ew
        import elsewhere.joblib
        from elsewhere.backends.local import LocalCluster

        class JobsOnly(LocalCluster):
            """Local workers without "stream": the backend's batch-scheduler path."""

            capabilities = frozenset({"communicating"})

        on = ew.local(cores=cores) if system == "elsewhere" else JobsOnly(cores)
        with joblib.parallel_config(backend="elsewhere", on=on):
            cold, warm, gs = _twice(fit, None)
        stop_workers(os.environ["ELSEWHERE_HOME"], 5.0, ew.local().shutdown)
        return _out(cold, warm, gs)
    if system == "dask":
        from dask.distributed import Client, LocalCluster

        t0 = pc()
        cluster = LocalCluster(n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        start = pc() - t0
        try:
            with joblib.parallel_config(backend="dask"):
                cold, warm, gs = _twice(fit, None)
        finally:
            client.close()
            cluster.close()
        return _out(cold + start, warm, gs, start=start)
    raise ValueError(system)


TABLE = {"fit": child_fit}


# -- the parent ---------------------------------------------------------------------------------
def systems() -> list[str]:
    from _common import have

    out = ["sequential", "loky", "elsewhere", "elsewhere-jobs"]
    if have("dask") and have("distributed"):
        out.append("dask")
    return out


LABELS = {
    "sequential": "sequential (n_jobs=1)",
    "loky": "joblib loky (default)",
    "elsewhere": "elsewhere, ew.local()",
    "elsewhere-jobs": "elsewhere, job path (as on SLURM)",
    "dask": "dask LocalCluster",
}


def collect(rounds: int, cores: int) -> dict[str, list[dict]]:
    from _common import ChildFailed, run_child

    got: dict[str, list[dict]] = {}
    for r in range(rounds):
        t_round = pc()
        for system in systems():
            try:
                params = {"system": system, "cores": cores}
                home = system.startswith("elsewhere")
                got.setdefault(system, []).append(run_child(__file__, "fit", params, home=home, timeout_s=900))
            except ChildFailed as exc:
                print(f"  {system}: {exc}", file=sys.stderr)
        print(f"  round {r + 1}/{rounds}: {pc() - t_round:.0f} s", file=sys.stderr)
    return got


def report(got: dict[str, list[dict]]) -> str:
    from _common import fmt_time, median, table

    def med(system: str, field: str) -> float:
        return median(r.get(field) for r in got.get(system, []))

    def spread(system: str, field: str) -> str:
        xs = [r[field] for r in got.get(system, []) if field in r]
        return f"{fmt_time(min(xs))}-{fmt_time(max(xs))}" if len(xs) > 1 else ""

    ref = next((r for r in got.get("sequential", [])), None)
    rows = []
    for system in got:
        runs = got[system]
        same = all(r["best"] == ref["best"] and r["scores"] == ref["scores"] for r in runs) if ref else None
        rows.append([LABELS.get(system, system), fmt_time(med(system, "cold")), spread(system, "cold"),
                     fmt_time(med(system, "warm")), spread(system, "warm"),
                     f"{med(system, '_others'):.0%}", {True: "yes", False: "NO", None: "?"}[same]])  # fmt: skip
    figures = table(["system", "cold (median)", "cold min-max", "warm (median)", "warm min-max",
                     "others' CPU", "same results"], rows)  # fmt: skip
    ratio_rows = []
    for field in ("cold", "warm"):
        ours = med("elsewhere", field)
        for alt in ("sequential", "loky", "dask", "elsewhere-jobs"):
            if alt in got:
                theirs = med(alt, field)
                ratio_rows.append([field, f"elsewhere {fmt_time(ours)}", f"{LABELS[alt]} {fmt_time(theirs)}",
                                   f"{theirs / ours:.2f}"])  # fmt: skip
    ratios = table(["fit", "elsewhere", "alternative", "ratio (alt / elsewhere)"], ratio_rows)
    return figures + "\n\n" + ratios


def main(argv: list[str]) -> int:
    import argparse

    if argv[:1] == ["--child"]:
        from _common import child_main

        child_main(TABLE, argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3, 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="one round")
    p.add_argument("--cores", type=int, default=2, help="workers of each system (default 2)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    args = p.parse_args(argv)
    from report import Figures

    record = Figures("joblib_gridsearch", argv)
    rounds = args.rounds or (1 if args.quick else 3)
    n_fits = len(GRID["C"]) * len(GRID["gamma"]) * CV
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"GridSearchCV(SVC) on {N_SAMPLES} digits: {n_fits} fits, {args.cores} workers, {rounds} round(s), "
          f"load {load} at the start", file=sys.stderr)  # fmt: skip
    got = collect(rounds, args.cores)
    print(report(got))
    with open("/proc/loadavg") as f:
        print(f"\nload {f.read().split()[0]} at the end", file=sys.stderr)
    if args.json:
        from _common import median

        for field, when in (("cold", "cold (the workers start during the fit)"), ("warm", "warm")):
            def med(system: str, field: str = field) -> float:
                return median(r.get(field) for r in got.get(system, []))

            record.compare("fit", f"GridSearchCV of an SVC, {n_fits} fits, {when}", (LABELS["elsewhere"], med("elsewhere")),
                           [(LABELS[s], med(s)) for s in ("loky", "dask", "sequential")], "s",
                           variants=[(LABELS["elsewhere-jobs"], med("elsewhere-jobs"))])  # fmt: skip
        record.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
