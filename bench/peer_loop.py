"""``ew.map`` called in a loop on peer workers, the function importing the user's own module.

An optimiser, a parameter scan or a notebook calls ``ew.map`` again and again;
each call is a job, and the task function imports a module of the user's (the
model, the analysis code). A worker's child that imported user modules for
one job must not run another job's code with them loaded; since session 9 it
serves later jobs of the same context (same member, folder, ``sys.path``,
environment) while those modules' files are unchanged, and before that it
was replaced for every job, one interpreter after another.

Measured side by side in one run, on loopback, with W workers of S slots
each: ``ew.map`` of N tasks of ``--task-ms`` each, C calls in a loop, against
dask.distributed (``LocalCluster(n_workers=W, threads_per_worker=S)``,
``client.gather(client.map(...))``), the alternative a user would pick to run
a function on a few machines. Both run the same function from the same
project folder; the first calls of each are a warm-up, not counted (two for
the peers: their workers grow their pools of task processes). Also shown:
how many task processes the peer workers started during the counted calls
(0 when the children are reused), and one call after the module was edited
(fresh children, the new code).

    .venv/bin/python bench/peer_loop.py [--workers 3] [--slots 4] [--tasks 24] [--calls 5] [--task-ms 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import stop_procs, venv_python

TASK_MODULE = textwrap.dedent("""
    import time

    def step(x, seconds):
        import loop_model  # the user's own module
        time.sleep(seconds)
        return loop_model.VERSION, x
""")


def child(args: argparse.Namespace, project: Path, key: str, port: int, stats: list[str]) -> dict:
    """Runs in the project folder: the loops, ew then dask."""
    import elsewhere as ew

    sys.path.insert(0, str(project))
    import loop_task  # type: ignore[import-not-found]

    def started() -> int:
        time.sleep(1.2)  # the workers write their counters every second
        return sum(json.loads(Path(s).read_text())["children_started"] for s in stats)

    seconds = args.task_ms / 1000.0
    xs = list(range(args.tasks))
    on = ew.peers("bench", key=key, port=port, interface="127.0.0.1")
    for _ in range(2):  # warm-up: the workers grow their pools of task processes
        ew.map(loop_task.step, xs, [seconds] * len(xs), on=on)
    before = started()
    ew_times = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        out = ew.map(loop_task.step, xs, [seconds] * len(xs), on=on)
        ew_times.append(time.perf_counter() - t0)
        assert out == [(1, x) for x in xs]
    spawned = started() - before
    (project / "loop_model.py").write_text("VERSION = 2\n")
    t0 = time.perf_counter()
    out = ew.map(loop_task.step, xs, [seconds] * len(xs), on=on)
    edited = time.perf_counter() - t0
    assert out == [(2, x) for x in xs], "an edited module must run in its new version"
    (project / "loop_model.py").write_text("VERSION = 1\n")

    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=args.workers, threads_per_worker=args.slots, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:  # fmt: skip
        client.gather(client.map(loop_task.step, xs, [seconds] * len(xs), pure=False))  # warm-up
        dask_times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            out = client.gather(client.map(loop_task.step, xs, [seconds] * len(xs), pure=False))
            dask_times.append(time.perf_counter() - t0)
            assert [x for _, x in out] == xs
    return {"ew": ew_times, "dask": dask_times, "spawned": spawned, "edited": edited}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--tasks", type=int, default=24)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--task-ms", type=float, default=50.0)
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    args = p.parse_args()
    if args.child:
        project, key, port, stats = args.child
        res = child(args, Path(project), key, int(port), json.loads(stats))
        print("RESULT " + json.dumps(res))
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from report import Figures

    from peer import start_workers

    record = Figures("peer_loop", sys.argv[1:])

    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "loop_task.py").write_text(TASK_MODULE)
        (project / "loop_model.py").write_text("VERSION = 1\n")
        workers, port, key, _ = start_workers(tmp, args.workers, slots=args.slots)
        stats = [str(Path(tmp) / f"w{i}.json") for i in range(args.workers)]
        try:
            env = {**os.environ, "ELSEWHERE_HOME": str(Path(tmp) / "home")}
            out = subprocess.run(
                [venv_python(), __file__, "--workers", str(args.workers), "--slots", str(args.slots),
                 "--tasks", str(args.tasks), "--calls", str(args.calls), "--task-ms", str(args.task_ms),
                 "--child", str(project), key, str(port), json.dumps(stats)],
                cwd=project, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        finally:
            stop_procs(workers)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
        return 1
    res = json.loads(lines[-1][7:])
    ew_t, dask_t = statistics.median(res["ew"]), statistics.median(res["dask"])
    ideal = args.tasks * args.task_ms / 1000.0 / (args.workers * args.slots)
    print(f"# bench/peer_loop.py: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
          f"{args.workers} workers x {args.slots} slots, {args.tasks} tasks of {args.task_ms:g} ms a call, "
          f"{args.calls} calls (ideal {ideal * 1000:.0f} ms a call)\n")
    print("| measurement | median a call | calls | ratio |")
    print("|---|---|---|---|")
    print(f"| ew.map on peers | {ew_t * 1000:.0f} ms | {', '.join(f'{t * 1000:.0f}' for t in res['ew'])} | |")
    print(f"| dask client.map + gather | {dask_t * 1000:.0f} ms | "
          f"{', '.join(f'{t * 1000:.0f}' for t in res['dask'])} | {dask_t / ew_t:.2f}x |")  # fmt: skip
    print(f"| peer task processes started during the counted calls | {res['spawned']} | | |")
    print(f"| ew.map after the module was edited (fresh processes, new code) | {res['edited'] * 1000:.0f} ms | | |")
    print(f"\nload {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        what = (f"ew.map called in a loop: {args.tasks} tasks of {args.task_ms:g} ms a call on {args.workers} "
                f"workers of {args.slots} slots")  # fmt: skip
        record.compare("loop", f"{what}, the median call", ("ew.map", ew_t), [("dask client.map + gather", dask_t)],
                       "s")  # fmt: skip
        record.add("loop", f"{what}, the first call after the module was edited (fresh processes)", "ew.map",
                   res["edited"], "s", elsewhere=True)  # fmt: skip
        record.add("loop", f"{what}: task processes started during the counted calls", "peer workers",
                   res["spawned"], "", elsewhere=True)  # fmt: skip
        record.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
