"""``ew.Executor`` against ProcessPoolExecutor and loky: result latency and the memory of a
long stream of calls. Shared by ``bench/local.py`` and ``bench/peer.py`` (their groups
``latency`` and ``memory``); each measurement runs in a fresh child process of theirs.

- **latency**: from a call's end in the worker to its future's completion in the caller.
  The call returns ``time.time()`` as it ends; a done-callback added right after
  ``submit`` records ``time.time()`` when the future completes (one machine, one clock);
  the latency is the difference. Two shapes: ``lone`` (submit, wait, repeat) and
  ``burst`` (on one worker, 5 no-op calls and then one that sleeps 1 s: the latency of
  the 5 fast ones, which must not wait for the slow one).
- **memory**: the caller's peak RSS (``ru_maxrss``) while a bounded producer streams
  calls through the executor (at most ``window`` futures alive: the oldest is read and
  dropped before the next is submitted), and the wall time. Two loads: ``abs`` of ints
  (1 000 000 calls at full size) and calls returning 1 MB of bytes each (2 000).

Module-level imports are the standard library's only: local workers import this module
to run its task functions.
"""

from __future__ import annotations

import time

LONE_CALLS = 200
BURST_FAST = 5  # no-op calls submitted before the slow one
BURST_SLOW_S = 1.0
BURSTS = 5  # bursts per child: 25 fast results
WINDOW_SMALL = 10_000  # futures alive at most, tiny calls
WINDOW_BIG = 100  # futures alive at most, 1 MB results (100 MB the caller may hold)


# -- task functions (by reference on local workers, by value on peers) -------------------


def ended(x):
    """A no-op call that returns when it ended (``time.time()``)."""
    return time.time()


def slept(secs):
    time.sleep(secs)
    return time.time()


def one_mb(nbytes):
    return bytes(nbytes)


# -- the executors -------------------------------------------------------------------------


def open_executor(system: str, workers: int, peer: dict | None = None):
    """A warm-able executor of ``workers`` processes: ``ew`` (``ew.local(cores=workers)``, or
    the loopback peers ``peer`` names: port, key), ``ppe`` or ``loky``."""
    if system == "ppe":
        import concurrent.futures as cf

        return cf.ProcessPoolExecutor(workers)
    if system == "loky":
        import loky

        return loky.get_reusable_executor(max_workers=workers)
    if system != "ew":
        raise ValueError(system)
    import elsewhere as ew

    if peer is None:
        return ew.Executor(on=ew.local(cores=workers))
    from elsewhere.backends.peer import peers

    return ew.Executor(on=peers("bench", key=peer["key"], port=peer["port"], interface="127.0.0.1"))


def close_executor(system: str, ex, peer: dict | None) -> None:
    ex.shutdown(wait=True)
    if system == "ew" and peer is None:  # the local workers leave (killed by pid if they linger)
        import os

        from _common import stop_workers

        import elsewhere as ew

        stop_workers(os.environ["ELSEWHERE_HOME"], 5.0, ew.local().shutdown)


def _warm(ex, workers: int) -> None:
    """Every worker process started, the task module imported, the connections made."""
    for _ in range(3):
        [f.result() for f in [ex.submit(ended, i) for i in range(4 * workers)]]
    for i in range(10):
        ex.submit(ended, i).result()


