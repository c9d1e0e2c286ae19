"""Helpers shared by the benchmarks in ``bench/``: fresh subprocesses, fresh
elsewhere homes, stray-worker clean-up, medians and a ratio table.

Stdlib only, and cheap to import: benchmark modules that import it are also
imported by worker processes (their task functions travel by reference).

A benchmark runs each measurement in a fresh child process::

    res = run_child(script, "name", {"n": 10000}, home=True)

which starts ``<venv python> script --child name '<json params>'``, with
``ELSEWHERE_HOME`` set to a new temporary folder when ``home`` is true; the
child calls :func:`child_main` with its table of measurement functions and
prints one ``RESULT {json}`` line. Afterwards the parent makes sure no
``elsewhere.worker`` started under that home is left (each is killed by pid,
only those) and removes the folder.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def venv_python() -> str:
    """The absolute path of the project's venv interpreter (else this one)."""
    p = ROOT / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


_workers_cpu = 0.0  # CPU-seconds of the workers stop_workers found (reported by a child)


# -- stray workers --------------------------------------------------------------
def worker_pids(home: str | os.PathLike[str]) -> list[int]:
    """Pids of ``elsewhere.worker`` processes whose command line names ``home``."""
    needle = os.fsencode(str(home))
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/comm", "rb") as f:
                forked = f.read().strip() == b"ew-worker"  # a fork of its client (see hosts/forkstart.py)
        except OSError:
            continue
        if (b"elsewhere.worker" in cmd and needle in cmd) or (forked and _holds(int(name), needle)):
            out.append(int(name))
    return out


def _holds(pid: int, folder: bytes) -> bool:
    """Whether process ``pid`` holds a descriptor of a file under ``folder``."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.fsencode(os.readlink(f"/proc/{pid}/fd/{fd}")).startswith(folder + b"/"):
                return True
        except OSError:
            continue
    return False


def stop_workers(home: str | os.PathLike[str], timeout_s: float = 5.0,
                 shutdown: Callable[[], Any] | None = None) -> int:
    """Wait until no worker of ``home`` runs; ask with ``shutdown()`` meanwhile.

    ``shutdown`` is ``ew.local().shutdown`` called with ``ELSEWHERE_HOME``
    pointing at ``home`` (it only reaches idle workers, so it is repeated
    while workers finish their job). What is left after ``timeout_s`` is
    killed by pid. Returns how many had to be killed.
    """
    global _workers_cpu
    deadline = time.monotonic() + timeout_s
    _workers_cpu += sum(proc_cpu_s(pid) for pid in worker_pids(home))
    while True:
        if shutdown is not None:
            try:
                shutdown()
            except Exception:
                pass
        pids = worker_pids(home)
        if not pids:
            return 0
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        t_end = time.monotonic() + 2.0
        while time.monotonic() < t_end and worker_pids(home):
            time.sleep(0.02)
        left = worker_pids(home)
        if not left:
            break
        pids = left
    return len(pids)


# -- children -------------------------------------------------------------------
class ChildFailed(RuntimeError):
    pass


_compiled = False


def stop_procs(procs: Iterable[subprocess.Popen[Any]], timeout_s: float = 15.0) -> None:
    """SIGTERM each of ``procs`` (ours: peer workers drain on it), then wait; SIGKILL the
    ones still there after ``timeout_s``."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def compile_bytecode() -> None:
    """Write the bytecode of elsewhere and of the benchmarks' task module, once.

    An installed package has it (pip compiles what it installs); an editable
    install under ``PYTHONDONTWRITEBYTECODE`` would compile every module in
    every fresh process, and the benchmarks would measure the compiler.
    """
    global _compiled
    if _compiled:
        return
    _compiled = True
    import compileall

    compileall.compile_dir(str(ROOT / "src" / "elsewhere"), quiet=1)
    compileall.compile_file(str(BENCH / "_tasks.py"), quiet=1)


def run_child(script: str | os.PathLike[str], name: str, params: dict[str, Any] | None = None, *,
              home: bool = False, timeout_s: float = 300.0, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run measurement ``name`` of ``script`` in a fresh interpreter; its result dict.

    With ``home``, the child gets a fresh ``ELSEWHERE_HOME``; its workers are
    stopped (by pid if they linger) and the folder removed afterwards.
    """
    compile_bytecode()
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = str(BENCH) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    h = None
    if home:
        import tempfile  # (here: it loads random, which a measuring child should not hold)

        h = tempfile.mkdtemp(prefix="ewbench-")
        e["ELSEWHERE_HOME"] = h
    try:
        cmd = [venv_python(), str(script), "--child", name, json.dumps(params or {})]
        b0, r0, t0 = machine_busy_s(), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout_s, cwd=str(ROOT))
        wall, busy, r1 = time.monotonic() - t0, machine_busy_s() - b0, resource.getrusage(resource.RUSAGE_CHILDREN)
        for line in p.stdout.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
                ours = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime + res.pop("_workers_cpu", 0.0)
                # The share of the machine's CPU that others (other tenants,
                # vCPU steal) took while the child ran: how noisy it was.
                res["_others"] = max(0.0, busy - ours) / ((os.cpu_count() or 1) * wall)
                return res
        raise ChildFailed(f"{name} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    finally:
        if h is not None:
            killed = stop_workers(h, timeout_s=3.0)
            if killed:
                print(f"  [{name}: killed {killed} lingering worker(s)]", file=sys.stderr)
            shutil.rmtree(h, ignore_errors=True)


def child_main(table: dict[str, Callable[..., dict[str, Any]]], argv: list[str]) -> None:
    """In the child: run ``table[name](**params)`` and print its result."""
    name, params = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    out = table[name](**params)
    out["_workers_cpu"] = _workers_cpu
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")
    sys.stdout.flush()


# -- figures ----------------------------------------------------------------------
def median(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None]
    import statistics  # (here: it loads random, which a measuring child should not hold)

    return statistics.median(xs) if xs else float("nan")


def fmt_time(s: float) -> str:
    if s != s:
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms" if s < 0.1 else f"{s * 1e3:.0f} ms"
    return f"{s:.2f} s"


def fmt_rate(per_s: float) -> str:
    if per_s != per_s:
        return "n/a"
    return f"{per_s / 1e3:.1f}k/s" if per_s >= 1e3 else f"{per_s:.0f}/s"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (readable as plain text too)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(r) for r in rows)])


def verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return "info"
    if ratio != ratio:
        return "n/a"
    return "PASS" if ratio >= target else "FAIL"


def machine_busy_s() -> float:
    """CPU-seconds this machine has been busy (all cores, vCPU steal included)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """CPU-seconds used so far by process ``pid`` (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def have(module: str) -> bool:
    """Whether ``module`` can be imported by the venv interpreter."""
    import importlib.util

    return importlib.util.find_spec(module) is not None
