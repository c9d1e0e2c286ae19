"""Memory of a warm worker and of a peer daemon over many jobs, and of the daemon under a flood
of frames it must refuse, beside what a user would pick instead.

    .venv/bin/python bench/memory.py [--jobs 100] [--tasks 1000] [--frames 100000] [--every 10]
                                     [--only local,peer,dask] [--json FILE]

The target (issue 24): the RSS of a warm local worker and of a peer daemon after 100 jobs of
1 000 tasks, and after 100 000 refused frames, within 10% of their first job's figure. Each
contender runs in a fresh interpreter (``_common.run_child``), one after the other; a sample is
taken after the first job, after every ``--every`` jobs and at the end, each once the workers
are idle again (RSS read with psutil, in MiB):

1. ``local``: ``ew.map(noop, range(1000), on=ew.local(cores=2))`` ``--jobs`` times (a fresh
   ``ELSEWHERE_HOME``, so the pool starts empty): the RSS of the workers that ran the first job
   (the pool keeps them warm between jobs), and of every worker of the pool (the pool may start
   more when a job is submitted before the last one's workers are idle again: how many, and
   their RSS, is shown beside); against ``ProcessPoolExecutor(2).map(noop, range(1000))`` the
   same number of times, the RSS of its two worker processes. A local worker reads no frames
   from anyone: the refused frames are the daemon's alone. Run it on a checkout nobody edits
   meanwhile: a warm worker whose modules (elsewhere's included) change on disk starts afresh
   in its process before its next job, and its RSS with it (the script says when it saw that).
2. ``peer``: an ``elsewhere peer worker`` daemon of 2 slots on loopback with a fresh group key
   (started by this script, as tests/peer/peer_procs.py does), and ``ew.map(noop,
   range(1000), on=ew.peers(...))`` ``--jobs`` times from a fresh controller process; then
   ``--frames`` frames it must refuse, each on a connection of its own (as an attacker's
   would arrive): random bytes, damaged, cut and plausible-looking headers, handshakes under
   another key of the same group name, a recorded real session replayed (whole and damaged),
   and one in 25 after a real handshake with the group key, a frame with a bad MAC, a
   replayed sequence number or cut short. The daemon's RSS (and its task children's) after
   the first job, every ``--every`` jobs, every tenth of the frames, and after a last job;
   the frames the daemon counted as refused are shown beside those thrown.
3. ``dask``: beside the daemon, a dask.distributed worker's RSS after the same jobs
   (``LocalCluster(n_workers=2, processes=True, threads_per_worker=1)``,
   ``client.gather(client.map(noop, range(1000), pure=False))``), if ``distributed`` is
   installed.

"growth" is a figure over the first job's figure, less one (the target: <= 10%); "ratio" is
the alternative's RSS over elsewhere's (above 1, elsewhere holds less). This is a benchmark,
not a test: a FAIL is printed, never an exit status. The regression tests of the bounds that
keep these figures flat are in tests/unit/test_memory_bounds.py.
"""

from __future__ import annotations

import os
import struct
import sys
import time

from _tasks import noop

W = 2  # worker processes (and slots) on every side
TARGET = 0.10  # the growth allowed over the first job's figure
MB = 1 << 20


def _rss_mb(pids: list[int]) -> dict[int, float]:
    """The RSS of each of ``pids`` still alive, in MiB."""
    import psutil

    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).memory_info().rss / MB
        except psutil.Error:
            pass
    return out


def _due(job: int, jobs: int, every: int) -> bool:
    return job == 1 or job % every == 0 or job == jobs


# -- local workers ---------------------------------------------------------------------------


def m_local(jobs: int, tasks: int, every: int) -> dict:
    """``ew.map`` on warm local workers ``jobs`` times; samples of the pool's workers' RSS."""
    from _common import stop_workers, worker_pids

    import elsewhere as ew

    home = os.environ["ELSEWHERE_HOME"]
    cl = ew.local(cores=W)
    idle = cl.pool_dir() / "idle"
    xs = list(range(tasks))
    samples = []
    t0 = time.perf_counter()
    try:
        for job in range(1, jobs + 1):
            vals = ew.map(noop, xs, on=cl, progress=False)
            assert vals[-1] == tasks - 1, vals[-1:]
            if _due(job, jobs, every):
                pids = worker_pids(home)
                deadline = time.monotonic() + 5.0  # idle again: out of the job, its files closed
                while len(os.listdir(idle)) < len(pids) and time.monotonic() < deadline:
                    time.sleep(0.01)
                samples.append({"job": job, "rss": _rss_mb(pids), "reexec": _reexecuted(pids)})
        return {"samples": samples, "t": time.perf_counter() - t0}
    finally:
        stop_workers(home, 5.0, cl.shutdown)


