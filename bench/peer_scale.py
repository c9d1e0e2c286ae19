"""The peer network at scale: 32 worker daemons on three hosts, 4 controllers at once.

    .venv/bin/python bench/peer_scale.py [--workers 32] [--seconds 60] [--durations 0.1,0.2,0.4,0.8]
                                         [--no-dask] [--src DIR] [--json FILE]         (as root)

The hosts are the network namespaces ``ew-h1..ew-hN`` (10.77.0.1..N) of
``ci/services/netns.sh``, on one bridge that floods multicast; every process that talks
on 10.77.0.0/24 runs inside one of them (``ip netns exec``), and the namespaces are left
as they are. ``--workers`` ``elsewhere peer worker`` daemons of one slot each (a fresh
group key, a discovery port of their own, ``--busy-poll 0``: 32 daemons share 2 cores here,
where each would have a machine of its own) are spread over the hosts, 10-11 a host, and
find each other and the controllers by multicast. Four controllers, separate processes
spread over the hosts too (``ew.peers(interface=...)``, each with a home of its own on
the disk), start at the same moment, each an ``ew.map`` of tasks of its own length
(``--durations``: 100, 200, 400 and 800 ms by default) and as many as would keep a fair
share of the slots busy for ``--seconds``. A task sleeps: it holds its slot as a task on a
machine of its own would, and the two cores are left to the daemons and controllers.
Every process started is stopped by its pid at the end.

Measured:

- every task placed and its result returned: each controller's count of results, each
  the start and end its task reported, at least the task's length apart;
- fair share: each controller's worker-seconds while all four had tasks waiting (from
  the start to the moment the first controller's last task started), as the daemons'
  fair share charged them (every run, from its start on a task process to its last
  result: recorded from outside, by running each daemon through this script with
  ``FairShare.finished`` wrapped) and, for information, by the tasks' own start and
  end. Target: every controller's share within 10% of an equal one. The same by
  10-second window is shown for information;
- placement at the controller: the controller thread's CPU time (``thread_time``, which
  the machine's other work does not inflate as it does wall time) in its placing step,
  ``Batching._place`` (the choice of worker, the batch's size, its bookkeeping), less
  the ASKs' encoding and queueing (``Links._send`` inside it, with what its own clock
  reads add), over the tasks placed; timed from outside by wrapping those two in the
  controller's process (nothing of the library changes). Target: <= 50 us per task. With
  the ASKs, and in wall time, for information;
- the daemons' CPU (each daemon, and the processes that ran its tasks) over the
  contention, and their RSS; each controller's CPU and peak RSS;
- beside it, where ``import distributed`` works: the same four jobs from four clients of
  dask.distributed with one scheduler and 32 one-thread workers on loopback
  (``LocalCluster(n_workers=32, threads_per_worker=1)``, its start not timed), each
  stopped after ``--seconds`` if it has not finished (its throughput counted until then):
  tasks per second, the slots' use, and each client's share.

``--src DIR`` runs the daemons and controllers on another copy of the library (a ``src``
folder, e.g. of ``git archive HEAD src``): the same measurement before and after a change.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

TARGET_SHARE_DEV = 0.10  # every controller's share within 10% of an equal one
TARGET_PLACE_S = 50e-6  # placement per task at the controller
GROUP = "scale"
SUBNET = "10.77.0"


def _ready_set_go() -> tuple[float, float, float]:
    """In a controller child: say READY, read the common start time from stdin and sleep until
    it; (that start time, this process's CPU time then, the wall clock then)."""
    print("READY", flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    return start_at, time.process_time(), time.time()


def work(seconds: float) -> tuple[float, float, int]:
    """A task: hold the slot for ``seconds``; when it ran (wall clock) and in which process."""
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time(), os.getpid()


def _right(result: Any, seconds: float) -> bool:
    """Whether ``result`` is what :func:`work` returns for a task of ``seconds``."""
    return (isinstance(result, tuple) and len(result) == 3 and isinstance(result[2], int)
            and result[1] - result[0] >= seconds * 0.999)  # fmt: skip


# -- in a controller's process (inside its host's namespace) ----------------------------------------


class Clock:
    """Time spent in some calls: wall (``perf_counter``) and CPU of the calling thread
    (``thread_time``, which this machine's other work does not inflate)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.calls = 0

    def timed(self, fn: Any, when: Any = None) -> Any:
        """``fn`` timed into this clock (only while ``when()`` is true, if given)."""
        pc, tt = time.perf_counter, time.thread_time

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if when is not None and not when():
                return fn(*args, **kwargs)
            w0, c0 = pc(), tt()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall += pc() - w0
                self.cpu += tt() - c0
                self.calls += 1

        return wrapper

    def figures(self, name: str) -> dict[str, float]:
        return {f"{name}_wall": self.wall, f"{name}_cpu": self.cpu, f"{name}_calls": self.calls}


def nested_overhead(rounds: int = 5, n: int = 2000) -> float:
    """What a timed call inside a timed call adds to the outer CPU figure beyond what it
    measures itself (its clock reads: a system call each): subtracted once per ASK."""
    import statistics

    def noop() -> None:
        return None

    def many(fn: Any) -> None:
        for _ in range(n):
            fn()

    got = []
    for _ in range(rounds):
        inner, outer, plain = Clock(), Clock(), Clock()
        outer.timed(many)(inner.timed(noop))
        plain.timed(many)(noop)
        got.append((outer.cpu - plain.cpu - inner.cpu) / n)
    return max(0.0, statistics.median(got))


def instrument(counters: collections.Counter[str], ids: list[str]) -> dict[str, Clock]:
    """Time the controller's placing from outside, in this process (the library is not
    changed): ``place``, all of ``Batching._place`` (the choice of worker, the batch's size,
    its bookkeeping, its ASK encoded and queued), and ``send``, the ASKs alone
    (``Links._send`` inside it). ``counters``: tasks placed, placing turns that placed
    nothing, batches withdrawn, and the controller's own counters at its end."""
    from elsewhere.peer import batching, controller, links

    clocks = {name: Clock() for name in ("place", "send")}
    inside = [False]
    place = batching.Batching._place

    def counted_place(self: Any, now: float) -> None:
        before = len(self.pending)
        inside[0] = True
        t0 = time.thread_time_ns()
        try:
            place(self, now)
        finally:
            spent = time.thread_time_ns() - t0
            inside[0] = False
            placed = before - len(self.pending)
            counters["placed"] += max(0, placed)
            if before and placed <= 0:
                counters["futile"] += 1
                counters["futile_ns"] += spent  # (the ASKs' sending in the others' alone)

    close_all, withdraw = controller.Controller._close_all, batching.Batching._withdraw

    def counted_close_all(self: Any) -> None:
        counters.update(self.stats)  # the controller's own counters (ASKs, refusals, ...)
        ids.append(self.peer_id)  # whom the daemons' fair share charges
        close_all(self)

    def counted_withdraw(self: Any, b: Any) -> None:
        counters["withdrawn"] += 1
        withdraw(self, b)

    controller.Controller._close_all = counted_close_all  # type: ignore[method-assign]
    batching.Batching._withdraw = counted_withdraw  # type: ignore[method-assign]
    batching.Batching._place = clocks["place"].timed(counted_place)  # type: ignore[method-assign]
    links.Links._send = clocks["send"].timed(links.Links._send, lambda: inside[0])  # type: ignore[method-assign]
    return clocks


def run_controller(p: dict[str, Any]) -> None:
    import resource

    import elsewhere as ew
    from elsewhere.backends.peer import peers

    counters: collections.Counter[str] = collections.Counter()
    ids: list[str] = []
    clocks = instrument(counters, ids)
    cluster = peers(GROUP, key=p["key"], port=p["port"], interface=p["address"])
    args = [p["duration"]] * p["n"]
    _, cpu0, t0 = _ready_set_go()
    error = ""
    out: list[Any] = []
    try:
        out = ew.map(work, args, on=cluster, timeout=p["timeout"], errors="return")
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    t1 = time.time()
    good = [r for r in out if _right(r, p["duration"])]
    Path(p["intervals"]).write_text(json.dumps([[a, b, w] for a, b, w in good]))
    rusage = resource.getrusage(resource.RUSAGE_SELF)
    res = {"n": p["n"], "returned": len(good), "errors": len(out) - len(good), "error": error,
           "t0": t0, "t1": t1, "cpu_s": time.process_time() - cpu0, "rss_mb": rusage.ru_maxrss / 1024,
           "workers_used": len({w for _, _, w in good}), "counters": dict(counters), "peer_ids": ids}  # fmt: skip
    for name, clock in clocks.items():
        res.update(clock.figures(name))
    res["nested_overhead"] = nested_overhead()
    print("RESULT " + json.dumps(res), flush=True)


def run_daemon(p: dict[str, Any]) -> None:
    """``elsewhere peer worker`` (its arguments ``p["argv"]``), what its fair share charges
    each controller recorded from outside: every run's controller, start and end (wall
    clock), written to ``p["charged"]`` when it ends. Nothing of its behaviour changes."""
    import atexit

    from elsewhere.api.peer_cli import main as peer_main
    from elsewhere.peer.fairshare import FairShare

    charged: list[tuple[str, float, float]] = []
    finished = FairShare.finished

    def recorded(self: Any, run: Any, now: float) -> float:
        entry = self._running.get(run)
        seconds = float(finished(self, run, now))
        if entry is not None:
            end = time.time()
            charged.append((entry[0], end - seconds, end))
        return seconds

    FairShare.finished = recorded  # type: ignore[method-assign]
    atexit.register(lambda: Path(p["charged"]).write_text(json.dumps(charged)))
    sys.exit(peer_main(p["argv"]))


# -- dask.distributed, on loopback (root namespace) ------------------------------------------------


_DASK_PATIENCE = {
    "distributed.comm.timeouts.connect": "120s",
    "distributed.comm.timeouts.tcp": "120s",
}
"""dask's connections may take this long (30 s by default: on this busy machine its scheduler
answers 32 workers and 4 clients slower than that, and the cluster fails to start)."""


def dask_cluster(p: dict[str, Any]) -> None:
    """One scheduler and ``p["workers"]`` one-thread workers on loopback; their address and
    the workers' pids on stdout; stopped when a line comes on stdin. The workers start from
    a fork server (dask's setting ``distributed.worker.multiprocessing-method``) rather than
    as fresh interpreters: 32 of them would take minutes to start on this machine, and the
    start is not what is measured."""
    import dask
    from distributed import Client, LocalCluster

    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver", **_DASK_PATIENCE})
    t0 = time.monotonic()
    cluster = LocalCluster(n_workers=p["workers"], threads_per_worker=1, processes=True,
                           dashboard_address=None, host="127.0.0.1")  # fmt: skip
    client = Client(cluster)
    client.wait_for_workers(p["workers"], timeout=180)
    print(
        f"  dask: {p['workers']} workers up in {time.monotonic() - t0:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    pids = [int(v) for v in client.run(os.getpid).values()]
    print("ADDRESS " + json.dumps({"address": cluster.scheduler_address, "pids": pids}), flush=True)
    sys.stdin.readline()  # until the parent says stop (or closes our stdin)
    client.close()
    cluster.close(timeout=20)


def dask_client(p: dict[str, Any]) -> None:
    import resource

    import dask
    from distributed import Client, wait

    dask.config.set(_DASK_PATIENCE)
    client = Client(p["address"], timeout=120)
    args = [p["duration"]] * p["n"]
    start_at, cpu0, t0 = _ready_set_go()
    error = ""
    out: list[Any] = []
    try:
        futures = client.map(work, args, pure=False)
        with contextlib.suppress(TimeoutError):  # (distributed's is the builtin one)
            wait(futures, timeout=max(1.0, start_at + p["limit"] - time.time()))
        t1 = time.time()  # (what comes after, collecting and cancelling, is not counted)
        done = [f for f in futures if f.status == "finished"]
        out = client.gather(done, errors="skip")
        if len(done) < len(futures):
            error = f"stopped at the time limit ({p['limit']:.0f} s)"
            client.cancel([f for f in futures if f.status != "finished"])
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        t1 = time.time()
    good = [r for r in out if _right(r, p["duration"])]
    Path(p["intervals"]).write_text(json.dumps([[a, b, w] for a, b, w in good]))
    rusage = resource.getrusage(resource.RUSAGE_SELF)
    res = {"n": p["n"], "returned": len(good), "errors": len(out) - len(good), "error": error,
           "t0": t0, "t1": t1, "cpu_s": time.process_time() - cpu0, "rss_mb": rusage.ru_maxrss / 1024,
           "workers_used": len({w for _, _, w in good})}  # fmt: skip
    client.close()
    print("RESULT " + json.dumps(res), flush=True)


CHILDREN = {
    "controller": run_controller,
    "daemon": run_daemon,
    "dask_cluster": dask_cluster,
    "dask_client": dask_client,
}


# -- the parent: hosts, daemons, controllers, figures -------------------------------------------------


def hosts() -> list[tuple[str, str]]:
    """The namespace hosts of ``ci/services/netns.sh`` there now: (name, address)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    found = []
    i = 1
    while f"ew-h{i}" in names:
        found.append((f"ew-h{i}", f"{SUBNET}.{i}"))
        i += 1
    return found


def spread(n: int, k: int) -> list[int]:
    """Which of ``k`` hosts each of ``n`` processes goes to: round robin."""
    return [i % k for i in range(n)]


def child_env() -> dict[str, str]:
    """The environment of the processes we start: ``--src`` (``EWSCALE_SRC``) first on the path."""
    env = dict(os.environ)
    src = env.get("EWSCALE_SRC")
    if src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def child_cmd(name: str, params: dict[str, Any], netns: str | None = None) -> list[str]:
    from _common import venv_python

    cmd = [venv_python(), str(Path(__file__).resolve()), "--child", name, json.dumps(params)]
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


class Proc:
    """A child process we started: stdin to tell it when to start, stdout for its lines."""

    def __init__(self, cmd: list[str], log: Path, home: Path | None = None) -> None:
        self.log = log
        self._err = open(log, "wb")
        env = child_env()
        if home is not None:
            env["ELSEWHERE_HOME"] = str(home)  # a home of its own: its job folder, its registry
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                  text=True, start_new_session=True, cwd=str(BENCH.parent), env=env)  # fmt: skip
        self.pid = self.p.pid

    def expect(self, word: str, timeout: float) -> str:
        """The rest of the first stdout line that starts with ``word`` (fails after ``timeout``)."""
        import selectors

        assert self.p.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(
                        f"no {word} from pid {self.pid} within {timeout:.0f} s: {self.tail()}"
                    )
                line = self.p.stdout.readline()
                if not line:
                    raise RuntimeError(
                        f"pid {self.pid} ended ({self.p.wait()}) before {word}: {self.tail()}"
                    )
                if line.startswith(word):
                    return line[len(word) :].strip()
        finally:
            sel.close()

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def tail(self) -> str:
        self._err.flush()
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; then whatever it started that is still
        there (dask's workers), each by its pid."""
        import psutil

        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.p.wait(10)
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                kid.kill()  # (psutil checks that the pid is still that process)
        for f in (self.p.stdin, self.p.stdout):
            with contextlib.suppress(OSError, AttributeError):
                f.close()  # type: ignore[union-attr]
        self._err.close()


class Daemon:
    """One ``elsewhere peer worker`` inside a host's namespace."""

    def __init__(
        self, i: int, host: tuple[str, str], key: str, port: int, tmp: Path, busy_poll_ms: float
    ) -> None:
        # Its counters and log in memory (tmp is a tmpfs): 32 daemons writing a file a second
        # each on the disk the controllers fsync their results to would measure the disk.
        self.host, self.address = host
        self.stats_path = tmp / f"w{i}.json"
        self.log = open(tmp / f"w{i}.log", "wb")
        self.charged_path = tmp / f"w{i}-charged.json"
        argv = [
            "peer",
            "worker",
            "--key",
            key,
            "--port",
            str(port),
            "--interface",
            self.address,
            "--slots",
            "1",
            "--busy-poll",
            str(busy_poll_ms),
            "--log-level",
            "warning",
            "--stats-file",
            str(self.stats_path),
        ]
        cmd = child_cmd("daemon", {"argv": argv, "charged": str(self.charged_path)}, self.host)
        self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                  start_new_session=True, env=child_env())  # fmt: skip
        self.pid = self.p.pid
        self.known_children: set[int] = set()

    def stats(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.stats_path.read_text()))
        except (OSError, ValueError):
            return {}

    def charged(self) -> list[list[Any]]:
        """The runs its fair share charged: [controller, start, end] (wall clock), once it ended."""
        try:
            return list(json.loads(self.charged_path.read_text()))
        except (OSError, ValueError):
            return []

    def children(self) -> list[int]:
        """Its task processes now (from /proc: the children of its pid)."""
        kids: list[int] = []
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{self.pid}/task"):
                with open(f"/proc/{self.pid}/task/{task}/children") as f:
                    kids += [int(x) for x in f.read().split()]
        self.known_children.update(kids)
        return kids

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (it drains and stops its children), then SIGKILL; then any child of it
        still there, each by its pid."""
        kids = self.children()
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.p.wait(10)
        for pid in {*kids, *self.known_children}:
            if _is_child_of_ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.log.close()


def _is_child_of_ours(pid: int) -> bool:
    """Whether ``pid`` is still a task process of a peer worker (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"elsewhere.peer.child" in f.read()
    except OSError:
        return False


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return 0.0


class Sampler:
    """CPU-seconds and RSS of the daemons and their task processes, at moments we choose."""

    def __init__(self, daemons: list[Daemon]) -> None:
        self.daemons = daemons
        self.peak_daemon_rss = [0.0] * len(daemons)
        self.peak_child_rss = [0.0] * len(daemons)

    def cpu(self) -> tuple[list[float], dict[int, float]]:
        """(each daemon's CPU-seconds, each live task process's), now."""
        from _common import proc_cpu_s

        own = [proc_cpu_s(d.pid) for d in self.daemons]
        kids = {pid: proc_cpu_s(pid) for d in self.daemons for pid in d.children()}
        return own, kids

    def rss(self) -> None:
        for i, d in enumerate(self.daemons):
            self.peak_daemon_rss[i] = max(self.peak_daemon_rss[i], _rss_mb(d.pid))
            kids = d.children()
            self.peak_child_rss[i] = max(self.peak_child_rss[i], sum(_rss_mb(k) for k in kids))


def _wait_all(procs: list[Proc], word: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    return [p.expect(word, max(1.0, deadline - time.monotonic())) for p in procs]


def contend(tmp: Path, kind: str, plan: list[dict[str, Any]], per_proc: list[tuple[str | None, dict[str, Any]]],
            sampler: Sampler | None, timeout: float) -> dict[str, Any]:  # fmt: skip
    """Start the clients (``per_proc``: namespace, extra params), let them go at once, wait
    for their results; with ``sampler``, the daemons' CPU over that time and their RSS."""
    from _common import machine_busy_s

    procs: list[Proc] = []
    homes: list[Path] = []
    try:
        for c, (netns, extra) in enumerate(per_proc):
            params = {**plan[c], **extra, "intervals": str(tmp / f"{kind}-c{c}.json")}
            home = Path(
                tempfile.mkdtemp(prefix=f"ewscale-{kind}{c}-")
            )  # on the disk, as a user's is
            homes.append(home)
            procs.append(Proc(child_cmd(kind, params, netns), tmp / f"{kind}-c{c}.log", home))
        _wait_all(procs, "READY", 120)
        go = time.time() + 1.0
        for p in procs:
            p.send(repr(go))
        time.sleep(max(0.0, go - time.time()))
        busy0 = machine_busy_s()
        cpu0 = sampler.cpu() if sampler else None
        results: list[dict[str, Any] | None] = [None] * len(procs)
        deadline = time.monotonic() + timeout
        last_rss = 0.0
        while any(r is None for r in results):
            for c, p in enumerate(procs):
                if results[c] is None and p.p.poll() is not None:
                    try:
                        results[c] = json.loads(p.expect("RESULT ", 5))
                    except RuntimeError as exc:
                        results[c] = {
                            "error": str(exc),
                            "n": plan[c]["n"],
                            "returned": 0,
                            "t0": go,
                            "t1": time.time(),
                        }
            if sampler and time.monotonic() - last_rss > 2.0:
                sampler.rss()
                last_rss = time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind}: no result within {timeout:.0f} s")
            time.sleep(0.05)
        end = max(r["t1"] for r in results if r)
        wall = end - go
        out: dict[str, Any] = {"go": go, "wall": wall, "clients": results,
                               "busy_share": (machine_busy_s() - busy0) / ((os.cpu_count() or 1) * wall)}  # fmt: skip
        if sampler and cpu0 is not None:
            own1, kids1 = sampler.cpu()
            own0, kids0 = cpu0
            out["daemon_cpu"] = [b - a for a, b in zip(own0, own1)]
            out["child_cpu"] = sum(v - kids0.get(pid, 0.0) for pid, v in kids1.items())
        intervals = []
        for c in range(len(procs)):
            try:
                intervals.append(json.loads((tmp / f"{kind}-c{c}.json").read_text()))
            except (OSError, ValueError):
                intervals.append([])
        out["intervals"] = intervals
        return out
    finally:
        for p in procs:
            p.stop()
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)


