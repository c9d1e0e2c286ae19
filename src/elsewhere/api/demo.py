"""The README's main job: a real parallel computation on this machine.

Estimates pi by Monte Carlo integration in pure Python, split into tasks
that run on local worker processes, and compares the wall time with running
the same tasks one after another in this process.
"""

from __future__ import annotations

import random
import time
from typing import Any

import elsewhere as ew


def estimate_pi(samples: int) -> dict[str, Any]:
    """Count random points that fall in the unit quarter circle (seeded per task)."""
    rand = random.random
    inside = 0
    for _ in range(samples):
        x, y = rand(), rand()
        if x * x + y * y <= 1.0:
            inside += 1
    t = ew.task()
    return {"task": t.index, "inside": inside, "samples": samples, "seed": t.seed}


def run(
    tasks: int | None = None, samples: int = 1_500_000, progress: bool | None = None
) -> dict[str, Any]:
    """Run the demo; returns the figures it printed."""
    from rich.table import Table

    from ..backends.local import machine_cores
    from .terminal import console as make_console

    console = make_console()  # on a pipe, the commands of the last line are not wrapped
    cores = machine_cores()
    tasks = tasks or max(4, 4 * cores)
    console.print(
        f"[bold]elsewhere demo[/]: pi from {tasks} tasks of {samples:,} random points "
        f"on {cores} local cores"
    )
    t0 = time.perf_counter()
    job = ew.submit(
        estimate_pi,
        [samples] * tasks,
        name=f"demo-{int(time.time())}",
        seed=2026,
        on=ew.local(cores=cores),
    )
    console.print(f"submitted job [cyan]{job.name}[/] ({job.path})")
    job.wait(progress=progress)
    results = job.get()
    parallel_s = time.perf_counter() - t0
    inside = sum(r["inside"] for r in results)
    total = sum(r["samples"] for r in results)
    pi = 4.0 * inside / total
    # The serial reference: one task's worth, timed here, times the number of tasks.
    t1 = time.perf_counter()
    ref = 2
    for _ in range(ref):
        _serial(samples)
    serial_s = (time.perf_counter() - t1) / ref * tasks
    table = Table(title="result")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("pi estimate", f"{pi:.6f}")
    table.add_row("error", f"{abs(pi - 3.141592653589793):.2e}")
    table.add_row("tasks", str(tasks))
    table.add_row("wall time, elsewhere", f"{parallel_s:.2f} s")
    table.add_row("wall time, serial (estimated)", f"{serial_s:.2f} s")
    table.add_row("speed-up", f"{serial_s / parallel_s:.2f}x on {cores} cores")
    console.print(table)
    console.print("the job stays on disk; next:", highlight=False)
    for verb in ("status", "results", "purge"):  # one command a line: copied whole, never wrapped
        console.print(f"  [bold]elsewhere {verb} {job.name}[/]", highlight=False)
    return {"pi": pi, "parallel_s": parallel_s, "serial_s": serial_s, "job": job.name}


def _serial(samples: int) -> int:
    rand = random.Random(1).random
    inside = 0
    for _ in range(samples):
        x, y = rand(), rand()
        if x * x + y * y <= 1.0:
            inside += 1
    return inside