def _reexecuted(pids: list[int]) -> list[int]:
    """Those of ``pids`` that started afresh in their process (a warm worker does when a
    module it loaded, elsewhere's included, changed on disk: ``run/worker.py``), as their
    command line shows (``-m elsewhere.worker``, where the pool starts them with ``-c``)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"\0-m\0elsewhere.worker\0" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def m_ppe(jobs: int, tasks: int, every: int) -> dict:
    """``ProcessPoolExecutor(2).map`` ``jobs`` times; samples of its workers' RSS."""
    import concurrent.futures as cf

    xs = list(range(tasks))
    samples = []
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(W) as ppe:
        for job in range(1, jobs + 1):
            vals = list(ppe.map(noop, xs))
            assert vals[-1] == tasks - 1, vals[-1:]
            if _due(job, jobs, every):
                samples.append({"job": job, "rss": _rss_mb(list(ppe._processes))})
    return {"samples": samples, "t": time.perf_counter() - t0}


# -- the peer daemon ---------------------------------------------------------------------------


def m_peer(port: int, key: str, daemon: int, stats: str, jobs: int, tasks: int, every: int,
           frames: int) -> dict:  # fmt: skip
    """``ew.map`` on the loopback daemon ``jobs`` times, then ``frames`` refused frames;
    samples of the daemon's RSS and its task children's."""
    import json

    import psutil

    import elsewhere as ew
    from elsewhere.peer.keys import load_key

    on = ew.peers("bench", key=key, port=port, interface="127.0.0.1")
    proc = psutil.Process(daemon)

    def counters() -> dict:
        with open(stats) as f:
            return json.load(f)

    def sample(**at: int) -> dict:
        time.sleep(0.3)  # the daemon's loop has written its results and freed their buffers
        kids = [c.pid for c in proc.children()]
        return {**at, "rss": proc.memory_info().rss / MB, "children": _rss_mb(kids)}

    def job() -> None:
        vals = ew.map(noop, xs, on=on, progress=False)
        assert vals[-1] == tasks - 1, vals[-1:]

    xs = list(range(tasks))
    samples = []
    t0 = time.perf_counter()
    for n in range(1, jobs + 1):
        job()
        if _due(n, jobs, every):
            samples.append(sample(job=n))
    t_jobs = time.perf_counter() - t0
    flood = []
    before = counters()
    t1 = time.perf_counter()
    if frames:
        grp = load_key(key)
        tcp = int(before["port"])
        bad = BadFrames(tcp, grp)
        step = max(1, frames // 10)
        thrown = 0
        while thrown < frames:
            k = min(step, frames - thrown)
            got = bad.throw(k)
            if not got:
                raise RuntimeError(f"the daemon took none of {k} connections (after {thrown})")
            thrown += got
            flood.append(sample(frames=thrown))
    t_flood = time.perf_counter() - t1
    job()  # and it still serves its group
    deadline = time.monotonic() + 10  # its counters, written once a second, after that job
    want = (jobs + 1) * tasks
    while (after := counters()).get("tasks", 0) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"samples": samples, "flood": flood, "last": sample(job=jobs + 1),
            "refused": after.get("protocol_errors", 0) - before.get("protocol_errors", 0),
            "connections": after.get("connections", 0) - before.get("connections", 0),
            "t": t_jobs, "t_flood": t_flood}  # fmt: skip


