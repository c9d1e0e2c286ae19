"""The ssh backend over the loopback sshd (ci/services/sshd.sh): logins, submit, transfer.

    .venv/bin/python bench/ssh.py [--rounds 3] [--only many,big] [--json FILE]

Each measurement runs in a fresh interpreter with a fresh ``ELSEWHERE_HOME`` and its own
remote storage; rounds are interleaved and the median is reported.

1. ``many``: 200 no-op tasks on ``ew.ssh({"ci": 2})``: ssh logins (target: one per host per
   session), counted three ways: the transport's ``connections_opened``, the sshd log's
   "Connection from" lines, and ``ss`` (established connections to the sshd at the end).
   Every ssh this client runs binds to its own loopback address (``BindAddress=127.x.y.z``,
   an ssh option the transport passes to every ssh and rsync), so the log lines of other
   users of the same sshd are not counted. Also: time to submit, time to all results, and
   where submit time goes, each step timed (probe and payload stream, which run while the
   client writes; the rest of the copy and the agent start, on the agent's session) with
   the client-side rest (pickling, the job folder, the registry), and the ssh processes.
2. ``big``: one task whose argument is a 100 MB NumPy array of random doubles (zstd cannot
   shrink them), against plain ``rsync -a`` of the same array (an ``.npy`` file) over the
   same sshd, a new ssh login included as rsync does it. Rates are MB/s of the array;
   ``submit`` is what a user waits for (serialise, write, copy, start), split into the
   client's writing (the copy streams meanwhile) and what follows it. Target: submit rate
   >= 0.8 x rsync's.

Missed targets are reported (FAIL), never turned into an exit status.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

pc = time.perf_counter
N_MANY = 200
BIG_MB = 100
HOST_CORES = 2


def noop(x):
    return x


def arr_sum(a):
    return float(a.sum())


# -- timing the ssh round trips of a submission ---------------------------------------------


class Steps:
    """Wall time of each ssh round trip, by step, recorded by wrapping the backend's methods."""

    def __init__(self) -> None:
        import threading

        self.events: list[tuple[str, float]] = []
        self.local = threading.local()  # nesting depth, per thread (the probe runs in its own)

    def wrap(self, owner: Any, name: str, label) -> None:
        inner = getattr(owner, name)
        steps = self

        def timed(obj, *args, **kw):
            what = label(obj, *args, **kw) if callable(label) else label
            depth = getattr(steps.local, "depth", 0)
            steps.local.depth = depth + 1
            t0 = pc()
            try:
                return inner(obj, *args, **kw)
            finally:
                steps.local.depth = depth
                if what and depth == 0:
                    steps.events.append((what, pc() - t0))

        setattr(owner, name, timed)

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for what, s in self.events:
            out[what] = out.get(what, 0.0) + s
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for what, _ in self.events:
            out[what] = out.get(what, 0) + 1
        return out


def _instrument() -> tuple[Steps, Steps]:
    """(steps of submit, low-level round trips): one ssh or rsync process each."""
    from elsewhere.backends.ssh import SSHCluster
    from elsewhere.hosts import ssh as remote_ssh
    from elsewhere.hosts.session import AgentSession
    from elsewhere.hosts.ssh import SSHTransport

    top = Steps()
    top.wrap(SSHCluster, "probe", "probe (agent info; the ssh login if not open yet)")
    top.wrap(SSHCluster, "_agent", lambda self, host, op, *a, **k: f"agent {op}")
    outer = Steps()  # its own nesting, so that the steps inside it are timed too
    outer.events = top.events
    outer.wrap(SSHCluster, "submit_independent", "submit_independent (after the inputs are written)")
    top.wrap(AgentSession, "put_growing", "payload streamed while written (overlaps)")
    top.wrap(AgentSession, "put_tree", "copy: the rest of the folder (agent session)")
    top.wrap(SSHTransport, "sync_up", "sync_up (rsync)")
    top.wrap(SSHTransport, "sync_down", "sync_down (rsync)")
    top.wrap(SSHTransport, "put", "put queue.json (rsync)")
    top.wrap(SSHTransport, "run", lambda self, argv, **k: f"run {argv[0]}")
    low = Steps()
    low.wrap(SSHTransport, "_start_master", "ssh login (master)")
    low.wrap(SSHTransport, "_check_master", "ssh -O check")
    # every ssh client and every rsync goes through one of these two
    low.wrap(SSHTransport, "_run_ssh", "ssh session")
    low.wrap(AgentSession, "_open", "agent session opened")
    orig = remote_ssh.run_process

    def run_process(argv, **kw):
        t0 = pc()
        try:
            return orig(argv, **kw)
        finally:
            if argv and argv[0] == "rsync":
                low.events.append(("rsync process", pc() - t0))

    remote_ssh.run_process = run_process
    return top, low