# -- figures from the intervals ----------------------------------------------------------------------


def overlap(iv: list[list[float]], a: float, b: float) -> float:
    """Worker-seconds of the intervals ``iv`` inside [a, b]."""
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e, _ in iv)


def shares(
    ivs: list[list[list[Any]]], go: float, until: float, slots: int, window_s: float = 10.0
) -> dict[str, Any]:
    """Each client's worker-seconds (``ivs``: its [start, end, ...] intervals) and share
    between ``go`` and ``until``, the worst deviation from an equal share, the same by
    ``window_s`` windows, and the slots' use."""
    secs = [overlap(iv, go, until) for iv in ivs]
    total = sum(secs) or 1.0
    k = len(ivs)
    share = [s / total for s in secs]
    windows, window_shares = [], []
    a = go
    while a + window_s <= until + 1e-9:
        w = [overlap(iv, a, a + window_s) for iv in ivs]
        t = sum(w) or 1.0
        windows.append(max(abs(x / t * k - 1.0) for x in w))
        window_shares.append([x / t for x in w])
        a += window_s
    return {"worker_s": secs, "share": share, "dev": max(abs(x * k - 1.0) for x in share), "windows": windows,
            "window_shares": window_shares, "used": total / (slots * max(until - go, 1e-9))}  # fmt: skip