def m_dask(jobs: int, tasks: int, every: int) -> dict:
    """dask.distributed's ``client.map`` on 2 worker processes ``jobs`` times; samples of the
    workers' RSS."""
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    xs = list(range(tasks))
    samples = []
    with LocalCluster(n_workers=W, processes=True, threads_per_worker=1, dashboard_address=None) as lc, \
            Client(lc) as client:  # fmt: skip
        pids = list(client.run(os.getpid).values())
        t0 = time.perf_counter()
        for job in range(1, jobs + 1):
            vals = client.gather(client.map(noop, xs, pure=False))
            assert vals[-1] == tasks - 1, vals[-1:]
            if _due(job, jobs, every):
                time.sleep(0.3)
                samples.append({"job": job, "rss": _rss_mb(pids)})
        t = time.perf_counter() - t0
    return {"samples": samples, "t": t}


# -- frames the daemon must refuse -------------------------------------------------------------


class BadFrames:
    """Frames a daemon listening on 127.0.0.1:``port`` must refuse, each thrown on a connection
    of its own (see the module doc); ``key``: the group's key (a real session is recorded
    with it, and one frame in 25 follows a real handshake)."""

    AUTH_EVERY = 25

    def __init__(self, port: int, key) -> None:
        import random

        from elsewhere.peer.announce import new_peer_id
        from elsewhere.peer.messages import Identity
        from elsewhere.peer.wire import Connection, Role

        self.port, self.key = port, key
        self.rng = random.Random(20261205)
        self.hello = (
            Connection(Role.INITIATOR, key, Identity(new_peer_id())).data_to_send()[0].tobytes()
        )
        self.wrong_key = [self._wrong_key_session() for _ in range(8)]
        self.recorded = self._record_session()
        self.n = 0

    def _wrong_key_session(self) -> bytes:
        """HELLO, AUTH and a PING of a handshake under another key of the same group name."""
        from elsewhere.peer.announce import new_peer_id
        from elsewhere.peer.keys import GroupKey, generate_key
        from elsewhere.peer.messages import Identity, Ping
        from elsewhere.peer.wire import Connection, Role

        other = GroupKey(self.key.group, generate_key())
        a = Connection(Role.INITIATOR, other, Identity(new_peer_id(), "mallory", "evil"))
        b = Connection(Role.RESPONDER, other, Identity(new_peer_id()))
        hello = b"".join(f.tobytes() for f in a.data_to_send())
        b.feed(hello)
        a.feed(b"".join(f.tobytes() for f in b.data_to_send()))
        a.send(Ping(1))
        return hello + b"".join(f.tobytes() for f in a.data_to_send())

    def _handshake(self):
        """A socket and connection after a real handshake with the group key."""
        import socket

        from elsewhere.peer.announce import new_peer_id
        from elsewhere.peer.messages import Identity
        from elsewhere.peer.wire import Connection, HandshakeComplete, Role

        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
        conn = Connection(Role.INITIATOR, self.key, Identity(new_peer_id(), "bench", "bench"))
        sent = []
        for f in conn.data_to_send():
            sent.append(f.tobytes())
            sock.sendall(sent[-1])
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the daemon closed the connection during the handshake")
            if any(isinstance(e, HandshakeComplete) for e in conn.feed(data)):
                for f in conn.data_to_send():
                    sent.append(f.tobytes())
                    sock.sendall(sent[-1])
                return sock, conn, sent

    def _record_session(self) -> bytes:
        """What a real controller sent in a session: HELLO, AUTH, PING, ASK."""
        from elsewhere.peer.messages import Ask, Ping

        sock, conn, sent = self._handshake()
        try:
            conn.send(Ping(7))
            conn.send(Ask("recorded", 1, 1.0, 1))
            for f in conn.data_to_send():
                sent.append(f.tobytes())
                sock.sendall(sent[-1])
        finally:
            sock.close()
        return b"".join(sent)

    def _raw(self, count: int):
        rng = self.rng
        for _ in range(count):
            kind = self.n % 7
            self.n += 1
            if kind == 0:
                yield rng.randbytes(rng.randint(1, 200))
            elif kind == 1:
                yield _mutate(rng, self.hello)
            elif kind == 2:
                yield self.hello[: rng.randrange(1, len(self.hello))]  # cut, then the stream ends
            elif kind == 3:
                mtype = rng.choice([1, 2, 3, 10, 13, 14, 31, 99])
                yield b"ELSW\x01" + bytes([mtype]) + rng.randbytes(rng.randint(26, 300))
            elif kind == 4:
                yield rng.choice(self.wrong_key)
            elif kind == 5:
                yield self.recorded  # a real session again: new nonces, its AUTH fails
            else:
                yield _mutate(rng, self.recorded)

    def _after_handshake(self, i: int) -> int:
        """A real handshake, then a frame with a bad MAC, its sequence number again, or cut."""
        import socket

        from elsewhere.peer.messages import Ask, Ping

        try:
            sock, conn, _ = self._handshake()
        except OSError:
            return 0
        try:
            conn.send(Ping(i) if i % 2 else Ask(f"bad{i}", 1, 1.0, 1))
            frame = conn.data_to_send()[0].tobytes()
            kind = i % 3
            if kind == 0:
                data = _mutate(self.rng, frame)
            elif kind == 1:
                data = frame + frame
            else:
                data = frame[: self.rng.randrange(1, len(frame))]
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(10)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # reset by the daemon: refused too
        finally:
            sock.close()
        return 1

    def throw(self, count: int) -> int:
        """Throw ``count`` frames; how many were thrown."""
        authed = count // self.AUTH_EVERY
        done = _throw_all(self.port, self._raw(count - authed))
        for i in range(authed):
            done += self._after_handshake(self.n + i)
        return done


