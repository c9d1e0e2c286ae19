"""The benchmarks' figures: recorded as JSON by each script, turned into ``bench/README.md``.

    .venv/bin/python bench/report.py [--from bench/figures] [--readme bench/README.md] [--img docs/img]

Every benchmark script takes ``--json FILE`` and writes there the figures it printed, through
:class:`Figures`. This command reads every ``*.json`` of a folder (``bench/figures`` by
default), keeps the newest figure of each kind, and writes the README (one table per backend,
each elsewhere figure beside its alternatives, each with its date) and two plots with
matplotlib: throughput against the number of tasks on local workers
(``docs/img/bench-throughput.png``) and the distribution of a call's round trip
(``docs/img/bench-roundtrip.png``). The history of the figures is the history of these files
in git.

One file holds one run of one script::

    {"format": "elsewhere-bench/1", "bench": "local", "command": "bench/local.py --rounds 3",
     "date": "2026-12-06", "time": "06:10", "cores": 2, "load": [7.3, 8.1], "python": "3.11.7",
     "figures": [{"group": "cold10k", "name": "10 000 no-op tasks, ...", "system": "ew.map",
                  "elsewhere": true, "value": 0.058, "unit": "s", "better": "lower",
                  "ratio": 0.66, "against": "ProcessPoolExecutor.map(chunksize)",
                  "date": "2026-12-06", "cores": 2, "load": [7.3, 8.1]}, ...]}

``ratio`` is elsewhere's lead over the system named by ``against`` (the alternative's time over
elsewhere's, or elsewhere's rate over the alternative's): above 1, elsewhere is ahead; an
alternative's figure carries the ratio of elsewhere's figure to it. Optional fields: ``tasks``
(the job's size: the figure is a point of the throughput plot), ``samples`` (every call's time,
for the distribution plot), ``carried`` (a figure kept from an earlier run, with its own date,
the document's ``why`` and, for a ratio whose other side has been measured again since,
``against_value``: that side's figure of the same run). No field names a path of the machine.

Importing this module costs the standard library only: the scripts import it in their parent
process, and matplotlib is imported only to draw.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import textwrap
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

FORMAT = "elsewhere-bench/1"
ROOT = Path(__file__).resolve().parents[1]
THROUGHPUT_PNG = "bench-throughput.png"
ROUNDTRIP_PNG = "bench-roundtrip.png"


# -- recording (the scripts' --json) ----------------------------------------------------------------


def command_line(bench: str, argv: Sequence[str]) -> str:
    """How the script was run, as ``bench/<bench>.py <args>`` without ``--json FILE`` (a path)."""
    args: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--json":
            skip = True
        elif not a.startswith("--json="):
            args.append(a)
    return " ".join([f"bench/{bench}.py", *args])


class Figures:
    """The figures of one run of a benchmark script, written to ``--json FILE``.

    Made when the run starts (its date, the machine's cores and load then); :meth:`write`
    adds the load at the end. Figures that are NaN or missing (a contender not installed, a
    group not run) are left out.
    """

    def __init__(self, bench: str, argv: Sequence[str]) -> None:
        now = time.localtime()
        self.bench = bench
        self.command = command_line(bench, argv)
        self.date = time.strftime("%Y-%m-%d", now)
        self.time = time.strftime("%H:%M", now)
        self.cores = os.cpu_count() or 1
        self.load_start = round(os.getloadavg()[0], 2)
        self.items: list[dict[str, Any]] = []

    def add(self, group: str, name: str, system: str, value: float | None, unit: str, *,
            elsewhere: bool = False, better: str = "lower", ratio: float | None = None,
            against: str | None = None, **extra: Any) -> None:  # fmt: skip
        """One figure; ``extra``: ``tasks``, ``samples`` (in the figure's unit)."""
        if not _finite(value):
            return
        value, ratio = _round(value, 6), _round(ratio, 4)
        if extra.get("samples"):
            extra["samples"] = [_round(x, 4) for x in extra["samples"]]
        item: dict[str, Any] = {"group": group, "name": name, "system": system, "elsewhere": elsewhere,
                                "value": value, "unit": unit, "better": better}  # fmt: skip
        if _finite(ratio) and against:
            item["ratio"], item["against"] = ratio, against
        item.update({k: v for k, v in extra.items() if v is not None})
        self.items.append(item)

    def compare(self, group: str, name: str, ours: tuple[str, float | None],
                alternatives: Iterable[tuple[str, float | None]], unit: str, *, better: str = "lower",
                variants: Iterable[tuple[str, float | None]] = (), ratios: dict[str, float | None] | None = None,
                samples: dict[str, list[float]] | None = None, **extra: Any) -> None:  # fmt: skip
        """Elsewhere's figure ``ours`` (system, value) and each alternative's beside it, with
        elsewhere's lead over each; elsewhere's own figure carries its lead over the first
        alternative measured, and so does each of elsewhere's ``variants`` (other ways to do
        the same). ``ratios``: a system's lead measured otherwise (e.g. the median of each
        round's); ``samples``: a system's every call, for the distribution plot."""
        system, value = ours
        alts = [(s, v) for s, v in alternatives if _finite(v)]
        given, samples = ratios or {}, samples or {}

        def lead(a: float | None, b: float | None) -> float | None:  # a's lead over b
            if not (_finite(a) and _finite(b)) or not a or not b:
                return None
            return b / a if better == "lower" else a / b  # type: ignore[operator]

        first = alts[0] if alts else (None, None)
        for s, v in [(system, value), *variants]:
            self.add(group, name, s, v, unit, elsewhere=True, better=better, against=first[0],
                     ratio=given.get(s, lead(v, first[1])), samples=samples.get(s), **extra)  # fmt: skip
        for s, v in alts:
            self.add(group, name, s, v, unit, better=better, against=system,
                     ratio=given.get(s, lead(value, v)), samples=samples.get(s), **extra)  # fmt: skip

    def document(self) -> dict[str, Any]:
        load = [self.load_start, round(os.getloadavg()[0], 2)]
        stamp = {"date": self.date, "time": self.time, "cores": self.cores, "load": load}
        return {"format": FORMAT, "bench": self.bench, "command": self.command, **stamp,
                "python": platform.python_version(), "figures": [{**f, **stamp} for f in self.items]}  # fmt: skip

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the run's figures to ``path`` (a temporary name, then renamed)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        doc = self.document()
        figures = doc.pop("figures")
        # one figure a line: a new run's diff in git reads figure by figure
        text = (
            json.dumps(doc)[:-1]
            + ', "figures": [\n'
            + ",\n".join(json.dumps(f) for f in figures)
            + "\n]}\n"
        )
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        print(f"{len(self.items)} figures written to {path.name}", file=sys.stderr)


def _round(x: Any, digits: int) -> Any:
    """``x`` to ``digits`` significant digits (what a run's noise leaves meaningful)."""
    return float(f"{x:.{digits}g}") if _finite(x) else x


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# -- reading -------------------------------------------------------------------------------------------


def load(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every run recorded in ``folder`` (its ``*.json``), oldest first."""
    docs = []
    for p in sorted(Path(folder).glob("*.json")):
        doc = json.loads(p.read_text(encoding="utf-8"))
        if doc.get("format") != FORMAT:
            raise ValueError(
                f"{p.name}: not a benchmark figures file (format {doc.get('format')!r})"
            )
        docs.append(doc)
    return sorted(docs, key=lambda d: (d["date"], d.get("time", "")))


def current(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest figure of each (bench, group, name, system, tasks), in the order first recorded."""
    out: dict[tuple[str, str, str, str, int | None], dict[str, Any]] = {}
    for doc in docs:  # oldest first: a newer figure of the same kind replaces an older one
        for f in doc["figures"]:
            f = {**f, "bench": doc["bench"], "carried": f.get("carried", doc.get("carried", False))}
            key = (f["bench"], f["group"], f["name"], f["system"], f.get("tasks"))
            if key in out and _stamp(out[key]) > _stamp(f):
                continue
            out[key] = f
    return list(out.values())


def _stamp(f: dict[str, Any]) -> tuple[str, str]:
    return f["date"], f.get("time", "")


# -- formatting ----------------------------------------------------------------------------------------


def fmt_value(v: float, unit: str) -> str:
    """A figure in its unit, as a reader wants it (times in us, ms or s)."""
    if unit == "s":
        if v < 1e-3:
            return f"{v * 1e6:.0f} us"
        if v < 1:
            return f"{v * 1e3:.1f} ms" if v < 0.1 else f"{v * 1e3:.0f} ms"
        return f"{v:.2f} s"
    if unit == "tasks/s":
        return (
            f"{v / 1e6:.2f}M/s" if v >= 1e6 else f"{v / 1e3:.1f}k/s" if v >= 1e3 else f"{v:.1f}/s"
        )
    if unit in ("MB", "MB/s", "B"):
        return f"{v:.0f} {unit}"
    if unit == "GB/s":
        return f"{v:.2f} GB/s"
    if unit == "%":
        return f"{v:.0f}%"
    if unit == "x":
        return f"{v:.3f}"
    return f"{v:g}" if not unit else f"{v:g} {unit}"


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x" if r < 100 else f"{r:.0f}x"


def _date(f: dict[str, Any]) -> str:
    return f"{f['date']}, carried over" if f.get("carried") else f["date"]


def _cell(f: dict[str, Any] | None) -> str:
    return "" if f is None else f"{f['system']}: {fmt_value(f['value'], f['unit'])}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _partner_in(systems: dict[str, dict[str, Any]]):
    """The figure a figure's ratio is against, among ``systems``, when it was measured in the
    same run and on the other side."""

    def partner(f: dict[str, Any]) -> dict[str, Any] | None:
        other = systems.get(f.get("against", ""))
        if other is None or other["elsewhere"] == f["elsewhere"] or _stamp(other) != _stamp(f):
            return None
        return other

    return partner


def comparison_rows(figs: list[dict[str, Any]]) -> list[list[str]]:
    """Rows of measurement, elsewhere, alternative, ratio and date: each alternative beside the
    elsewhere figure it was compared with, every figure in one row at least. A figure whose
    partner was measured in another run (a carried-over one) stands alone, its ratio saying
    against what."""
    rows: list[list[str]] = []
    by_name: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in figs:
        by_name.setdefault((f["group"], f["name"]), []).append(f)
    for (_group, name), fs in by_name.items():
        systems = {f["system"]: f for f in fs}
        partner = _partner_in(systems)
        pairs: list[tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]] = []
        done: set[int] = set()
        for ours in (f for f in fs if f["elsewhere"]):
            mine = [a for a in fs if not a["elsewhere"] and partner(a) is ours]
            pairs += [(ours, a, a) for a in mine]
            other = partner(ours)
            if other is not None and all(other is not a for a in mine):
                pairs.append((ours, other, ours))
            elif other is None and not mine:
                pairs.append((ours, None, ours))
            done.update(id(x) for x in (ours, *mine))
        pairs += [(None, a, a) for a in fs if not a["elsewhere"] and id(a) not in done]
        last: dict[str, Any] | None = None
        for i, (ours, theirs, rated) in enumerate(pairs):
            ratio = ""
            if rated is not None and "ratio" in rated:
                ratio = fmt_ratio(rated["ratio"])
                if ours is None or theirs is None:
                    was = rated.get("against_value")
                    was = f": {fmt_value(was, rated['unit'])}" if _finite(was) else ""
                    ratio += f" (against {rated['against']} of that run{was})"
            date = ", ".join(sorted({_date(x) for x in (ours, theirs) if x is not None}))
            rows.append([name if i == 0 else "", "" if ours is not None and ours is last else _cell(ours),
                         _cell(theirs), ratio, date])  # fmt: skip
            last = ours
    return rows


def series_table(figs: list[dict[str, Any]]) -> str:
    """Figures with a job size (``tasks``): one row per size, one column per system."""
    systems = list(
        dict.fromkeys(f["system"] for f in sorted(figs, key=lambda f: not f["elsewhere"]))
    )
    sizes = sorted({f["tasks"] for f in figs})
    cell = {(f["tasks"], f["system"]): f for f in figs}
    rows = []
    for n in sizes:
        row = [f"{n:,}".replace(",", " ")]
        for s in systems:
            f = cell.get((n, s))
            row.append("" if f is None else fmt_value(f["value"], f["unit"])
                       + (f" ({fmt_ratio(f['ratio'])})" if "ratio" in f and not f["elsewhere"] else ""))  # fmt: skip
        row.append(", ".join(sorted({_date(f) for f in figs if f["tasks"] == n})))
        rows.append(row)
    return _table(["tasks", *systems, "date"], rows)


# -- the README ----------------------------------------------------------------------------------------

#: (title, the scripts whose figures it shows, what a reader needs to know to read them)
SECTIONS: list[tuple[str, tuple[str, ...], str]] = [
    (
        "Local workers",
        ("local",),
        "`ew.map`, `ew.submit` and `ew.Executor` on `ew.local(cores=2)` (every result durable on disk, "
        "the workers detached) beside `concurrent.futures.ProcessPoolExecutor` (PPE), "
        "`multiprocessing.Pool`, loky and dask.distributed, each with 2 worker processes. Every "
        "measurement runs in a fresh interpreter after its imports; rounds are interleaved and the "
        "median is shown. *Cold*: no workers running beforehand, the pool's start included.",
    ),
    (
        "The peer network",
        ("peer", "peer_loop", "peer_link", "peer_wire"),
        "Two `elsewhere peer worker` daemons of one slot each on this machine, over loopback "
        "(`bench/peer_link.py`: over a veth pair between two network namespaces, shaped to 1 Gbit/s), "
        "beside dask.distributed (`LocalCluster(n_workers=2)`), ipyparallel and ProcessPoolExecutor; "
        "a bare TCP socket between two Python processes is the floor for large data.",
    ),
    (
        "The peer network at scale",
        ("peer_scale",),
        "32 `elsewhere peer worker` daemons of one slot each on three hosts (network namespaces on one "
        "bridge, 10-11 daemons a host, found by multicast with a group key) and 4 controllers, each "
        "`ew.map` of tasks that sleep 100, 200, 400 or 800 ms, started at the same moment for about a "
        "minute of contention. Fair share: each controller's worker-seconds (what the daemons charged "
        "it) while all four had tasks waiting; target within 10% of an equal share. Placement: the "
        "controller's CPU in its placing step per task placed (the ASK's encoding left out); target "
        "<= 50 us. Beside it, the same four jobs from four clients of dask.distributed with one "
        "scheduler and 32 one-thread workers on loopback. The 32 daemons share 2 cores here.",
    ),
    (
        "The peer network at scale (simulated)",
        ("peer_sim",),
        "The real announcement code (pacing, encoding and signing, checking, the peer table and its "
        "expiry) on a simulated clock, without sockets, for groups of 10 to 10 000 peers (up to 4 "
        "controllers, workers changing state every 10 s or so): what one host sends, receives and "
        "checks, its peer table's memory and its CPU per simulated minute, with the announcements "
        "paced by the group's size (this version) beside every peer every second (version 1's pace).",
    ),
    (
        "Memory over many jobs",
        ("memory",),
        "The RSS of a warm local worker of `ew.local(cores=2)` and of an `elsewhere peer worker` daemon "
        "(2 slots, on loopback) after their first job of 1 000 no-op tasks, after 100 such jobs, and, for "
        "the daemon, after 100 000 frames it must refuse, each on a connection of its own (garbage, damaged "
        "or replayed handshakes, another key of the same group name, bad MACs after a real handshake); "
        "beside a ProcessPoolExecutor(2) worker and a dask.distributed worker after the same jobs. "
        "Target: within 10% of the first job's figure.",
    ),
    (
        "ssh nodes",
        ("ssh",),
        '`ew.ssh({"ci": 2})` over a loopback sshd, the venv\'s interpreter on the far side, beside '
        "plain `rsync -a` over the same sshd.",
    ),
    (
        "SLURM",
        ("slurm", "slurm_short"),
        "The single-node SLURM of `ci/services` (8 CPUs configured on the 2 cores), beside submitit's "
        "`map_array`.",
    ),
    (
        "Communicating (MPI) jobs",
        ("mpi",),
        "Two ranks to their first result (an allreduce), beside a bare `mpiexec -n 2 python -c ...`.",
    ),
    (
        "joblib and scikit-learn",
        ("joblib_gridsearch",),
        "A GridSearchCV of an SVC on 1000 digits (100 fits of 20-80 ms) through joblib, 2 workers "
        "each, *cold* (workers start during the fit) and *warm*.",
    ),
    (
        "The web view",
        ("web",),
        "What `elsewhere web` costs, with a real headless Chromium on the page.",
    ),
    (
        "The job folder",
        ("checksum",),
        "What the job folder's checksums cost: XXH3-64 (the one used) beside the alternatives, and "
        "writing and reading 100 MB of results with and without it.",
    ),
]

#: the order of a script's groups in its table (others follow, as first recorded)
GROUP_ORDER = {
    "local": (
        "cold10k",
        "cold100k",
        "warm10k",
        "first",
        "cpu",
        "big",
        "large",
        "latency",
        "memory",
    ),
    "peer": ("rt", "tput", "big", "bytes", "blas", "crypt", "latency", "memory"),
    "memory": ("local", "peer"),
}

INTRO = """\
# Benchmarks

How fast elsewhere is, measured on one machine against what a user would pick instead. Each
benchmark in this folder is a script you can run yourself with the project's venv (`--help`
says what it measures); each prints its tables and, with `--json FILE`, writes its figures
for this page. **This page is generated**: after a run, put the figures into `bench/figures/`
and regenerate the page and its plots:

```sh
.venv/bin/python bench/local.py --rounds 3 --json bench/figures/local.json
.venv/bin/python bench/report.py          # this page and docs/img/bench-*.png
```

`bench/report.py` reads every file in `bench/figures/` and keeps the newest figure of each kind,
so a run of one group (`--only`) into a file of its own refreshes those figures alone. The
figures of earlier runs, what changed between them and where the time went are in the git
history of `bench/figures/` and of this page.

**How to read them.** A *ratio* is elsewhere's lead over the alternative beside it: the
alternative's time over elsewhere's (or elsewhere's rate over the alternative's); above 1,
elsewhere is ahead. Both sides of a ratio were measured in the same run, minutes apart. The
machine is small and shared with other work: its cores and its load during each run are given
under each table, and absolute times move with the load (2-3x from minute to minute), the
ratios less. Figures marked *carried over* could not be measured again for this page (why is
said under the table) and keep their own date.
"""


def _runs(
    docs: list[dict[str, Any]], benches: tuple[str, ...], figs: list[dict[str, Any]]
) -> list[str]:
    used = {(f["bench"], f["date"], f.get("time", "")) for f in figs}
    out = []
    for d in docs:
        if d["bench"] not in benches or (d["bench"], d["date"], d.get("time", "")) not in used:
            continue
        load = d.get("load") or []
        loads = f"load {' to '.join(f'{x:.1f}' for x in load)}" if load else "load not recorded"
        when = f"{d['date']} {d.get('time', '')}".strip()
        line = f"- `{d['command']}`: {when}, {d.get('cores', '?')} cores, {loads}"
        if d.get("carried"):
            line += f". *Carried over*: {d.get('why', 'not measured again')}"
        out.append(line + ".")
    return out


PLOTS = {
    THROUGHPUT_PNG: "Throughput against the number of tasks, local workers",
    ROUNDTRIP_PNG: "The distribution of a call's round trip",
}


def _place(f: dict[str, Any], benches: tuple[str, ...]) -> tuple[int, int]:
    order = GROUP_ORDER.get(f["bench"], ())
    return benches.index(f["bench"]), order.index(f["group"]) if f["group"] in order else len(order)


def render(docs: list[dict[str, Any]], plots: Iterable[str] = ()) -> str:
    """The README's text from the runs ``docs`` (see :func:`load`), showing ``plots`` (their
    paths relative to the README)."""
    figs = current(docs)
    out = [INTRO]
    out += [f"![{PLOTS.get(Path(p).name, Path(p).stem)}]({p})\n" for p in plots]
    known = {b for _, benches, _ in SECTIONS for b in benches}
    others = [(f"`bench/{b}.py`", (b,), "") for b in sorted({f["bench"] for f in figs} - known)]
    for title, benches, about in SECTIONS + others:
        mine = sorted((f for f in figs if f["bench"] in benches), key=lambda f: _place(f, benches))
        if not mine:
            continue
        out.append(f"## {title}\n" + (f"\n{textwrap.fill(about, 96)}\n" if about else ""))
        plain = [f for f in mine if "tasks" not in f]
        if plain:
            out.append(
                _table(
                    ["measurement", "elsewhere", "alternative", "ratio", "date"],
                    comparison_rows(plain),
                )
            )
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for f in mine:
            if "tasks" in f:
                groups.setdefault((f["bench"], f["group"]), []).append(f)
        for fs in groups.values():
            out.append(f"\n{fs[0]['name']} (the ratio: elsewhere's lead):\n")
            out.append(series_table(fs))
        out.append("\nMeasured with:\n\n" + "\n".join(_runs(docs, benches, mine)) + "\n")
    return "\n".join(out).rstrip() + "\n"


# -- the plots -----------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})


def plot_throughput(figs: list[dict[str, Any]], path: Path) -> bool:
    """Tasks per second against the job's size, one line per system (local workers)."""
    pts = [f for f in figs if f["bench"] == "local" and "tasks" in f and f["unit"] == "tasks/s"]
    if not pts:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for system in dict.fromkeys(f["system"] for f in sorted(pts, key=lambda f: not f["elsewhere"])):
        line = sorted((f["tasks"], f["value"]) for f in pts if f["system"] == system)
        ours = any(f["elsewhere"] for f in pts if f["system"] == system)
        ax.plot([n for n, _ in line], [v for _, v in line], marker="o", linewidth=2.5 if ours else 1.2,
                label=f"elsewhere {system}" if ours else system)  # fmt: skip
    dates = sorted({f["date"] for f in pts})
    ax.set(xscale="log", yscale="log", xlabel="no-op tasks in the job",
           ylabel="tasks per second, start to last result",
           title=f"No-op tasks on 2 local workers, cold ({', '.join(dates)})")  # fmt: skip
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return True


def plot_roundtrip(figs: list[dict[str, Any]], path: Path) -> bool:
    """The share of calls done within a time (log), one panel per measurement with samples."""
    panels: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for f in figs:
        if f.get("samples"):
            panels.setdefault((f["bench"], f["group"], f["name"]), []).append(f)
    if not panels:
        return False
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    # the round trip first, then the result latency, local workers before peers
    order = sorted(panels.items(), key=lambda kv: (kv[0][1] != "rt", kv[0][0] != "local"))
    for ax, ((bench, _group, name), fs) in zip(axes.flat, order):
        for f in sorted(fs, key=lambda f: not f["elsewhere"]):
            xs = sorted(x * 1e3 for x in f["samples"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", linewidth=2.5 if f["elsewhere"] else 1.2,
                    label=f"{f['system']} (median {fmt_value(f['value'], f['unit'])})")  # fmt: skip
        title = textwrap.fill(f"{bench}: {name.removesuffix(', median')} ({fs[0]['date']})", 60)
        ax.set(xscale="log", xlabel="ms (log scale)", ylabel="share of calls done within", ylim=(0, 1.02),
               title=title)  # fmt: skip
        ax.title.set_fontsize(9)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--from",
        dest="src",
        default=str(ROOT / "bench" / "figures"),
        help="the folder of the scripts' JSON files (default bench/figures)",
    )
    p.add_argument("--readme", default=str(ROOT / "bench" / "README.md"), help="the page to write")
    p.add_argument(
        "--img", default=str(ROOT / "docs" / "img"), help="where the plots go (default docs/img)"
    )
    p.add_argument(
        "--no-plots", action="store_true", help="the README alone (no matplotlib needed)"
    )
    args = p.parse_args(argv)
    docs = load(args.src)
    if not docs:
        print(f"no figures in {args.src}", file=sys.stderr)
        return 1
    readme, img = Path(args.readme).resolve(), Path(args.img).resolve()
    figs = current(docs)
    drawn = []
    if not args.no_plots:
        for name, draw in ((THROUGHPUT_PNG, plot_throughput), (ROUNDTRIP_PNG, plot_roundtrip)):
            if draw(figs, img / name):
                drawn.append(os.path.relpath(img / name, readme.parent).replace(os.sep, "/"))
    readme.write_text(render(docs, drawn), encoding="utf-8")
    print(f"wrote {readme.name} ({len(figs)} figures) and {len(drawn)} plot(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