def _charged(run: dict[str, Any], clients: list[dict[str, Any]]) -> list[list[list[Any]]] | None:
    """Each controller's runs as the daemons charged them ([start, end, 0]), or None."""
    if not run.get("charged"):
        return None
    index = {pid: c for c, client in enumerate(clients) for pid in client.get("peer_ids", [])}
    charged: list[list[list[Any]]] = [[] for _ in clients]
    for runs in run["charged"]:
        for controller, start, end in runs:
            if controller in index:
                charged[index[controller]].append([start, end, 0])
    return charged


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """The figures of one contention: counts, time, and the shares while all clients had
    tasks waiting (from the start to the moment the first client's last task started) by
    the tasks' own times and, for the peer network, by what the daemons charged."""
    cl = [c or {} for c in run["clients"]]
    n = sum(int(c.get("n", 0)) for c in cl)
    got = sum(int(c.get("returned", 0)) for c in cl)
    go, slots, ivs = run["go"], int(run.get("slots", 32)), run["intervals"]
    charged = _charged(run, cl)
    # (a controller that failed returned no task: its runs as the daemons charged them)
    starts = [iv or ch for iv, ch in zip(ivs, charged or [[] for _ in ivs])]
    until = min(max((s for s, _, _ in iv), default=go) for iv in starts)
    out = {"n": n, "returned": got, "wall": run["wall"], "tput": got / run["wall"], "contention_s": until - go,
           "first_start": [min((s for s, _, _ in iv), default=go) - go for iv in ivs],
           "errors": [c.get("error", "") for c in cl if c.get("error")],
           "used_all": sum(overlap(iv, go, go + run["wall"]) for iv in ivs) / (slots * run["wall"]),
           "tasks": shares(ivs, go, until, slots)}  # fmt: skip
    if charged:
        out["charged"] = shares(charged, go, until, slots)
    out["fair"] = out.get("charged", out["tasks"])  # the view the target is judged on
    return out