class _Stamped:
    """A future and the moment it completed (its done-callback's ``time.time()``)."""

    __slots__ = ("done_at", "event", "fut", "raced")

    def __init__(self, fut) -> None:
        import threading

        self.fut = fut
        self.done_at = 0.0
        self.event = threading.Event()
        self.raced = fut.done()  # done before the callback was added: its time would be late
        fut.add_done_callback(self._on_done)

    def _on_done(self, _fut) -> None:
        self.done_at = time.time()
        self.event.set()

    def latency(self) -> float:
        end = self.fut.result(60)
        if not self.event.wait(60):  # result() can return before the callbacks have run
            raise RuntimeError("the future's done-callback did not run")
        return self.done_at - end


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"med": xs[len(xs) // 2], "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))], "max": xs[-1], "n": len(xs)}


def m_latency(system: str, shape: str, workers: int = 2, peer: dict | None = None) -> dict:
    """Result latency of ``shape`` (``lone`` or ``burst``) on ``system``; seconds."""
    ex = open_executor(system, 1 if shape == "burst" else workers, peer)
    try:
        _warm(ex, 1 if shape == "burst" else workers)
        lat: list[float] = []
        slow: list[float] = []
        raced = 0
        if shape == "lone":
            for i in range(LONE_CALLS):
                s = _Stamped(ex.submit(ended, i))
                lat.append(s.latency())
                raced += s.raced
        else:
            for _ in range(BURSTS):
                time.sleep(0.05)
                fast = [_Stamped(ex.submit(ended, i)) for i in range(BURST_FAST)]
                late = _Stamped(ex.submit(slept, BURST_SLOW_S))
                for s in fast:
                    lat.append(s.latency())
                    raced += s.raced
                slow.append(late.latency())
        out = {**_stats(lat), "raced": raced, "samples": lat}  # samples: bench/report.py's plot
        if slow:
            out["slow_med"] = _stats(slow)["med"]
        return out
    finally:
        close_executor(system, ex, peer)


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def m_memory(system: str, load: str, calls: int, workers: int = 2, peer: dict | None = None) -> dict:
    """``calls`` calls of ``load`` (``small``: abs of an int; ``mb``: 1 MB of bytes back)
    through a bounded producer; the caller's peak RSS (KB) and the wall time."""
    import collections
    import resource

    ex = open_executor(system, workers, peer)
    try:
        _warm(ex, workers)
        if load == "small":
            fn, window, arg = abs, WINDOW_SMALL, (lambda i: -i)
        else:
            fn, window, arg = one_mb, WINDOW_BIG, (lambda i: 1_000_000)
        for i in range(min(window, 1000)):  # the executor's paths for this load warm too
            ex.submit(fn, arg(i)).result()
        base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start_kb = _rss_kb()
        alive: collections.deque = collections.deque()
        total = 0
        t0 = time.perf_counter()
        for i in range(calls):
            if len(alive) >= window:
                v = alive.popleft().result()
                total += v if load == "small" else len(v)
                del v
            alive.append(ex.submit(fn, arg(i)))
        while alive:
            v = alive.popleft().result()
            total += v if load == "small" else len(v)
            del v
        t = time.perf_counter() - t0
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        end_kb = _rss_kb()
        want = calls * (calls - 1) // 2 if load == "small" else calls * 1_000_000
        if total != want:
            raise RuntimeError(f"{system}: the results add up to {total}, not {want}")
        return {"t": t, "peak_kb": peak_kb, "base_kb": base_kb, "start_kb": start_kb, "end_kb": end_kb,
                "calls": calls, "window": window}
    finally:
        close_executor(system, ex, peer)


CHILDREN = {"executor_latency": m_latency, "executor_memory": m_memory}


# -- the parent: the plan of a round, and the report -------------------------------------------


def plan(calls: int, mb_calls: int, peer: dict | None = None, peer_one: dict | None = None,
         want: set[str] | None = None) -> list[tuple[str, str, dict, bool]]:  # fmt: skip
    """(key, child, params, fresh home) of one round of the groups in ``want``; ``peer`` the
    loopback peers of the ``lone`` and ``memory`` measurements, ``peer_one`` the single
    peer worker of ``burst`` (both None: local workers)."""
    from _common import have

    systems = ["ew", "ppe"] + (["loky"] if have("loky") else [])
    want = want or {"latency", "memory"}
    steps = []
    if "latency" in want:
        for shape in ("lone", "burst"):
            for s in systems:
                p = {"system": s, "shape": shape}
                if s == "ew" and peer is not None:
                    p["peer"] = peer if shape == "lone" else peer_one
                steps.append((f"latency/{s}/{shape}", "executor_latency", p, s == "ew"))
    if "memory" in want:
        for load, n in (("small", calls), ("mb", mb_calls)):
            for s in systems:
                p = {"system": s, "load": load, "calls": n}
                if s == "ew" and peer is not None:
                    p["peer"] = peer
                steps.append((f"memory/{s}/{load}", "executor_memory", p, s == "ew"))
    return steps


def timeout_s(params: dict) -> float:
    """How long a child may take: long streams take long (loky: about 4 000 calls a second here)."""
    return 300.0 + 2e-3 * params.get("calls", 0)


NAMES = {"ew": "ew.Executor", "ppe": "ProcessPoolExecutor", "loky": "loky reusable executor"}


def report(got: dict[str, list[dict | None]], where: str, workers: int = 2) -> str:
    """The figures and ratios of the groups measured, as Markdown tables; ``where`` says what
    ``ew`` ran on. Each figure is the median over rounds of each round's figure; a ratio is
    the alternative's figure over elsewhere's (above 1, elsewhere is ahead)."""
    from _common import fmt_time, median, table

    def med(key: str, field: str) -> float:
        return median(r.get(field) for r in got.get(key, []) if r)

    def ms(s: float) -> str:
        return "n/a" if s != s else f"{s * 1e3:.2f} ms"

    def mb(kb: float) -> str:
        return "n/a" if kb != kb else f"{kb / 1024:.0f} MB"

    def each(key: str, field: str, scale: float, fmt: str = "{:.2f}") -> str:
        """Each round's figure (the medians over rounds hide how much they moved)."""
        return " / ".join(fmt.format(r[field] * scale) for r in got.get(key, []) if r and field in r)

    def label(s: str) -> str:
        return f"{NAMES[s]} ({where})" if s == "ew" else NAMES[s]

    out = []
    rows: list[list[str]] = []
    raced = []
    shapes = {"lone": f"lone calls, {workers} workers ({LONE_CALLS} a round)",
              "burst": f"{BURST_FAST} no-ops, then a {BURST_SLOW_S:g} s call, 1 worker ({BURSTS} bursts a round)"}
    for shape, what in shapes.items():
        e, e90 = med(f"latency/ew/{shape}", "med"), med(f"latency/ew/{shape}", "p90")
        for s in NAMES:
            key = f"latency/{s}/{shape}"
            m, p90 = med(key, "med"), med(key, "p90")
            if m != m:
                continue
            n = sum(r.get("raced", 0) for r in got.get(key, []) if r)
            if n:
                raced.append(f"{n} of {NAMES[s]}'s {shape}")
            rounds = each(key, "med", 1e3)
            if s == "ew":
                rows.append([what, label(s), ms(m), ms(p90), rounds, "", "", "<= 1 ms",
                             "PASS" if m <= 1e-3 else "FAIL"])  # fmt: skip
            else:
                rows.append([what, label(s), ms(m), ms(p90), rounds, f"{m / e:.2f}x", f"{p90 / e90:.2f}x", "",
                             "info"])  # fmt: skip
        slow = med(f"latency/ew/{shape}", "slow_med")
        if slow == slow:
            rows.append([what, f"  the {BURST_SLOW_S:g} s call itself: {NAMES['ew']}", ms(slow), "",
                         each(f"latency/ew/{shape}", "slow_med", 1e3), "", "", "", "info"])
    if rows:
        out.append("Result latency, from a call's end in the worker to its future's completion in the caller "
                   "(time.time() returned by the call, time.time() in a done-callback):\n")
        out.append(table(["calls", "executor", "median", "p90", "each round's median (ms)", "ratio (median)",
                          "ratio (p90)", "target", "verdict"], rows))
        if raced:
            out.append("\nDone before the callback was added (counted at that moment, a late figure): "
                       + ", ".join(raced) + ".")
    rows = []
    loads = {"small": "abs(i) calls", "mb": "calls returning 1 MB each"}
    for load, what in loads.items():
        ew_rows = [r for r in got.get(f"memory/ew/{load}", []) if r]
        e_peak, e_t = med(f"memory/ew/{load}", "peak_kb"), med(f"memory/ew/{load}", "t")
        for s in NAMES:
            key = f"memory/{s}/{load}"
            some = next((r for r in got.get(key, []) if r), None)
            if some is None:
                continue
            stream = f"{some['calls']:_} {what}, <= {some['window']:_} futures alive".replace("_", " ")
            peak, base, t = med(key, "peak_kb"), med(key, "base_kb"), med(key, "t")
            ratios = ["", ""] if s == "ew" or not ew_rows else [f"{peak / e_peak:.2f}x", f"{t / e_t:.2f}x"]
            rows.append([stream, label(s), mb(peak), each(key, "peak_kb", 1 / 1024, "{:.0f}"), mb(peak - base),
                         mb(med(key, "end_kb")), fmt_time(t), *ratios])
    if rows:
        if out:
            out.append("")
        out.append("The caller's memory for a stream of calls (a bounded producer: the oldest future read and "
                   "dropped before the next submit): peak RSS (ru_maxrss), its growth over the peak before the "
                   "stream, RSS after the stream, wall time:\n")
        out.append(table(["stream", "executor", "peak RSS", "each round's (MB)", "growth", "RSS at end", "wall",
                          "ratio (RSS)", "ratio (time)"], rows))
    return "\n".join(out)


def figures_json(fig, got: dict[str, list[dict | None]]) -> None:
    """The groups' figures for ``--json`` (``fig``: a ``report.Figures``): the latencies (with
    every call's, for the distribution plot) and the streams' peak RSS and wall time."""
    from _common import median

    def med(key: str, field: str) -> float:
        return median(r.get(field) for r in got.get(key, []) if r)

    def every(key: str) -> list[float] | None:
        return [x for r in got.get(key, []) if r for x in r.get("samples", [])] or None

    alts = [s for s in NAMES if s != "ew"]
    shapes = {"lone": "Result latency of lone calls (a call's end to its future done)",
              "burst": f"Result latency of {BURST_FAST} quick calls behind a {BURST_SLOW_S:g} s call, one worker"}
    for shape, what in shapes.items():
        for field, label in (("med", "median"), ("p90", "90th percentile")):
            keys = {s: f"latency/{s}/{shape}" for s in NAMES}
            samples = {NAMES[s]: every(k) for s, k in keys.items()} if field == "med" and shape == "lone" else None
            fig.compare("latency", f"{what}, {label}", (NAMES["ew"], med(keys["ew"], field)),
                        [(NAMES[s], med(keys[s], field)) for s in alts], "s", samples=samples)  # fmt: skip
    for load, what in (("small", "abs() calls"), ("mb", "calls returning 1 MB each")):
        some = next((r for s in NAMES for r in got.get(f"memory/{s}/{load}", []) if r), None)
        if some is None:
            continue
        stream = f"{some['calls']:_} {what}, at most {some['window']:_} futures alive".replace("_", " ")
        for field, label, unit, scale in (("peak_kb", "the caller's peak RSS", "MB", 1 / 1024),
                                          ("t", "wall time", "s", 1.0)):  # fmt: skip
            fig.compare("memory", f"{stream}: {label}", (NAMES["ew"], med(f"memory/ew/{load}", field) * scale),
                        [(NAMES[s], med(f"memory/{s}/{load}", field) * scale) for s in alts], unit)  # fmt: skip
