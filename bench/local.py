"""The local backend against what a user would pick instead, side by side.

    .venv/bin/python bench/local.py [--rounds 3] [--quick] [--only cold10k,first,...] [--calls N] [--json FILE]

Measures in one run, on this machine, each measurement in a fresh interpreter
(rounds interleaved, median reported), every elsewhere job durable on disk and
its workers detached, ``on=ew.local(cores=2)``:

1. ``cold10k``: 10 000 no-op tasks with no workers running beforehand (fresh
   ``ELSEWHERE_HOME``): ``ew.map``, ``ew.map(seed=False)``, ``ew.submit(...)
   .wait(); .get()`` against ProcessPoolExecutor(2) one submit per task and
   ``ProcessPoolExecutor.map`` with a good chunksize, pool start included;
   also multiprocessing.Pool and loky. A job from cold is one sample of ~30 ms: each
   ``map`` is timed ``COLD_REPS`` times a round, in turn with the others.
2. ``cold100k``: the same with 100 000 tasks (against the ``map`` APIs).
3. ``warm10k``: 10 000 no-op tasks on warm workers (one job run first, and
   the workers idle again) against warm pools' ``map``; each side's figure
   for a round is the median of ``WARM_REPS`` jobs (a single job of ~10 ms
   moves by half with the machine); elsewhere's variants take turns, each
   first as often (the first jobs after the warm-up ran a few ms slower).
   This machine's pace moves 2x within minutes, so the lead over
   ProcessPoolExecutor is also measured *paired*: a warm ProcessPoolExecutor(2)
   in elsewhere's own process runs its ``map`` right after each ``ew.map``
   job, and the median of those pairs' ratios is judged too. And, as a loop of
   maps calls them, an ``ew.map`` right after another (its workers still leaving
   that one) against a warm pool's ``map`` right after another (for information).
4. ``first``: submit to the first result with no workers running, against
   dask.distributed ``LocalCluster(n_workers=2, processes=True,
   threads_per_worker=1)`` start-up to first result (and ProcessPoolExecutor's).
5. ``cpu``: 20 tasks of 0.5 s of CPU time each against the same work in two
   bare ``multiprocessing.Process`` (10 tasks each), measured just before.
6. ``big``: one task whose argument is a 100 MB NumPy array (returns its sum),
   on warm workers, against a warm ProcessPoolExecutor.
7. ``latency``: ``ew.Executor``'s result latency, from a call's end in the worker
   to its future's completion in the caller, lone calls and 5 no-ops behind a
   1 s call on one worker, against ProcessPoolExecutor's and loky's (see
   ``_executors.py``).
8. ``memory``: the caller's peak RSS and wall time for a stream of ``--calls``
   ``abs`` calls (default 200 000; 1 000 000 is the full figure; at most
   10 000 futures alive) and of 2 000 calls returning 1 MB each, against
   ProcessPoolExecutor and loky.
9. ``large``: 1 000 000 and 10 000 000 no-op tasks from cold through ``ew.map`` against
   ``ProcessPoolExecutor.map`` with a good chunksize (its pool start included): the time and
   the caller's peak RSS.
10. ``sweep``: the throughput of the same from 1 to 10 000 000 tasks (powers of ten), against
    ProcessPoolExecutor, multiprocessing.Pool and loky's ``map`` and, up to 100 000 tasks,
    ProcessPoolExecutor's one submit per task (``--only sweep`` includes ``large``; with
    ``--quick``, 10 000 000 only for the group ``large``). ``bench/report.py`` plots it.

``--json FILE`` also writes the figures to FILE for ``bench/report.py`` (bench/README.md).

"ratio" is always the alternative's time over elsewhere's (its speed relative
to the alternative): above 1, elsewhere is faster (for ``latency`` and
``memory``, the alternative's latency or RSS over elsewhere's). A FAIL is reported, never
turned into an exit status: this is a benchmark, not a test.

The task functions live in ``_tasks.py``, a module of their own that workers
import by reference (``bench/`` is on the job's ``sys.path``).
"""

from __future__ import annotations

import os
import sys
import time

import _executors

# -- task functions (imported by workers as _tasks.<name>: see _tasks.py) --------
from _tasks import arr_sum, noop, spin_cpu

# -- measurements (run in a fresh child process each) ------------------------------
pc = time.perf_counter
W = 2  # workers / cores everywhere
WARM_REPS = 20  # warm jobs per round and side (their median; elsewhere's variants take turns)
COLD_REPS = 3  # cold 10k jobs per round and side, each in a fresh process (the figure: their median)