# -- main -----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from _common import compile_bytecode, have

    from elsewhere.peer.keys import write_key

    compile_bytecode()
    hs = hosts()
    if len(hs) < 2:
        raise SystemExit(
            "needs the namespace hosts ew-h1..ew-hN of ci/services/netns.sh (run it as root)"
        )
    durations = [float(x) for x in args.durations.split(",")]
    k = len(durations)
    per_slot = args.workers / k
    plan = [{"duration": d, "n": max(1, round(per_slot * args.seconds / d)), "timeout": args.seconds * 2.5}
            for d in durations]  # fmt: skip
    key = str(write_key(GROUP, tmp / "scale.key"))
    port = 20000 + os.getpid() % 20000
    print(f"# {args.workers} daemons on {len(hs)} hosts, {k} controllers: "
          + ", ".join(f"{p['n']} x {p['duration'] * 1e3:g} ms" for p in plan), flush=True)  # fmt: skip
    got: dict[str, Any] = {"plan": plan, "hosts": len(hs)}
    daemons: list[Daemon] = []
    t0 = time.monotonic()
    try:
        where = spread(args.workers, len(hs))
        for i in range(args.workers):
            daemons.append(Daemon(i, hs[where[i]], key, port, tmp, args.busy_poll))
        deadline = time.monotonic() + 120
        while not all(d.stats() for d in daemons):
            dead = [d for d in daemons if d.p.poll() is not None]
            if dead:
                raise RuntimeError(f"a daemon ended: {(tmp / 'w0.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("the daemons did not start within 120 s")
            time.sleep(0.2)
        print(
            f"  {args.workers} daemons up in {time.monotonic() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(2.0)  # their first announcements out, their warm children started
        sampler = Sampler(daemons)
        sampler.rss()
        got["rss_idle"] = [_rss_mb(d.pid) for d in daemons]
        ctl_hosts = spread(k, len(hs))
        per = [
            (hs[ctl_hosts[c]][0], {"key": key, "port": port, "address": hs[ctl_hosts[c]][1]})
            for c in range(k)
        ]
        ew = contend(tmp, "controller", plan, per, sampler, args.seconds * 2.5 + 60)  # type: ignore[arg-type]
        ew["slots"] = args.workers
        sampler.rss()
        ew["rss_daemon"] = sampler.peak_daemon_rss
        ew["rss_children"] = sampler.peak_child_rss
        ew["daemon_stats"] = [d.stats() for d in daemons]
        got["ew"] = ew
        back = sum(int((c or {}).get("returned", 0)) for c in ew["clients"])
        print(f"  elsewhere: {back} of {sum(p['n'] for p in plan)} results in {ew['wall']:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    finally:
        for d in daemons:  # all told first: they drain at once
            if d.p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(d.pid, signal.SIGTERM)
        for d in daemons:
            d.stop()
    if "ew" in got:
        got["ew"]["charged"] = [d.charged() for d in daemons]
    if not args.no_dask and have("distributed"):
        got["dask"] = run_dask(args, tmp, plan)
    return got


def run_dask(
    args: argparse.Namespace, tmp: Path, plan: list[dict[str, Any]]
) -> dict[str, Any] | None:
    print(
        "  dask.distributed: starting a scheduler and 32 workers ...", file=sys.stderr, flush=True
    )
    cluster = Proc(child_cmd("dask_cluster", {"workers": args.workers}), tmp / "dask-cluster.log")
    try:
        info = json.loads(cluster.expect("ADDRESS ", 120))  # (else left out: the run stays short)
        limit = args.seconds  # it may be much slower: its throughput is what is compared
        per: list[tuple[str | None, dict[str, Any]]] = [
            (None, {"address": info["address"], "limit": limit}) for _ in plan
        ]
        out = contend(tmp, "dask_client", plan, per, None, limit + 120)
        out["slots"] = args.workers
        out["worker_rss"] = [_rss_mb(pid) for pid in info["pids"]]
        back = sum(int((c or {}).get("returned", 0)) for c in out["clients"])
        print(f"  dask: {back} of {sum(p['n'] for p in plan)} results in {out['wall']:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        return out
    except RuntimeError as exc:
        print(f"  dask failed: {exc}", file=sys.stderr)
        return None
    finally:
        with contextlib.suppress(OSError, BrokenPipeError):
            cluster.send("stop")
        cluster.stop(60)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def report(got: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    from _common import fmt_time, table

    ew = got["ew"]
    s = summary(ew)
    cl = ew["clients"]

    def per_task(c: dict[str, Any], *parts: str, minus: str = "", kind: str = "cpu") -> float:
        spent = sum(c.get(f"{p}_{kind}", 0.0) for p in parts)
        if minus:  # what the inner clock measured, and what its clock reads added outside it
            spent -= c.get(f"{minus}_{kind}", 0.0) + c.get(f"{minus}_calls", 0) * c.get(
                "nested_overhead", 0.0
            )
        return spent / max(1, c.get("counters", {}).get("placed", 0))

    def whole(*parts: str, minus: str = "", kind: str = "cpu") -> float:
        tasks = sum(c.get("counters", {}).get("placed", 0) for c in cl)
        return sum(per_task(c, *parts, minus=minus, kind=kind) * c.get("counters", {}).get("placed", 0)
                   for c in cl) / max(1, tasks)  # fmt: skip

    decision = whole("place", minus="send")
    worst_decision = max(per_task(c, "place", minus="send") for c in cl)
    dcpu = ew.get("daemon_cpu", [])
    contention = ew["wall"]
    f = {"summary": s, "decision": decision, "worst_decision": worst_decision,
         "daemon_cpu_pct": 100 * sum(dcpu) / max(1, len(dcpu)) / contention if dcpu else float("nan"),
         "daemons_cpu_cores": sum(dcpu) / contention if dcpu else float("nan"),
         "children_cpu_cores": ew.get("child_cpu", 0.0) / contention,
         "rss_daemon_mean": sum(ew["rss_daemon"]) / len(ew["rss_daemon"]),
         "rss_daemon_max": max(ew["rss_daemon"]), "rss_idle_mean": sum(got["rss_idle"]) / len(got["rss_idle"]),
         "rss_children_mean": sum(ew["rss_children"]) / len(ew["rss_children"])}  # fmt: skip
    every = s["returned"] == s["n"] and not s["errors"]
    fair, tasks = s["fair"], s["tasks"]
    lens = ", ".join(f"{p['duration'] * 1e3:g}" for p in got["plan"])
    rows = [
        ["tasks placed and returned", f"{s['returned']} of {s['n']}", "all", "PASS" if every else "FAIL"],
        [f"fair share over the contention ({s['contention_s']:.0f} s): worst deviation from equal",
         _pct(fair["dev"]), "<= 10%", "PASS" if fair["dev"] <= TARGET_SHARE_DEV else "FAIL"],
        [f"  each controller's share of the worker-seconds ({lens} ms tasks)",
         ", ".join(_pct(x) for x in fair["share"]), "25% each", "info"],
        ["  worst deviation by 10 s window", ", ".join(f"{x * 100:.0f}" for x in fair["windows"]) + " %", "",
         "info"],
        ["  by the tasks' own time (without each run's start and end)", ", ".join(_pct(x) for x in tasks["share"]),
         "", "info"],
        ["placement per task at the controller, CPU (all 4)", fmt_time(decision), "<= 50 us",
         "PASS" if decision <= TARGET_PLACE_S else "FAIL"],
        ["  the slowest controller's", fmt_time(worst_decision), "<= 50 us",
         "PASS" if worst_decision <= TARGET_PLACE_S else "FAIL"],
        ["  with the ASK encoded and queued", fmt_time(whole("place")), "", "info"],
        ["  the same in wall time (this machine's load in it)", fmt_time(whole("place", kind="wall")), "", "info"],
        ["  placing turns that placed nothing",
         f"{sum(c.get('counters', {}).get('futile', 0) for c in cl)} of {sum(c.get('place_calls', 0) for c in cl)}",
         "", "info"],
        ["slots in use over the contention (charged, tasks)", f"{_pct(fair['used'])}, {_pct(tasks['used'])}", "",
         "info"],
        ["time to the last result", fmt_time(s["wall"]), "", "info"],
        ["tasks per second", f"{s['tput']:.0f}/s", "", "info"],
        ["a daemon's CPU (mean, % of one core)", f"{f['daemon_cpu_pct']:.1f}%", "", "info"],
        ["all daemons / their task processes (cores)", f"{f['daemons_cpu_cores']:.2f} / {f['children_cpu_cores']:.2f}",
         "", "info"],
        ["a daemon's RSS (idle, mean and max in the run)",
         f"{f['rss_idle_mean']:.0f}, {f['rss_daemon_mean']:.0f}, {f['rss_daemon_max']:.0f} MB", "", "info"],
        ["its task processes' RSS (mean)", f"{f['rss_children_mean']:.0f} MB", "", "info"],
        ["a controller's CPU, RSS (mean)", f"{sum(c.get('cpu_s', 0) for c in cl) / len(cl) / s['wall'] * 100:.0f}% "
         f"of a core, {sum(c.get('rss_mb', 0) for c in cl) / len(cl):.0f} MB", "", "info"],
        ["the machine's cores busy (all its work, ours and others')", _pct(ew["busy_share"]), "", "info"],
    ]  # fmt: skip
    text = table(
        ["elsewhere, 32 peer daemons, 4 controllers", "measured", "target", "verdict"], rows
    )
    if s["errors"]:
        text += "\n\nControllers that failed:\n" + "\n".join(f"- {e[:500]}" for e in s["errors"])
    dask = got.get("dask")
    if dask:
        d = summary(dask)
        f["dask"] = d
        stopped = d["returned"] < d["n"]
        rows = [
            ["tasks returned", f"{s['returned']} of {s['n']}",
             f"{d['returned']} of {d['n']}" + (" (stopped at the time limit)" if stopped else ""), ""],
            ["time to the last result", fmt_time(s["wall"]), fmt_time(d["wall"]),
             "" if stopped else f"{d['wall'] / s['wall']:.2f}x"],
            ["tasks per second", f"{s['tput']:.0f}/s", f"{d['tput']:.1f}/s",
             f"{s['tput'] / d['tput']:.1f}x" if d["tput"] else "n/a"],
            ["slots in use by tasks, start to last result", _pct(s["used_all"]), _pct(d["used_all"]), ""],
            ["shares of the tasks' time while all had tasks waiting", ", ".join(_pct(x) for x in tasks["share"]),
             ", ".join(_pct(x) for x in d["tasks"]["share"]) if d["contention_s"] > 0 else "n/a (a client got none)",
             ""],
            ["worst deviation from equal", _pct(tasks["dev"]),
             _pct(d["tasks"]["dev"]) if d["contention_s"] > 0 else "n/a", ""],
            ["the machine's cores busy (all its work)", _pct(ew["busy_share"]), _pct(dask["busy_share"]), ""],
        ]  # fmt: skip
        if dask.get("worker_rss"):
            rows.append(["a worker's RSS (mean, at the end)",
                         f"{f['rss_daemon_mean']:.0f} MB + {f['rss_children_mean']:.0f} MB of task processes",
                         f"{sum(dask['worker_rss']) / len(dask['worker_rss']):.0f} MB", ""])  # fmt: skip
        text += "\n\nThe same four jobs on dask.distributed (one scheduler, 32 one-thread workers, loopback):\n\n"
        text += table(["", "elsewhere", "dask", "ratio"], rows)
    return text, f


def figures_json(record: Any, got: dict[str, Any], f: dict[str, Any]) -> None:
    s = f["summary"]
    g = "scale"
    lens = ", ".join(f"{p['duration'] * 1e3:g}" for p in got["plan"])
    what = f"32 peer daemons on 3 hosts, 4 controllers at once ({lens} ms tasks)"
    record.add(g, f"{what}: tasks placed and returned, of {s['n']}", "ew.map x 4", s["returned"], "",
               elsewhere=True, better="higher")  # fmt: skip
    record.add(g, f"{what}: worst deviation of a controller's share from equal (target <= 10%)", "ew.map x 4",
               100 * s["fair"]["dev"], "%", elsewhere=True)  # fmt: skip
    record.add(g, f"{what}: placement per task at the controller, CPU (target <= 50 us)", "ew.map x 4",
               f["decision"], "s", elsewhere=True)  # fmt: skip
    record.add(g, f"{what}: placement per task at the slowest of the 4 controllers, CPU (target <= 50 us)",
               "ew.map x 4", f["worst_decision"], "s", elsewhere=True)  # fmt: skip
    record.add(g, f"{what}: a daemon's CPU, % of one core", "elsewhere peer worker", f["daemon_cpu_pct"], "%",
               elsewhere=True)  # fmt: skip
    record.add(
        g,
        f"{what}: a daemon's RSS",
        "elsewhere peer worker",
        f["rss_daemon_mean"],
        "MB",
        elsewhere=True,
    )
    d = f.get("dask")
    record.compare(g, f"{what}: tasks per second, start to last result", ("ew.map x 4", s["tput"]),
                   [("dask client.map x 4", d["tput"] if d else None)], "tasks/s", better="higher")  # fmt: skip
    if d and d["contention_s"] > 0:
        record.add(g, f"{what}: worst deviation of a controller's share from equal (target <= 10%)",
                   "dask client.map x 4", 100 * d["tasks"]["dev"], "%")  # fmt: skip


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        CHILDREN[argv[1]](json.loads(argv[2]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--workers", type=int, default=32, help="peer worker daemons, one slot each (default 32)"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="the contention to aim for: each controller gets tasks for this long at a fair share",
    )
    p.add_argument(
        "--durations",
        default="0.1,0.2,0.4,0.8",
        help="the task length of each controller, in seconds (one controller each; default 4)",
    )
    p.add_argument(
        "--busy-poll",
        type=float,
        default=0.0,
        metavar="MS",
        help="the daemons' --busy-poll (default 0)",
    )
    p.add_argument("--no-dask", action="store_true", help="leave out dask.distributed")
    p.add_argument(
        "--src",
        metavar="DIR",
        help="run the daemons and controllers on the library in DIR (another "
        "version's src folder, e.g. from git archive: a before-and-after comparison)",
    )
    p.add_argument(
        "--verbose", action="store_true", help="print the controllers' and daemons' counters"
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the logs of the daemons and controllers"
    )
    p.add_argument(
        "--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)"
    )
    p.add_argument("--raw", metavar="FILE", help="also keep everything measured in FILE (JSON)")
    p.add_argument(
        "--again", metavar="FILE", help="measure nothing: the tables of a --raw FILE again"
    )
    args = p.parse_args(argv)
    if args.again and args.json:
        p.error("--again prints the tables only: its figures were measured at another time")
    if args.src:
        os.environ["EWSCALE_SRC"] = str(Path(args.src).resolve())
    if os.geteuid() != 0:
        print(
            "bench/peer_scale.py runs daemons inside network namespaces: run it as root",
            file=sys.stderr,
        )
        return 2
    from report import Figures

    shown, skip = [], False  # the command line without paths of this machine
    for a in argv:
        if skip:
            skip = False
        elif a in ("--raw", "--again", "--src"):
            skip = True
        elif not a.startswith(("--raw=", "--again=", "--src=")):
            shown.append(a)
    record = Figures("peer_scale", shown)
    import platform

    print(f"# bench/peer_scale.py: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f} at start", flush=True)  # fmt: skip
    # stopped (timeout, kill): the daemons, controllers and dask's processes are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    tmp = tempfile.mkdtemp(prefix="ewscale-", dir=shm)
    try:
        got = json.loads(Path(args.again).read_text()) if args.again else run(args, Path(tmp))
        if args.raw:
            Path(args.raw).write_text(json.dumps(got))
    finally:
        if args.keep:
            print(f"the daemons' and controllers' logs are in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    text, f = report(got)
    if args.verbose:
        for c in got["ew"]["clients"]:
            print(
                "controller:",
                json.dumps({k: v for k, v in c.items() if k != "counters"}),
                file=sys.stderr,
            )
            print("  counters:", json.dumps(c.get("counters", {})), file=sys.stderr)
            placed, calls = c.get("counters", {}).get("placed", 0), c.get("place_calls", 0)
            cpu = (
                c.get("place_cpu", 0)
                - c.get("send_cpu", 0)
                - c.get("send_calls", 0) * c.get("nested_overhead", 0)
            )
            print(f"  placed {placed} tasks in {c.get('send_calls', 0)} ASKs, {calls} calls "
                  f"({c.get('counters', {}).get('futile', 0)} futile): {cpu / max(1, placed) * 1e6:.0f} us a task, "
                  f"{cpu / max(1, calls) * 1e6:.0f} us a call; nested overhead "
                  f"{c.get('nested_overhead', 0) * 1e6:.1f} us", file=sys.stderr)  # fmt: skip
            futile, futile_s = c.get("counters", {}).get("futile", 0), c.get("counters", {}).get("futile_ns", 0) / 1e9
            print(f"  turns that placed nothing: {futile_s / max(1, futile) * 1e6:.1f} us each; the others "
                  f"{(cpu - futile_s) / max(1, calls - futile) * 1e6:.0f} us each", file=sys.stderr)  # fmt: skip
        total: collections.Counter[str] = collections.Counter()
        for d in got["ew"]["daemon_stats"]:
            total.update(
                {k: v for k, v in d.items() if isinstance(v, int) and k not in ("pid", "port")}
            )
        print("daemons:", json.dumps(dict(total)), file=sys.stderr)
        sm = summary(got["ew"])
        print(
            "first task started after (s):",
            [round(x, 2) for x in sm["first_start"]],
            file=sys.stderr,
        )
        for i, ws in enumerate(sm["fair"]["window_shares"]):
            print(f"window {i}: " + ", ".join(_pct(x) for x in ws), file=sys.stderr)
    print(f"\n{time.monotonic() - t0:.0f} s in all, load {os.getloadavg()[0]:.2f} at end:\n")
    print(text)
    if args.json:
        figures_json(record, got, f)
        record.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
