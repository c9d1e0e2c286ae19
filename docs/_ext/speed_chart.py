"""Draws the chart of docs/speed.md: elsewhere's speed relative to each alternative, from the
figures the page's tables quote (bench/README.md; docs/joblib.md for the grid search).

    .venv/bin/python docs/_ext/speed_chart.py        # writes docs/img/speed-ratios.svg

Plain SVG written by hand (no plotting library): horizontal bars on a log scale, 1x marked.
Edit RATIOS when the page's figures change, and run it again.
"""

from __future__ import annotations

import math
from pathlib import Path
from xml.sax.saxutils import escape

#: (group, what, ratio): the alternative's time over elsewhere's (above 1: elsewhere is faster)
RATIOS: list[tuple[str, str, float]] = [
    ("local", "10 000 no-op tasks, cold, vs ProcessPoolExecutor, one submit each", 30.0),
    ("local", "10 000 no-op tasks, cold, vs ProcessPoolExecutor.map(chunksize)", 0.66),
    ("local", "100 000 no-op tasks, cold, vs ProcessPoolExecutor.map(chunksize)", 1.04),
    ("local", "10 000 no-op tasks, warm workers, vs a warm ProcessPoolExecutor.map", 0.60),
    ("local", "first result from cold, vs a dask LocalCluster", 16.8),
    ("local", "20 tasks of 0.5 s of CPU, vs two bare processes", 0.98),
    ("local", "a 100 MB array argument, vs a warm ProcessPoolExecutor", 3.38),
    ("local", "Executor: one call's result latency, vs ProcessPoolExecutor", 0.23),
    ("peer", "Executor round trip of a tiny task, vs ProcessPoolExecutor", 0.46),
    ("peer", "10 000 no-op tasks with ew.map, vs dask.distributed", 94.2),
    ("peer", "100 MB each way through the Executor, vs an encrypted bare echo", 1.10),
    ("peer", "ew.map called in a loop, vs dask.distributed", 0.93),
    ("peer", "ew.map(np.linalg.pinv, ...) on 2 workers, vs a loop in the caller", 1.06),
    ("ssh", "submitting a 100 MB argument, vs plain rsync", 1.15),
    ("slurm", "1 000 tasks, all results back, vs submitit's map_array", 2.28),
    ("mpi", "2 ranks, submit to first result, vs bare mpiexec", 0.99),
    ("joblib", "GridSearchCV, warm, local workers, vs loky", 0.95),
    ("joblib", "GridSearchCV, warm, job path (as on SLURM), vs loky", 1.26),
]

LO, HI = 0.1, 100.0  # the axis, log scale
LABEL_W, BAR_W, VALUE_W, ROW_H, TOP = 540, 330, 60, 22, 34


def _x(r: float) -> float:
    r = min(max(r, LO), HI)
    return LABEL_W + BAR_W * (math.log10(r) - math.log10(LO)) / (math.log10(HI) - math.log10(LO))


def svg() -> str:
    width = LABEL_W + BAR_W + VALUE_W
    height = TOP + ROW_H * len(RATIOS) + 28
    one = _x(1.0)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        '<text x="8" y="16" fill="#222">the alternative\'s time / elsewhere\'s '
        "(log scale; right of 1x: elsewhere is faster)</text>",
    ]
    for tick in (0.1, 0.3, 1, 3, 10, 30, 100):
        x = _x(tick)
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 24}" '
                   f'stroke="{"#444" if tick == 1 else "#ddd"}"/>')  # fmt: skip
        out.append(
            f'<text x="{x:.1f}" y="{height - 10}" text-anchor="middle" fill="#444">{tick:g}x</text>'
        )
    for i, (group, what, r) in enumerate(RATIOS):
        y = TOP + i * ROW_H
        x = _x(r)
        colour = "#2e7d32" if r >= 1 else "#ef6c00"
        left, right = (one, x) if x >= one else (x, one)
        out.append(f'<text x="{LABEL_W - 8}" y="{y + 14}" text-anchor="end" fill="#222">'
                   f"{escape(group)}: {escape(what)}</text>")  # fmt: skip
        out.append(f'<rect x="{left:.1f}" y="{y + 4}" width="{max(right - left, 1):.1f}" height="{ROW_H - 8}" '
                   f'fill="{colour}"/>')  # fmt: skip
        out.append(f'<text x="{LABEL_W + BAR_W + 6}" y="{y + 14}" fill="#222">{r:g}x</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / "img" / "speed-ratios.svg"
    target.parent.mkdir(exist_ok=True)
    target.write_text(svg(), encoding="utf-8")
    print(f"wrote {target}")