def _chunk(n: int) -> int:
    """A good chunksize: multiprocessing.Pool.map's own rule (4 chunks per worker)."""
    return max(1, -(-n // (4 * W)))


def _ew():
    import elsewhere as ew

    # "after their imports": the package loads its API on first use, so touch it here (the
    # first call of a fresh interpreter would pay some 100 ms of imports inside the clock,
    # where ProcessPoolExecutor's are paid by the import of concurrent.futures before it)
    for name in ("map", "submit", "Executor", "local"):
        getattr(ew, name)
    return ew, ew.local(cores=W)


def _check(vals, n):
    assert len(vals) == n and vals[-1] == n - 1, (len(vals), vals[-1:])


def _stop(ew):
    from _common import stop_workers

    return stop_workers(os.environ["ELSEWHERE_HOME"], 5.0, ew.local().shutdown)


def _wait_idle(cl, k: int = W, timeout_s: float = 1.0) -> float:
    """Wait until ``k`` workers of the pool are idle again; seconds waited.

    Waiting the whole ``timeout_s`` means the pool lost a worker: purging a
    finished job (as ``ew.map`` does) kills a worker that has not yet left it.
    """
    idle = cl.pool_dir() / "idle"
    t0 = pc()
    while pc() - t0 < timeout_s:
        if len(os.listdir(idle)) >= k:
            break
        time.sleep(0.002)
    return pc() - t0


def _warm(ew, cl, fn, xs) -> None:
    """Run one job so that ``W`` workers are warm and idle afterwards.

    The job is purged only once its workers are idle again: purging it
    earlier (as ``ew.map`` does) can kill a worker that has not left yet.
    """
    job = ew.submit(fn, xs, on=cl)
    job.wait(progress=False)
    job.results()
    _wait_idle(cl)
    job.purge()


def _ensure_warm(ew, cl, fn, xs) -> int:
    """Warm the pool again if it lost a worker; 1 if it had, else 0."""
    if _wait_idle(cl) < 1.0:
        return 0
    _warm(ew, cl, fn, xs)
    return 1


def _ew_run(ew, cl, variant: str, fn, xs) -> tuple[float, list, dict]:
    """One elsewhere job of ``variant``; (seconds, values, extra timings)."""
    extra = {}
    if variant in ("map", "map_noseed"):
        kw = {"seed": False} if variant == "map_noseed" else {}
        t0 = pc()
        vals = ew.map(fn, xs, on=cl, progress=False, **kw)
        t = pc() - t0
    elif variant == "map_b2b":  # right after another, as a loop of maps calls it: its workers
        ew.map(fn, xs, on=cl, progress=False)  # are still leaving that one
        t0 = pc()
        vals = ew.map(fn, xs, on=cl, progress=False)
        t = pc() - t0
    elif variant == "submit":
        t0 = pc()
        job = ew.submit(fn, xs, on=cl)
        extra["t_submit"] = pc() - t0
        job.wait(progress=False)
        vals = job.get()
        t = pc() - t0
        t1 = pc()
        job.purge()
        extra["t_purge"] = pc() - t1
    elif variant == "executor":
        t0 = pc()
        ex = ew.Executor(on=cl)
        futs = [ex.submit(fn, x) for x in xs]
        vals = [f.result() for f in futs]
        t = pc() - t0
        ex.shutdown()
    else:
        raise ValueError(variant)
    return t, vals, extra


def m_ew_cold(n: int, variant: str) -> dict:
    ew, cl = _ew()
    try:
        xs = list(range(n))
        t, vals, extra = _ew_run(ew, cl, variant, noop, xs)
        _check(vals, n)
        return {"t": t, **extra}
    finally:
        _stop(ew)


def m_ew_warm(n: int, variants: list[str]) -> dict:
    import concurrent.futures as cf

    ew, cl = _ew()
    ppe = cf.ProcessPoolExecutor(W)  # the paired alternative: idle while elsewhere's jobs run
    try:
        xs = list(range(n))
        _warm(ew, cl, noop, xs)
        _check(list(ppe.map(noop, xs, chunksize=_chunk(n))), n)
        out: dict = {"lost": 0}
        ts: dict[str, list[float]] = {v: [] for v in variants}
        pairs: list[tuple[float, float]] = []  # (ew.map, the PPE.map just after it)
        spaced = [v for v in variants if v != "map_b2b"]  # (those right after another come last:
        # what a pair leaves, its workers still making their files for the next job, would weigh
        # on the job after it)
        for rep in range(WARM_REPS):  # the variants in turn, each first as often: the jobs just
            # after the warm-up run beside its purge and the folders made to replace it
            for v in spaced[rep % len(spaced) :] + spaced[: rep % len(spaced)]:
                out["lost"] += _ensure_warm(ew, cl, noop, xs)
                t, vals, _ = _ew_run(ew, cl, v, noop, xs)
                _check(vals, n)
                ts[v].append(t)
                if v == "map":
                    time.sleep(0.01)  # idle between jobs, as in m_pool_warm
                    t0 = pc()
                    vals = list(ppe.map(noop, xs, chunksize=_chunk(n)))
                    pairs.append((t, pc() - t0))
                    _check(vals, n)
        # (a quarter as many: on a disk where a new file costs more the more were removed in the
        # last minute, their pairs' jobs would slow the rest of the run)
        for _ in range(WARM_REPS // 4 if "map_b2b" in variants else 0):
            out["lost"] += _ensure_warm(ew, cl, noop, xs)
            time.sleep(0.01)
            t, vals, _ = _ew_run(ew, cl, "map_b2b", noop, xs)
            _check(vals, n)
            ts["map_b2b"].append(t)
        for v in variants:
            out[v] = sorted(ts[v])[len(ts[v]) // 2]
        if pairs:
            out["ppe_paired"] = sorted(p for _, p in pairs)[len(pairs) // 2]
            out["paired_map"] = sorted(p / e for e, p in pairs)[len(pairs) // 2]
        return out
    finally:
        ppe.shutdown(wait=True)
        _stop(ew)


def m_ew_first(variant: str) -> dict:
    ew, cl = _ew()
    try:
        if variant == "submit":
            t0 = pc()
            job = ew.submit(noop, [7], on=cl)
            job.wait(progress=False)
            vals = job.results()
            t = pc() - t0
            job.purge()
        else:
            t, vals, _ = _ew_run(ew, cl, variant, noop, [7])
        assert vals == [7], vals
        return {"t": t}
    finally:
        _stop(ew)


def _pool_api(system: str):
    """(start, submit-each, map(xs, chunksize), close) for a standard pool."""
    if system == "ppe":
        import concurrent.futures as cf

        def start():
            return cf.ProcessPoolExecutor(W)

        def each(p, xs):
            fs = [p.submit(noop, x) for x in xs]
            return [f.result() for f in fs]

        def pmap(p, xs, cs):
            return list(p.map(noop, xs, chunksize=cs))

        def close(p):
            p.shutdown(wait=True)
    elif system == "mp":
        import multiprocessing as mp

        def start():
            return mp.Pool(W)

        def each(p, xs):
            rs = [p.apply_async(noop, (x,)) for x in xs]
            return [r.get() for r in rs]

        def pmap(p, xs, cs):
            return p.map(noop, xs, chunksize=cs)

        def close(p):
            p.close()
            p.join()
    elif system == "loky":
        import loky

        def start():
            return loky.get_reusable_executor(max_workers=W)

        def each(p, xs):
            fs = [p.submit(noop, x) for x in xs]
            return [f.result() for f in fs]

        def pmap(p, xs, cs):
            return list(p.map(noop, xs, chunksize=cs))

        def close(p):
            p.shutdown(wait=True)
    else:
        raise ValueError(system)
    return start, each, pmap, close


def m_pool_cold(system: str, n: int, mode: str) -> dict:
    """Pool start included; shutdown not."""
    start, each, pmap, close = _pool_api(system)
    xs = list(range(n))
    t0 = pc()
    p = start()
    vals = each(p, xs) if mode == "each" else pmap(p, xs, _chunk(n))
    t = pc() - t0
    close(p)
    _check(vals, n)
    return {"t": t}


def m_pool_warm(system: str, n: int) -> dict:
    start, _each, pmap, close = _pool_api(system)
    xs = list(range(n))
    p = start()
    pmap(p, xs, _chunk(n))
    ts, b2b = [], []
    for _ in range(WARM_REPS):
        time.sleep(0.01)  # idle between jobs, as elsewhere's workers are (waiting until idle)
        t0 = pc()
        vals = pmap(p, xs, _chunk(n))
        ts.append(pc() - t0)
        _check(vals, n)
        t0 = pc()  # and one right after it, as a loop of maps calls them
        vals = pmap(p, xs, _chunk(n))
        b2b.append(pc() - t0)
        _check(vals, n)
    close(p)
    return {"t": sorted(ts)[len(ts) // 2], "t_b2b": sorted(b2b)[len(b2b) // 2]}


def m_ppe_first() -> dict:
    import concurrent.futures as cf

    t0 = pc()
    with cf.ProcessPoolExecutor(W) as ex:
        v = ex.submit(noop, 7).result()
        t = pc() - t0
    assert v == 7
    return {"t": t}


def m_dask_first() -> dict:
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    t0 = pc()
    cluster = LocalCluster(n_workers=W, processes=True, threads_per_worker=1,
                           host="127.0.0.1", dashboard_address=None)
    client = Client(cluster)
    v = client.submit(noop, 7).result()
    t = pc() - t0
    client.close()
    cluster.close()
    assert v == 7
    return {"t": t}


def _bare_cpu(secs: float, k: int) -> None:
    for _ in range(k):
        spin_cpu(secs)


def m_cpu(n: int, secs: float) -> dict:
    """Bare processes first, then elsewhere; with the share of the machine's
    CPU that others (other tenants, vCPU steal) took during each."""
    import multiprocessing as mp

    from _common import machine_busy_s, proc_cpu_s, worker_pids

    def ours() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    b0, o0, t0 = machine_busy_s(), ours(), pc()
    ps = [mp.Process(target=_bare_cpu, args=(secs, n // W)) for _ in range(W)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    bare = pc() - t0
    others_bare = (machine_busy_s() - b0 - (ours() - o0)) / (W * bare)
    ew, cl = _ew()
    try:
        b0, o0, t0 = machine_busy_s(), ours(), pc()
        vals = ew.map(spin_cpu, [secs] * n, on=cl, progress=False)
        t = pc() - t0
        workers = sum(proc_cpu_s(p) for p in worker_pids(os.environ["ELSEWHERE_HOME"]))
        others_ew = (machine_busy_s() - b0 - (ours() - o0) - workers) / (W * t)
        assert len(vals) == n
    finally:
        _stop(ew)
    return {"bare": bare, "ew": t, "ideal": n * secs / W, "others_bare": others_bare, "others_ew": others_ew}


def m_big(system: str, mb: int, variant: str = "map", reps: int = 3) -> dict:
    """One task with a ``mb`` MB array argument on a warm pool; median of ``reps``
    (writing 100 MB into the page cache varies a lot on this VM)."""
    import statistics

    import numpy as np

    a = np.ones(mb * 1_000_000 // 8)
    small = np.ones(1000)
    want = float(a.size)
    ts = []
    if system == "ppe":
        import concurrent.futures as cf

        with cf.ProcessPoolExecutor(W) as ex:
            [f.result() for f in [ex.submit(arr_sum, small) for _ in range(2 * W)]]
            for _ in range(reps):
                t0 = pc()
                v = ex.submit(arr_sum, a).result()
                ts.append(pc() - t0)
                assert v == want, (v, want)
    else:
        ew, cl = _ew()
        try:
            _warm(ew, cl, arr_sum, [small] * (2 * W))  # numpy imported in both workers
            for _ in range(reps):
                _ensure_warm(ew, cl, arr_sum, [small] * (2 * W))
                t, vals, _ = _ew_run(ew, cl, variant, arr_sum, [a])
                ts.append(t)
                assert vals[0] == want, (vals[0], want)
        finally:
            _stop(ew)
    return {"t": statistics.median(ts)}


LARGE = (1_000_000, 10_000_000)  # group large: ew.map against PPE.map(chunksize), time and RSS
SWEEP = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)  # group sweep: job sizes
EACH_UP_TO = 100_000  # one submit per task beyond this takes minutes a contender


def m_large(system: str, n: int, mode: str = "map") -> dict:
    """``n`` no-op tasks from cold: ``ew.map`` with no workers running, or a pool's
    ``map(chunksize)`` (``mode="each"``: one submit per task), its start included; the time
    and the caller's peak RSS (``ru_maxrss``, KB) before and after. The inputs are a
    ``range``, so that the RSS is the system's and its results' (10 000 000 ints in a list
    would add some 360 MB to each side)."""
    import resource

    xs = range(n)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if system == "ew":
        ew, cl = _ew()
        try:
            t0 = pc()
            vals = ew.map(noop, xs, on=cl, progress=False)
            t = pc() - t0
        finally:
            _stop(ew)
    else:
        start, each, pmap, close = _pool_api(system)
        t0 = pc()
        p = start()
        vals = each(p, xs) if mode == "each" else pmap(p, xs, _chunk(n))
        t = pc() - t0
        close(p)
    _check(vals, n)
    return {"t": t, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "base_kb": base_kb}


EXECUTOR_GROUPS = ("latency", "memory")  # reported by _executors.report
SIZE_GROUPS = ("large", "sweep")  # reported by report_sizes

CHILDREN = {
    "large": m_large,
    "ew_cold": m_ew_cold,
    "ew_warm": m_ew_warm,
    "ew_first": m_ew_first,
    "pool_cold": m_pool_cold,
    "pool_warm": m_pool_warm,
    "ppe_first": m_ppe_first,
    "dask_first": m_dask_first,
    "cpu": m_cpu,
    "big": m_big,
    **_executors.CHILDREN,
}


# -- the parent: plan, run, report ------------------------------------------------
def plan(quick: bool, calls: int = 200_000) -> list[tuple[str, str, dict, bool]]:
    """(key, child, params, fresh home) of every measurement of one round."""
    from _common import have

    n10, n100 = 10_000, 100_000
    pools = ["ppe", "mp"] + (["loky"] if have("loky") else [])
    m: list[tuple[str, str, dict, bool]] = []
    for _ in range(1 if quick else COLD_REPS):  # one job of ~30 ms each: several a round, in turn
        for v in ("map", "map_noseed", "submit"):
            m.append((f"cold10k/ew/{v}", "ew_cold", {"n": n10, "variant": v}, True))
        for s in pools:
            m.append((f"cold10k/{s}/map", "pool_cold", {"system": s, "n": n10, "mode": "map"}, False))
    for s in pools:  # (seconds each, and tens of times slower: once a round)
        m.append((f"cold10k/{s}/each", "pool_cold", {"system": s, "n": n10, "mode": "each"}, False))
    for v in ("map", "map_noseed") + (() if quick else ("submit",)):
        m.append((f"cold100k/ew/{v}", "ew_cold", {"n": n100, "variant": v}, True))
    for s in pools:
        m.append((f"cold100k/{s}/map", "pool_cold", {"system": s, "n": n100, "mode": "map"}, False))
    m.append(("warm10k/ew", "ew_warm", {"n": n10, "variants": ["map", "map_noseed", "submit", "map_b2b"]}, True))
    for s in pools:
        m.append((f"warm10k/{s}/map", "pool_warm", {"system": s, "n": n10}, False))
    for v in ("submit", "map", "executor"):
        m.append((f"first/ew/{v}", "ew_first", {"variant": v}, True))
    m.append(("first/ppe", "ppe_first", {}, False))
    if have("distributed"):
        m.append(("first/dask", "dask_first", {}, False))
    m.append(("cpu", "cpu", {"n": 20, "secs": 0.5}, True))
    if have("numpy"):
        m.append(("big/ew/map", "big", {"system": "ew", "mb": 100, "variant": "map"}, True))
        m.append(("big/ew/submit", "big", {"system": "ew", "mb": 100, "variant": "submit"}, True))
        m.append(("big/ppe", "big", {"system": "ppe", "mb": 100}, False))
    m += _executors.plan(calls, 2_000)
    for n in LARGE:  # the large-jobs lead: ew.map against PPE.map(chunksize), time and peak RSS
        for s in ("ew", "ppe"):
            m.append((f"large/{s}/{n}", "large", {"system": s, "n": n}, s == "ew"))
    for n in SWEEP:  # throughput by job size, the other pools too (--quick: not at 10 M)
        for s in ["ew", *pools]:
            if not (n in LARGE and s in ("ew", "ppe")) and not (quick and n > 1_000_000):
                m.append((f"sweep/{s}/{n}", "large", {"system": s, "n": n}, s == "ew"))
        if n <= (10_000 if quick else EACH_UP_TO):
            m.append((f"sweep/ppe-each/{n}", "large", {"system": "ppe", "n": n, "mode": "each"}, False))
    return m


def collect(rounds: int, quick: bool, only: set[str] | None,
            calls: int = 200_000) -> tuple[dict[str, list[dict]], float]:  # fmt: skip
    from _common import ChildFailed, run_child

    steps = [s for s in plan(quick, calls) if not only or s[0].split("/")[0] in only]
    got: dict[str, list[dict]] = {}
    t_start = pc()
    for r in range(rounds):
        t_round = pc()
        for key, child, params, home in steps:
            try:
                got.setdefault(key, []).append(run_child(__file__, child, params, home=home,
                                                         timeout_s=_executors.timeout_s(params)))
            except ChildFailed as exc:
                print(f"  {key}: {exc}", file=sys.stderr)
        print(f"  round {r + 1}/{rounds}: {pc() - t_round:.0f} s", file=sys.stderr)
    return got, pc() - t_start


def report(got: dict[str, list[dict]]) -> tuple[str, str]:
    """(figures table, ratio table) as Markdown."""
    from _common import fmt_rate, fmt_time, median, table, verdict

    def t(key: str, field: str = "t") -> float:
        return median(r.get(field) for r in got.get(key, []))

    def spread(key: str, field: str = "t") -> str:
        xs = [r[field] for r in got.get(key, []) if field in r]
        return f"{fmt_time(min(xs))}-{fmt_time(max(xs))}" if len(xs) > 1 else ""

    labels = {
        "ew/map": "elsewhere ew.map", "ew/map_noseed": "elsewhere ew.map(seed=False)",
        "ew/map_b2b": "elsewhere ew.map right after another",
        "ew/submit": "elsewhere ew.submit().wait(); get()", "ew/executor": "elsewhere Executor.submit().result()",
        "ppe/each": "ProcessPoolExecutor, submit per task", "ppe/map": "ProcessPoolExecutor.map(chunksize)",
        "mp/each": "mp.Pool apply_async per task", "mp/map": "mp.Pool.map(chunksize)",
        "loky/each": "loky submit per task", "loky/map": "loky map(chunksize)",
        "ppe": "ProcessPoolExecutor", "dask": "dask.distributed LocalCluster",
    }

    # The figures: one row per (measurement, system).
    fig_rows = []
    warm = got.get("warm10k/ew", [])

    def others(key: str) -> str:
        x = median(r.get("_others") for r in got.get(key, []))
        return f"{100 * x:.0f}%" if x == x else ""

    for key in sorted(got, key=lambda k: list(got).index(k)):
        group, _, sysname = key.partition("/")
        if group in EXECUTOR_GROUPS + SIZE_GROUPS:
            continue  # their own tables (_executors.report, report_sizes)
        if key == "warm10k/ew":
            for v in ("map", "map_noseed", "submit", "map_b2b"):
                x = t(key, v)
                if x != x:
                    continue  # (a record of before the variant)
                fig_rows.append([group, labels[f"ew/{v}"], fmt_time(x), spread(key, v), fmt_rate(10_000 / x),
                                 others(key)])
            lost = sum(r.get("lost", 0) for r in warm)
            if lost:
                fig_rows.append([group, f"  (the pool had lost a worker before {lost} of {(3 * WARM_REPS + WARM_REPS // 4) * len(warm)} timed jobs: "
                                 "warmed again first)", "", "", "", ""])
            continue
        if group == "cpu":
            for f, lab in (("bare", "2 bare mp.Process"), ("ew", "elsewhere ew.map")):
                o = t(key, f"others_{f}")
                fig_rows.append([group, lab, fmt_time(t(key, f)), spread(key, f), "",
                                 f"{100 * o:.0f}%" if o == o else ""])
            fig_rows.append([group, "ideal: 20 x 0.5 s / 2", fmt_time(t(key, "ideal")), "", "", ""])
            continue
        n = {"cold10k": 10_000, "cold100k": 100_000, "warm10k": 10_000}.get(group)
        x = t(key)
        rate = fmt_rate(n / x) if n else (f"{100 / x:.0f} MB/s" if group == "big" else "")
        fig_rows.append([group, labels.get(sysname, sysname), fmt_time(x), spread(key), rate, others(key)])
        if sysname == "ew/submit" and "t_submit" in (got[key][0] if got[key] else {}):
            fig_rows.append([group, "  of which submit() returns after", fmt_time(t(key, "t_submit")), "", "", ""])
    figures = table(["measurement", "system", "median", "min-max", "rate", "others' CPU"], fig_rows)

    # The ratios: alternative's time / elsewhere's time.
    rows = []

    def ratio(metric: str, ew_t: float, ew_lab: str, alt_t: float, alt_lab: str, target: float | None,
              target_text: str, r: float | None = None) -> None:
        if ew_t != ew_t or alt_t != alt_t:
            return
        r = alt_t / ew_t if r is None else r
        rows.append([metric, f"{ew_lab} {fmt_time(ew_t)}", f"{alt_lab} {fmt_time(alt_t)}", f"{r:.2f}",
                     target_text, verdict(r, target)])

    ew_short = {"map": "map", "map_noseed": "map seed=False", "submit": "submit+get"}
    for v in ("map", "map_noseed", "submit"):
        e = t(f"cold10k/ew/{v}")
        ratio("1. 10k no-op, cold", e, ew_short[v], t("cold10k/ppe/each"), "PPE submit-each", 20, ">= 20")
    for v in ("map", "map_noseed", "submit"):
        e = t(f"cold10k/ew/{v}")
        ratio("1. 10k no-op, cold", e, ew_short[v], t("cold10k/ppe/map"), "PPE.map+start", 0.5, ">= 0.5 (2x)")
    e = t("cold10k/ew/map")
    for s, lab in (("mp/map", "mp.Pool.map+start"), ("mp/each", "mp.Pool apply-each"),
                   ("loky/map", "loky map+start"), ("loky/each", "loky submit-each")):
        ratio("1. 10k no-op, cold", e, "map", t(f"cold10k/{s}"), lab, None, "")
    for v in ("map", "map_noseed", "submit"):
        ratio("2. 100k no-op, cold", t(f"cold100k/ew/{v}"), ew_short[v], t("cold100k/ppe/map"), "PPE.map+start",
              0.8, ">= 0.8")
    for s, lab in (("mp/map", "mp.Pool.map+start"), ("loky/map", "loky map+start")):
        ratio("2. 100k no-op, cold", t("cold100k/ew/map"), "map", t(f"cold100k/{s}"), lab, None, "")
    for v in ("map", "map_noseed", "submit"):
        ratio("3. 10k no-op, warm", t("warm10k/ew", v), ew_short[v], t("warm10k/ppe/map"), "warm PPE.map", 1.0,
              ">= 1.0")
    # each ew.map job against the PPE.map job run just after it, in the same process
    ratio("3. 10k no-op, warm", t("warm10k/ew", "map"), "map", t("warm10k/ew", "ppe_paired"),
          "warm PPE.map, paired", 1.0, ">= 1.0", median(r["paired_map"] for r in warm if "paired_map" in r))
    for s, lab in (("mp/map", "warm mp.Pool.map"), ("loky/map", "warm loky map")):
        ratio("3. 10k no-op, warm", t("warm10k/ew", "map"), "map", t(f"warm10k/{s}"), lab, None, "")
    # a loop of maps: each called right after the one before, its workers still leaving it
    ratio("3. 10k no-op, warm", t("warm10k/ew", "map_b2b"), "map right after another", t("warm10k/ppe/map", "t_b2b"),
          "warm PPE.map right after another", None, "")
    for v, lab in (("submit", "submit+wait"), ("map", "map([x])"), ("executor", "Executor")):
        ratio("4. first result, cold", t(f"first/ew/{v}"), lab, t("first/dask"), "dask LocalCluster", 10,
              ">= 10 (0.1x)")
    ratio("4. first result, cold", t("first/ew/submit"), "submit+wait", t("first/ppe"), "PPE", None, "")
    # Each round's elsewhere run is compared with the bare processes run just
    # before it: the median of those per-round ratios.
    ratio("5. 20 x 0.5 s CPU", t("cpu", "ew"), "map", t("cpu", "bare"), "2 bare processes", 1 / 1.05,
          ">= 0.952 (5%)", median(r["bare"] / r["ew"] for r in got.get("cpu", [])))
    for v in ("map", "submit"):
        ratio("6. 100 MB array arg, warm", t(f"big/ew/{v}"), ew_short[v], t("big/ppe"), "warm PPE", 1.0, ">= 1")
    ratios = table(["metric", "elsewhere", "alternative", "ratio", "target", "verdict"], rows)
    return figures, ratios


SIZE_LABELS = {"ew": "ew.map", "ppe": "PPE.map(chunksize)", "mp": "mp.Pool.map(chunksize)",
               "loky": "loky map(chunksize)", "ppe-each": "PPE, one submit per task"}  # fmt: skip


def _sized(got: dict[str, list[dict]], system: str, n: int, field: str = "t") -> float:
    """The median of ``field`` for ``n`` tasks on ``system`` (group large or sweep)."""
    from _common import median

    return median(r.get(field) for g in SIZE_GROUPS for r in got.get(f"{g}/{system}/{n}", []))


def report_sizes(got: dict[str, list[dict]]) -> str:
    """The large jobs (time and the caller's peak RSS) and the sweep (tasks per second)."""
    from _common import fmt_rate, fmt_time, table

    out = []
    rows = []
    for n in LARGE:
        e_t, e_kb = _sized(got, "ew", n), _sized(got, "ew", n, "peak_kb")
        for s in ("ew", "ppe"):
            x, kb = _sized(got, s, n), _sized(got, s, n, "peak_kb")
            if x == x:
                ratios = ["", ""] if s == "ew" else [f"{x / e_t:.2f}x", f"{kb / e_kb:.2f}x"]
                rows.append([f"{n:_}".replace("_", " "), SIZE_LABELS[s], fmt_time(x), fmt_rate(n / x),
                             f"{kb / 1024:.0f} MB", *ratios])  # fmt: skip
    if rows:
        out.append(table(["tasks", "system", "time", "rate", "peak RSS (caller)", "ratio (time)", "ratio (RSS)"],
                         rows))  # fmt: skip
    systems = [s for s in SIZE_LABELS if any(k.startswith(f"sweep/{s}/") for k in got)]
    if systems:
        rows = [[f"{n:_}".replace("_", " ")] + [fmt_rate(n / _sized(got, s, n)) for s in systems] for n in SWEEP]
        out.append("\nTasks per second, start to last result:\n")
        out.append(table(["tasks", *(SIZE_LABELS[s] for s in systems)], rows))
    return "\n".join(out)


def figures_json(fig, got: dict[str, list[dict]]) -> None:
    """The figures of the groups measured, for ``--json`` (``fig``: a ``report.Figures``)."""
    from _common import median

    def t(key: str, field: str = "t") -> float:
        return median(r.get(field) for r in got.get(key, []))

    for group, n in (("cold10k", 10_000), ("cold100k", 100_000)):
        fig.compare(group, f"{n:_} no-op tasks from cold".replace("_", " "), ("ew.map", t(f"{group}/ew/map")),
                    [("PPE.map(chunksize)", t(f"{group}/ppe/map")), ("PPE, one submit per task", t(f"{group}/ppe/each")),
                     ("mp.Pool.map(chunksize)", t(f"{group}/mp/map")),
                     ("mp.Pool, apply_async per task", t(f"{group}/mp/each")),
                     ("loky map(chunksize)", t(f"{group}/loky/map")),
                     ("loky, one submit per task", t(f"{group}/loky/each"))], "s",
                    variants=[("ew.map(seed=False)", t(f"{group}/ew/map_noseed")),
                              ("ew.submit().wait(); get()", t(f"{group}/ew/submit"))])  # fmt: skip
    paired = median(r["paired_map"] for r in got.get("warm10k/ew", []) if "paired_map" in r)
    fig.compare("warm10k", "10 000 no-op tasks on warm workers", ("ew.map", t("warm10k/ew", "map")),
                [("warm PPE.map(chunksize)", t("warm10k/ppe/map")),
                 ("warm PPE.map(chunksize), each job right after one of ew.map's, paired", t("warm10k/ew", "ppe_paired")),
                 ("warm mp.Pool.map(chunksize)", t("warm10k/mp/map")),
                 ("warm loky map(chunksize)", t("warm10k/loky/map"))], "s",
                variants=[("ew.map(seed=False)", t("warm10k/ew", "map_noseed")),
                          ("ew.submit().wait(); get()", t("warm10k/ew", "submit"))],
                ratios={"warm PPE.map(chunksize), each job right after one of ew.map's, paired": paired})  # fmt: skip
    fig.compare("warm10k_b2b", "10 000 no-op tasks on warm workers, each map right after another",
                ("ew.map", t("warm10k/ew", "map_b2b")),
                [("warm PPE.map(chunksize)", t("warm10k/ppe/map", "t_b2b"))], "s")  # fmt: skip
    fig.compare("first", "First result from cold (a job of one task)", ("ew.map([x])", t("first/ew/map")),
                [("dask LocalCluster, start to first result", t("first/dask")),
                 ("PPE, start to first result", t("first/ppe"))], "s",
                variants=[("ew.submit().wait(); results()", t("first/ew/submit")),
                          ("ew.Executor().submit().result()", t("first/ew/executor"))])  # fmt: skip
    cpu = median(r["bare"] / r["ew"] for r in got.get("cpu", []))  # each round's, as report() does
    fig.compare("cpu", "20 tasks of 0.5 s of CPU each", ("ew.map", t("cpu", "ew")),
                [("2 bare multiprocessing.Process", t("cpu", "bare"))], "s",
                ratios={"ew.map": cpu, "2 bare multiprocessing.Process": cpu})  # fmt: skip
    fig.compare("big", "One task with a 100 MB NumPy argument, warm workers", ("ew.map", t("big/ew/map")),
                [("warm PPE", t("big/ppe"))], "s",
                variants=[("ew.submit().wait(); get()", t("big/ew/submit"))])  # fmt: skip
    for n in LARGE:
        what = f"{n:_} no-op tasks from cold".replace("_", " ")
        fig.compare("large", f"{what}: time", ("ew.map", _sized(got, "ew", n)),
                    [("PPE.map(chunksize)", _sized(got, "ppe", n))], "s")  # fmt: skip
        fig.compare("large", f"{what}: the caller's peak RSS", ("ew.map", _sized(got, "ew", n, "peak_kb") / 1024),
                    [("PPE.map(chunksize)", _sized(got, "ppe", n, "peak_kb") / 1024)], "MB")  # fmt: skip
    if any(k.startswith("sweep/") for k in got):
        for n in SWEEP:
            fig.compare("sweep", "No-op tasks from cold: tasks per second, by the job's size",
                        ("ew.map", n / _sized(got, "ew", n)),
                        [(SIZE_LABELS[s], n / _sized(got, s, n)) for s in ("ppe", "mp", "loky", "ppe-each")],
                        "tasks/s", better="higher", tasks=n)  # fmt: skip


def main(argv: list[str]) -> int:
    import argparse

    if argv[:1] == ["--child"]:
        # Run the module as ``local``, not ``__main__``: its functions then
        # travel by reference (``local.noop``) to every kind of worker.
        from _common import child_main

        import local

        child_main(local.CHILDREN, argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3, 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="one round, fewer variants (under a minute)")
    p.add_argument("--only", default="",
                   help="comma-separated groups: cold10k,cold100k,warm10k,first,cpu,big,latency,memory,large,"
                        "sweep (sweep includes large)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    p.add_argument("--calls", type=int, default=None,
                   help="abs calls of the memory group's stream (default 200 000, 50 000 with --quick; "
                        "1 000 000 is the full figure, about 5 minutes per contender here)")
    args = p.parse_args(argv)
    calls = args.calls or (50_000 if args.quick else 200_000)
    rounds = args.rounds or (1 if args.quick else 3)
    only = {s for s in args.only.split(",") if s} or None
    if only and "sweep" in only:
        only.add("large")  # the sweep's points at 1 M and 10 M tasks for ew and PPE
    import platform

    from _common import venv_python
    from report import Figures

    record = Figures("local", argv)

    print(f"# bench/local.py: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()} ({venv_python()}), {rounds} round(s), "
          f"load {os.getloadavg()[0]:.2f} at start", flush=True)
    got, took = collect(rounds, args.quick, only, calls)
    print(f"\nFigures (median of {rounds} round(s), each in a fresh process; {took:.0f} s in all, "
          f"load {os.getloadavg()[0]:.2f} at end):\n")
    if any(k.split("/")[0] not in EXECUTOR_GROUPS + SIZE_GROUPS for k in got):
        figures, ratios = report(got)
        print(figures)
        print("\nRatios (alternative's time / elsewhere's: above 1, elsewhere is faster):\n")
        print(ratios)
    if any(k.split("/")[0] in EXECUTOR_GROUPS for k in got):
        print("\new.Executor on ew.local(cores=2) against ProcessPoolExecutor(2) and loky (ratio: the "
              "alternative's latency, RSS or time over elsewhere's; above 1, elsewhere is ahead):\n")
        print(_executors.report(got, "local workers"))
    if any(k.split("/")[0] in SIZE_GROUPS for k in got):
        print("\nNo-op tasks from cold, by the job's size (ratio: the alternative's time or RSS over "
              "elsewhere's; above 1, elsewhere is ahead):\n")
        print(report_sizes(got))
    if args.json:
        figures_json(record, got)
        _executors.figures_json(record, got)
        record.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