_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: closed with a reset, no TIME_WAIT


def _mutate(rng, data: bytes) -> bytes:
    """``data`` with a few bits flipped, a byte changed, cut short, or a run inverted."""
    b = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0 or len(b) < 2:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        i = rng.randrange(len(b))
        b[i] = (b[i] + rng.randint(1, 255)) % 256
    elif kind == 2:
        del b[rng.randrange(1, len(b)) :]
    else:
        i = rng.randrange(len(b))
        b[i : i + 16] = bytes(x ^ 0xFF for x in b[i : i + 16])
    if bytes(b) == data:
        b[0] ^= 1
    return bytes(b)


def _throw_all(port: int, frames, in_flight: int = 32) -> int:
    """One connection per frame, ``in_flight`` at once: connect, send, end the stream, and wait
    until the daemon closes it (so that it read the bytes). Returns how many were thrown."""
    import selectors
    import socket

    sel = selectors.DefaultSelector()
    open_until: dict[socket.socket, float] = {}
    done = 0
    more = True
    try:
        while more or open_until:
            while more and len(open_until) < in_flight:
                data = next(frames, None)
                if data is None:
                    more = False
                    break
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                sel.register(s, selectors.EVENT_WRITE, data)
                open_until[s] = time.monotonic() + 10
            for key, mask in sel.select(1.0):
                s = key.fileobj
                if mask & selectors.EVENT_WRITE:
                    try:
                        s.sendall(key.data)  # small: it fits the socket's buffer
                        s.shutdown(socket.SHUT_WR)
                        sel.modify(s, selectors.EVENT_READ)
                        continue
                    except OSError:
                        pass
                else:
                    try:
                        if s.recv(65536):
                            continue  # the daemon's CHALLENGE, or an ERROR frame
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                sel.unregister(s)
                s.close()
                del open_until[s]
                done += 1
            now = time.monotonic()
            for s in [s for s, t in open_until.items() if t < now]:  # held open: counted, dropped
                sel.unregister(s)
                s.close()
                del open_until[s]
                done += 1
    finally:
        for s in open_until:
            s.close()
        sel.close()
    return done


CHILDREN = {"local": m_local, "ppe": m_ppe, "peer": m_peer, "dask": m_dask}


# -- the parent: the daemon, the children, the tables -------------------------------------------