# -- measurements (each in a fresh child) ---------------------------------------------------


def _bind_address() -> str:
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


def _sshd():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import services

    info = services.ssh()
    if info is None:
        raise RuntimeError(services.why_no_ssh())
    return info


def _logins(log: Path, offset: int, bind: str) -> int:
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return len(re.findall(rf"Connection from {re.escape(bind)} port \d+ ", text))


def _ss(bind: str, port: int) -> int | None:
    try:
        out = subprocess.run(["ss", "-Htn", "state", "established", "src", bind, "dst",
                              f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return len([line for line in out.stdout.splitlines() if line.strip()]) if out.returncode == 0 else None


def _cluster(info, remote: str, bind: str):
    from _common import venv_python

    import elsewhere as ew

    return ew.ssh({info.host: HOST_CORES}, ssh_config=str(info.config), python=venv_python(),
                  remote_storage=remote, ssh_options=[f"BindAddress={bind}"])


def m_many(n: int) -> dict[str, Any]:
    import warnings

    import elsewhere as ew

    warnings.simplefilter("ignore")  # "asked for 2 cores, 1 are free now"
    info = _sshd()
    top, low = _instrument()
    bind = _bind_address()
    log = info.directory / "sshd.log"
    offset = log.stat().st_size
    with tempfile.TemporaryDirectory(prefix="ewbench-ssh-") as remote:
        cl = _cluster(info, remote, bind)
        t0 = pc()
        job = ew.submit(noop, range(n), on=cl, name="bench-many")
        t_submit = pc() - t0
        submit_steps, submit_counts = top.totals(), top.counts()
        submit_low, submit_low_counts = low.totals(), low.counts()
        job.wait(timeout=300, progress=False)
        vals = job.results()
        t_all = pc() - t0
        assert vals == list(range(n)), vals[:5]
        t = cl.transport(info.host)
        opened = t.connections_opened
        established = _ss(bind, info.port)
        polls = top.counts().get("agent poll", 0)
        job.purge(local=True)
        t.close()  # stop our master (SSHCluster.close() keeps it for later sessions)
        time.sleep(0.2)  # sshd writes the log line as it accepts; give it a moment
        logins = _logins(log, offset, bind)
    return {"t_submit": t_submit, "t_all": t_all, "opened": opened, "logins": logins,
            "established": established, "steps": submit_steps, "step_counts": submit_counts,
            "low": submit_low, "low_counts": submit_low_counts, "polls": polls}


def m_big(mb: int) -> dict[str, Any]:
    import warnings

    import numpy as np

    import elsewhere as ew

    warnings.simplefilter("ignore")
    info = _sshd()
    top, _ = _instrument()
    a = np.random.default_rng(0).random(mb * 1_000_000 // 8)
    with tempfile.TemporaryDirectory(prefix="ewbench-ssh-") as remote:
        cl = _cluster(info, remote, _bind_address())
        t = cl.transport(info.host)
        t.run(["true"])  # log in first: the rate is about the data, the login is in `many`
        top.events.clear()
        t0 = pc()
        job = ew.submit(arr_sum, [a], on=cl, name="bench-big")
        t_submit = pc() - t0
        steps = top.totals()
        job.wait(timeout=300, progress=False)
        t_all = pc() - t0
        assert abs(job.results()[0] - float(a.sum())) < 1e-6 * a.size
        size = sum(p.stat().st_size for p in job.path.rglob("*") if p.is_file())
        job.purge(local=True)
        t.close()
    return {"t_submit": t_submit,
            "t_after": steps.get("submit_independent (after the inputs are written)", float("nan")),
            "t_all": t_all, "folder_bytes": size, "array_bytes": a.nbytes, "steps": steps}


def m_rsync(mb: int) -> dict[str, Any]:
    import numpy as np

    info = _sshd()
    a = np.random.default_rng(0).random(mb * 1_000_000 // 8)
    with tempfile.TemporaryDirectory(prefix="ewbench-rsync-") as src, \
            tempfile.TemporaryDirectory(prefix="ewbench-rsync-dst-") as dst:
        path = Path(src) / "a.npy"
        np.save(path, a)
        ctl = f"{src}/ctl"

        def rsync(ssh: str, name: str) -> float:
            argv = ["rsync", "-a", "-e", ssh, str(path), f"{info.host}:{dst}/{name}"]
            t0 = pc()
            subprocess.run(argv, check=True, timeout=300, capture_output=True)
            t = pc() - t0
            assert (Path(dst) / name).stat().st_size == path.stat().st_size
            return t

        plain = rsync(f"ssh -F {info.config}", "plain.npy")
        # the same over an ssh connection opened beforehand (no login in the time)
        subprocess.run(["ssh", "-F", str(info.config), "-o", "ControlMaster=yes", "-o",
                        f"ControlPath={ctl}", "-o", "ControlPersist=60", "-N", "-f", info.host],
                       check=True, timeout=60)
        try:
            mux = rsync(f"ssh -F {info.config} -o ControlPath={ctl} -o ControlMaster=no", "mux.npy")
        finally:
            subprocess.run(["ssh", "-o", f"ControlPath={ctl}", "-O", "exit", info.host],
                           capture_output=True, timeout=30)
        return {"t": plain, "t_mux": mux, "bytes": path.stat().st_size}


CHILDREN = {"many": m_many, "big": m_big, "rsync": m_rsync}


# -- the parent -----------------------------------------------------------------------------


def collect(rounds: int, only: set[str] | None) -> tuple[dict[str, list[dict[str, Any]]], float]:
    from _common import ChildFailed, run_child

    plan = []
    if not only or "many" in only:
        plan.append(("many", "many", {"n": N_MANY}))
    if not only or "big" in only:
        plan += [("big", "big", {"mb": BIG_MB}), ("rsync", "rsync", {"mb": BIG_MB})]
    got: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in plan}
    t0 = time.monotonic()
    for r in range(rounds):
        for key, name, params in plan:
            try:
                res = run_child(__file__, name, params, home=True, timeout_s=600)
            except (ChildFailed, subprocess.TimeoutExpired) as exc:
                print(f"  round {r + 1} {key}: FAILED {str(exc)[:400]}", file=sys.stderr)
                continue
            got[key].append(res)
            print(f"  round {r + 1} {key}: done", file=sys.stderr, flush=True)
    return got, time.monotonic() - t0


def report(got: dict[str, list[dict[str, Any]]]) -> str:
    from _common import fmt_time, median, table, verdict

    out = []
    rows = []
    many = got.get("many") or []
    if many:
        med = lambda k: median(r[k] for r in many)  # noqa: E731
        worst = lambda k: max(r[k] if r[k] is not None else -1 for r in many)  # noqa: E731
        rows += [
            ["ssh logins per host (connections_opened)", f"{worst('opened')}", "1",
             "PASS" if worst("opened") == 1 else "FAIL"],
            ["ssh logins per host (sshd log)", f"{worst('logins')}", "1",
             "PASS" if worst("logins") == 1 else "FAIL"],
            ["established at the end (ss)", f"{worst('established')}", "1",
             "PASS" if worst("established") == 1 else "FAIL"],
            [f"time to submit, {N_MANY} tasks", fmt_time(med("t_submit")), "", "info"],
            [f"time to all results, {N_MANY} tasks", fmt_time(med("t_all")), "", "info"],
            ["agent polls while waiting", f"{med('polls'):.0f}", "", "info"],
        ]
    big, rs = got.get("big") or [], got.get("rsync") or []
    if big and rs:
        mb = BIG_MB
        rsync_rate = mb / median(r["t"] for r in rs)
        submit_rate = mb / median(r["t_submit"] for r in big)
        t_after = median(r["t_after"] for r in big)
        t_write = median(r["t_submit"] - r["t_after"] for r in big)
        all_rate = mb / median(r["t_all"] for r in big)
        ratio = submit_rate / rsync_rate
        rows += [
            [f"plain rsync -a of the {mb} MB array (with its login)",
             f"{rsync_rate:.0f} MB/s ({fmt_time(median(r['t'] for r in rs))})", "", "baseline"],
            ["  the same over an open ssh connection",
             f"{mb / median(r['t_mux'] for r in rs):.0f} MB/s ({fmt_time(median(r['t_mux'] for r in rs))})",
             "", "info"],
            [f"submit of a {mb} MB array argument",
             f"{submit_rate:.0f} MB/s ({fmt_time(median(r['t_submit'] for r in big))})",
             f">= 0.8 x rsync: {ratio:.2f} x", verdict(ratio, 0.8)],
            ["  of which the client writes the inputs (the copy streams meanwhile)",
             fmt_time(t_write), "", "info"],
            ["  of which the rest of the copy and the start", fmt_time(t_after), "", "info"],
            ["  submit to result (task reads it back)",
             f"{all_rate:.0f} MB/s ({fmt_time(median(r['t_all'] for r in big))})",
             f"{all_rate / rsync_rate:.2f} x rsync", "info"],
            ["  job folder / array bytes",
             f"{median(r['folder_bytes'] for r in big) / median(r['array_bytes'] for r in big):.3f}",
             "", "info"],
        ]
    out.append(table(["measure", "value", "target / ratio", "verdict"], rows))
    for key, what in (("many", f"{N_MANY} tasks"), ("big", f"one {BIG_MB} MB argument")):
        if not got.get(key):
            continue
        rounds = got[key]
        steps: dict[str, list[float]] = {}
        for r in rounds:
            for k, v in r["steps"].items():
                steps.setdefault(k, []).append(v)
        total = median(r["t_submit"] for r in rounds)
        srows = []
        for k in sorted(steps, key=lambda k: -median(steps[k])):
            m = median(steps[k])
            srows.append([k, fmt_time(m), f"{100 * m / total:.0f}%"])
        after = median(steps.get("submit_independent (after the inputs are written)", [0.0]))
        srows.append(["client side before submit_independent (pickle, write, registry)",
                      fmt_time(total - after), f"{100 * (total - after) / total:.0f}%"])
        srows.append(["submit in all", fmt_time(total), "100%"])
        out.append(f"\nWhere submit time goes ({what}, one host; median; one call each; the probe "
                   "and the payload stream run in a thread while the client writes, the other "
                   "steps are parts of submit_independent):\n")
        out.append(table(["step", "time", "share"], srows))
    if many:
        low: dict[str, list[float]] = {}
        for r in many:
            for k, v in r["low"].items():
                low.setdefault(k, []).append(v)
        lrows = [[k, str(many[0]["low_counts"].get(k, "")), fmt_time(median(v)),
                  fmt_time(median(v) / max(1, many[0]["low_counts"].get(k, 1)))]
                 for k, v in sorted(low.items(), key=lambda kv: -median(kv[1]))]
        out.append("\nThe processes behind them (one ssh client or rsync each):\n")
        out.append(table(["process", "count", "time", "each"], lrows))
    return "\n".join(out)


def figures_json(fig, got: dict[str, list[dict[str, Any]]]) -> None:
    """The figures of the groups measured, for ``--json`` (``fig``: a ``report.Figures``)."""
    from _common import median

    many, big, rs = got.get("many") or [], got.get("big") or [], got.get("rsync") or []
    if many:
        fig.add("many", "ssh logins per host and session (every command and copy multiplexed)", "ew.ssh",
                max(r["opened"] or 0 for r in many), "", elsewhere=True)  # fmt: skip
        fig.add("many", f"Time to submit {N_MANY} no-op tasks", "ew.submit", median(r["t_submit"] for r in many),
                "s", elsewhere=True)  # fmt: skip
        fig.add("many", f"Time until all {N_MANY} results are back", "ew.submit().wait(); results()",
                median(r["t_all"] for r in many), "s", elsewhere=True)  # fmt: skip
    if big and rs:
        fig.compare("big", f"A {BIG_MB} MB array argument: submitted (serialised, written, copied, started)",
                    ("ew.submit", BIG_MB / median(r["t_submit"] for r in big)),
                    [("plain rsync -a of the same data, its login included", BIG_MB / median(r["t"] for r in rs)),
                     ("rsync -a over an ssh connection opened beforehand", BIG_MB / median(r["t_mux"] for r in rs))],
                    "MB/s", better="higher")  # fmt: skip


def main(argv: list[str]) -> int:
    import argparse

    if argv[:1] == ["--child"]:
        # run as module ``ssh`` (bench/ is on sys.path): task functions travel by reference
        from _common import child_main

        import ssh as bench

        child_main(bench.CHILDREN, argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated: many,big")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)")
    args = p.parse_args(argv)
    only = {s for s in args.only.split(",") if s} or None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import platform

    import services

    if services.ssh() is None:
        print(f"bench/ssh.py: no test sshd: {services.why_no_ssh()}")
        return 0
    from report import Figures

    record = Figures("ssh", argv)
    print(f"# bench/ssh.py: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {args.rounds} round(s), "
          f"load {os.getloadavg()[0]:.2f} at start", flush=True)
    got, took = collect(args.rounds, only)
    print(f"\nMedian of {args.rounds} round(s), each in a fresh process; {took:.0f} s in all, "
          f"load {os.getloadavg()[0]:.2f} at end:\n")
    print(report(got))
    if args.json:
        figures_json(record, got)
        record.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