def start_daemon(tmp: str) -> tuple:
    """An ``elsewhere peer worker`` of ``W`` slots on loopback with a fresh key: (process,
    discovery port, key path, stats path)."""
    import json
    import socket
    import subprocess

    from _common import venv_python

    from elsewhere.peer.keys import write_key

    key = str(write_key("bench", os.path.join(tmp, "bench.key")))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.bind(("127.0.0.1", 0))
        port = u.getsockname()[1]
    stats = os.path.join(tmp, "daemon.json")
    proc = subprocess.Popen(
        [venv_python(), "-m", "elsewhere.api.peer_cli", "peer", "worker", "--key", key,
         "--port", str(port), "--interface", "127.0.0.1", "--slots", str(W),
         "--log-level", "warning", "--stats-file", stats],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            with open(stats) as f:
                json.load(f)["port"]
            return proc, port, key, stats
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the peer worker did not start") from None
            time.sleep(0.05)


def collect(only: set[str], jobs: int, tasks: int, every: int, frames: int, tmp: str) -> dict:
    from _common import ChildFailed, have, run_child, stop_procs

    script = os.path.abspath(__file__)
    shape = {"jobs": jobs, "tasks": tasks, "every": every}
    got: dict = {}

    def run(name: str, params: dict, **kw) -> None:
        print(f"  {name} ...", end=" ", flush=True)
        t0 = time.monotonic()
        try:
            got[name] = run_child(script, name, params, timeout_s=3600, **kw)
            print(f"{time.monotonic() - t0:.0f} s", flush=True)
        except ChildFailed as exc:
            print(f"failed:\n{exc}", flush=True)

    if "local" in only:
        run("local", shape, home=True)
        run("ppe", shape)
    if "peer" in only:
        proc, port, key, stats = start_daemon(tmp)
        try:
            run("peer", {**shape, "port": port, "key": key, "daemon": proc.pid, "stats": stats,
                         "frames": frames}, home=True)  # fmt: skip
        finally:
            stop_procs([proc])
    if "dask" in only:
        if have("distributed"):
            run("dask", shape)
        else:
            print("  dask: distributed is not installed, left out")
    return got


def _worker_figures(res: dict | None) -> dict | None:
    """From a child's samples: the workers of the first sample, followed by pid. Returns the
    first and last figures (their mean), the largest growth of one of them, and the whole
    pool's (count and RSS) at the end."""
    if not res or not res.get("samples"):
        return None
    s = res["samples"]
    first = {int(p): v for p, v in s[0]["rss"].items()}
    last = {int(p): v for p, v in s[-1]["rss"].items()}
    kept = [p for p in first if p in last]
    if not kept:
        return None
    mean = lambda d: sum(d[p] for p in kept) / len(kept)  # noqa: E731
    restarted = set(s[-1].get("reexec", ())) - set(s[0].get("reexec", ()))
    return {"first": mean(first), "last": mean(last), "jobs": s[-1]["job"],
            "restarted": sum(1 for p in kept if p in restarted),
            "growth": max(last[p] / first[p] - 1 for p in kept), "kept": len(kept),
            "firsts": len(first), "pool_n": len(last), "pool_mb": sum(last.values()),
            "series": [(x["job"], sum(v for p, v in x["rss"].items() if int(p) in kept) / len(kept),
                        len(x["rss"]), sum(x["rss"].values())) for x in s]}  # fmt: skip


def _daemon_figures(res: dict | None) -> dict | None:
    if not res or not res.get("samples"):
        return None
    s = res["samples"]
    first = s[0]["rss"]
    out = {"first": first, "last": s[-1]["rss"], "jobs": s[-1]["job"], "growth": s[-1]["rss"] / first - 1,
           "series": [(x["job"], x["rss"], sorted(x["children"].values())) for x in s]}  # fmt: skip
    if res.get("flood"):
        top = res["flood"][-1]
        out.update(frames=top["frames"], flooded=top["rss"], flood_growth=top["rss"] / first - 1,
                   refused=res["refused"], t_flood=res["t_flood"],
                   flood_series=[(x["frames"], x["rss"]) for x in res["flood"]])  # fmt: skip
    out["end"] = res["last"]["rss"]
    out["end_growth"] = res["last"]["rss"] / first - 1
    return out


def _verdict(growth: float) -> str:
    return "PASS" if growth <= TARGET else "FAIL"


def report(got: dict) -> str:
    from _common import table

    lines = []
    ours, ppe = _worker_figures(got.get("local")), _worker_figures(got.get("ppe"))
    if ours or ppe:
        rows = []
        for label, f in (("ew.local warm worker", ours), ("ProcessPoolExecutor worker", ppe)):
            if f is None:
                continue
            rows.append([label, f"{f['first']:.1f} MB", f"{f['last']:.1f} MB", f"{f['growth']:+.1%}",
                         _verdict(f["growth"]) if f is ours else "", f"{f['pool_n']} / {f['pool_mb']:.0f} MB"])  # fmt: skip
        lines.append("Local workers: RSS after the first job and after the last (mean of the "
                     "workers of the first job), the largest growth of one of them, and the whole "
                     "pool at the end:\n")  # fmt: skip
        lines.append(table(["system", "first job", f"after {(ours or ppe)['jobs']} jobs",
                            "growth", "<= 10%", "workers / RSS at the end"], rows))  # fmt: skip
        if ours and ours["restarted"]:
            lines.append(f"\nNOTE: {ours['restarted']} of the first job's workers started afresh meanwhile (a "
                         "module they loaded changed on disk): their figure is not a warm worker's")  # fmt: skip
        if ours and ppe:
            lines.append(f"\nratio (PPE worker's RSS over ours) after the last job: "
                         f"{ppe['last'] / ours['last']:.2f}x")  # fmt: skip
        for label, f in (("ew.local", ours), ("ProcessPoolExecutor", ppe)):
            if f is not None:
                lines.append(f"{label}, by job: " + ", ".join(
                    f"{j}: {v:.1f} MB ({n} workers, {tot:.0f} MB)" for j, v, n, tot in f["series"]))  # fmt: skip
    d = _daemon_figures(got.get("peer"))
    dk = _worker_figures(got.get("dask"))
    if d or dk:
        lines.append("\nThe peer daemon (its own RSS) and a dask worker, after the first job and "
                     "after the last; the daemon after the refused frames and after one more job:\n")  # fmt: skip
        rows = []
        if d:
            rows.append(["ew peer daemon", f"{d['first']:.1f} MB", f"{d['last']:.1f} MB", f"{d['growth']:+.1%}",
                         _verdict(d["growth"])])  # fmt: skip
            if "frames" in d:
                rows.append(["ew peer daemon, after " + f"{d['frames']:,} refused frames".replace(",", " "), "",
                             f"{d['flooded']:.1f} MB", f"{d['flood_growth']:+.1%}", _verdict(d["flood_growth"])])  # fmt: skip
            rows.append(["ew peer daemon, after one more job", "", f"{d['end']:.1f} MB", f"{d['end_growth']:+.1%}",
                         _verdict(d["end_growth"])])  # fmt: skip
        if dk:
            rows.append(["dask worker (mean of 2)", f"{dk['first']:.1f} MB", f"{dk['last']:.1f} MB",
                         f"{dk['growth']:+.1%}", ""])  # fmt: skip
        lines.append(table(["system", "first job", "after", "growth", "<= 10%"], rows))
        if d and dk:
            lines.append(f"\nratio (dask worker's RSS over the daemon's) after the last job: "
                         f"{dk['last'] / d['last']:.2f}x")  # fmt: skip
        if d:
            lines.append("daemon, by job: " + ", ".join(
                f"{j}: {v:.1f} MB (children {', '.join(f'{c:.0f}' for c in kids)} MB)"
                for j, v, kids in d["series"]))  # fmt: skip
            if "frames" in d:
                lines.append(
                    "daemon, by frames thrown: "
                    + ", ".join(f"{n}: {v:.1f} MB" for n, v in d["flood_series"])
                )
                lines.append(f"frames thrown {d['frames']}, counted refused by the daemon {d['refused']}, "
                             f"in {d['t_flood']:.0f} s ({d['frames'] / d['t_flood']:.0f}/s)")  # fmt: skip
    return "\n".join(lines)


def figures_json(fig, got: dict, tasks: int) -> None:
    """The figures measured, for ``--json`` (``fig``: a ``report.Figures``)."""
    n = f"{tasks:,}".replace(",", " ")
    ours, ppe = _worker_figures(got.get("local")), _worker_figures(got.get("ppe"))
    if ours or ppe:
        jobs = (ours or ppe)["jobs"]
        get = lambda f, k: f[k] if f else None  # noqa: E731
        fig.compare("local", f"RSS of a warm local worker after its first job of {n} no-op tasks",
                    ("ew.local worker", get(ours, "first")), [("ProcessPoolExecutor worker", get(ppe, "first"))],
                    "MB")  # fmt: skip
        fig.compare("local", f"RSS of a warm local worker after {jobs} jobs of {n} no-op tasks",
                    ("ew.local worker", get(ours, "last")), [("ProcessPoolExecutor worker", get(ppe, "last"))],
                    "MB")  # fmt: skip
        for system, f, mine in (
            ("ew.local worker", ours, True),
            ("ProcessPoolExecutor worker", ppe, False),
        ):
            if f:
                fig.add("local", f"Growth of a worker's RSS over its first job's, after {jobs} jobs (target <= 10%)",
                        system, 100 * f["growth"], "%", elsewhere=mine)  # fmt: skip
        fig.compare("local", f"All the pool's worker processes after {jobs} jobs: their RSS together",
                    ("ew.local pool", get(ours, "pool_mb")), [("ProcessPoolExecutor", get(ppe, "pool_mb"))],
                    "MB")  # fmt: skip
        fig.compare("local", f"All the pool's worker processes after {jobs} jobs: how many",
                    ("ew.local pool", get(ours, "pool_n")), [("ProcessPoolExecutor", get(ppe, "pool_n"))],
                    "")  # fmt: skip
    d, dk = _daemon_figures(got.get("peer")), _worker_figures(got.get("dask"))
    if d or dk:
        jobs = (d or dk)["jobs"]
        fig.compare("peer", f"RSS of a peer daemon (a dask worker) after its first job of {n} no-op tasks",
                    ("ew peer daemon", d and d["first"]), [("dask worker", dk and dk["first"])], "MB")  # fmt: skip
        fig.compare("peer", f"RSS of a peer daemon (a dask worker) after {jobs} jobs of {n} no-op tasks",
                    ("ew peer daemon", d and d["last"]), [("dask worker", dk and dk["last"])], "MB")  # fmt: skip
        for system, g, mine in (
            ("ew peer daemon", d and d["growth"], True),
            ("dask worker", dk and dk["growth"], False),
        ):
            if g is not None:
                fig.add("peer", f"Growth of its RSS over its first job's, after {jobs} jobs (target <= 10%)",
                        system, 100 * g, "%", elsewhere=mine)  # fmt: skip
        if d and "frames" in d:
            k = f"{d['frames']:,}".replace(",", " ")
            fig.add("peer", f"RSS of the peer daemon after {jobs} jobs and {k} refused frames", "ew peer daemon",
                    d["flooded"], "MB", elsewhere=True)  # fmt: skip
            fig.add("peer", f"Growth of its RSS over its first job's, after {k} refused frames (target <= 10%)",
                    "ew peer daemon", 100 * d["flood_growth"], "%", elsewhere=True)  # fmt: skip


def main(argv: list[str]) -> int:
    import argparse
    import platform
    import tempfile

    if argv[:1] == ["--child"]:
        from _common import child_main

        child_main(CHILDREN, argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=100, help="jobs on each side (default 100)")
    p.add_argument("--tasks", type=int, default=1000, help="no-op tasks per job (default 1000)")
    p.add_argument("--every", type=int, default=10, help="a sample every N jobs (default 10)")
    p.add_argument(
        "--frames",
        type=int,
        default=100_000,
        help="refused frames thrown at the daemon (default 100 000)",
    )
    p.add_argument("--only", default="", help="comma-separated: local,peer,dask (default all)")
    p.add_argument(
        "--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)"
    )
    args = p.parse_args(argv)
    from report import Figures

    record = Figures("memory", argv)
    only = {s for s in args.only.split(",") if s} or {"local", "peer", "dask"}
    print(f"# bench/memory.py: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f} at start; {args.jobs} jobs of "
          f"{args.tasks} no-op tasks, {args.frames} refused frames", flush=True)  # fmt: skip
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ewmembench-") as tmp:
        got = collect(only, args.jobs, args.tasks, args.every, args.frames, tmp)
    print(f"\n{time.monotonic() - t0:.0f} s in all, load {os.getloadavg()[0]:.2f} at end:\n")
    print(report(got))
    if args.json:
        figures_json(record, got, args.tasks)
        record.write(args.json)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv[1:]))
