"""The peer network at scale, simulated: what announcements cost a host in groups of 10 to 10 000.

    .venv/bin/python bench/peer_sim.py [--sizes 10,100,1000,10000] [--seconds 60] [--rounds 3]
                                       [--max-datagrams 200000] [--json FILE]

The real announcement code without sockets, on a simulated clock. Every simulated peer has a
real :class:`~elsewhere.peer.discovery.Announcer` (never started): its ``AnnounceTimer`` says
when, ``Announcer.datagram()`` stamps, encodes and signs. An in-memory "multicast" hands every
datagram to two receiving hosts, each a real, unstarted ``Listener`` fed through
``Listener.receive()`` (HMAC check, decode, ``PeerTable.update``) and ``Listener.tick()``
every 50 ms (held wake-ups, and expiry every 0.2 s), as its thread would:

- a *worker daemon*'s listener, which lists the controllers and counts the other peers (its
  announcer is paced by that count);
- a *controller*'s listener, which lists every peer.

The group: up to 4 controllers, the rest workers, all starting within the first 10 s; each
worker changes state (idle, busy) about every 10 s, which its announcer announces as soon as the
pace allows. After a warm-up (three of the longest intervals, at least 30 s; 5 s unpaced), one
window of ``--seconds`` is measured, per host:

- bytes a second sent and received (datagrams with their IPv4 and UDP headers: every host of a
  multicast group receives every datagram; Ethernet framing not counted);
- announcements a second verified (HMAC-SHA256) and decoded;
- the peer table's memory (a ``sys.getsizeof`` walk of the table and the replay memory);
- CPU seconds per simulated minute: the listener's work, the host's own announcing, and its
  waiters' wake-ups (a waiter re-reads the table: the worker daemon's watch for new
  controllers, the controller's watch for changed workers, modelled as one read of the table
  per wake-up, at most a core).

Each size runs twice: *paced* (announcers paced by the group's size, this version) and
*every second* (the same code, not paced: every peer announces every second and at once on a
change, as version 1 did). The unpaced runs of large groups are measured over a shorter window
(``--max-datagrams``), scaled to a minute. Within one window the senders share the worker
daemon's count of the group (every host hears the same datagrams), so a newcomer here knows the
group's size at once, where a real one needs a few intervals to hear it.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import math
import os
import random
import statistics
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

try:
    import elsewhere  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from elsewhere.peer.announce import Announcement, PeerState
from elsewhere.peer.discovery import Announcer, DiscoveryConfig, Listener
from elsewhere.peer.keys import GroupKey

EPOCH = 1_800_000_000.0  # the wall clock at simulated time 0
HEADERS = 28  # IPv4 (20) + UDP (8)
GROUP = "lab"
CHANGE_EVERY_S = 10.0  # a worker's state changes about this often
START_WITHIN_S = 10.0
TICK_S = 0.05  # a listener thread's look between datagrams (its shortest select timeout)


class CountingCondition(threading.Condition):
    """A listener's condition that counts its wake-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0

    def notify_all(self) -> None:
        self.wakes += 1
        super().notify_all()


def deep_size(*roots: object) -> int:
    """Bytes of the objects reachable from ``roots`` (each counted once; classes, modules and
    functions left out)."""
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, skip):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        stack.extend(gc.get_referents(o))
    return total


def _announcement(i: int, controller: bool, rng: random.Random) -> Announcement:
    return Announcement(
        f"{rng.getrandbits(128):032x}", GROUP, f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
        40000 + i % 1000, f"user{i % 40:02d}", f"ws{i:05d}.lab.example.org",
        PeerState.CONTROLLER if controller else PeerState.IDLE, 0 if controller else 8,
        0 if controller else 8, 0 if controller else 16 << 30, 0.0 if controller else math.inf,
        encrypt=True, ciphers=("AES-256-GCM", "ChaCha20-Poly1305"),
    )  # fmt: skip


def _controllers(listener: Listener) -> Any:
    """What the worker daemon's watcher computes at each wake-up (offer.py)."""
    return {p.peer_id for p in listener.peers() if p.announcement.state is PeerState.CONTROLLER}


def _workers(listener: Listener) -> Any:
    """What the controller's watcher computes at each wake-up (controller.py)."""
    return tuple((p.peer_id, p.announcement.state, p.announcement.slots_free) for p in listener.peers()
                 if p.announcement.state is not PeerState.CONTROLLER)  # fmt: skip


def simulate(n: int, paced: bool, seconds: float, seed: int = 1) -> dict[str, Any]:
    """One group of ``n`` peers; the figures of one host (see the module doc)."""
    rng = random.Random(seed)
    key = GroupKey(GROUP, rng.randbytes(32))
    cfg = DiscoveryConfig(interface="127.0.0.1")
    n_ctl = max(1, min(4, n // 10))
    hosts = {
        "worker": Listener(key, cfg, only_states=(PeerState.CONTROLLER,)),
        "controller": Listener(key, cfg),
    }
    watchers = {"worker": _controllers, "controller": _workers}
    for listener in hosts.values():
        listener._cond = CountingCondition()  # (the same lock; counts notify_all)
    pace = hosts["worker"].pace_for(GROUP)
    # (a controller's announcer is not paced: there are few of them)
    peers = [Announcer(_announcement(i, i < n_ctl, rng), key, cfg, rng=random.Random(rng.random()),
                       group_size=pace if paced and i >= n_ctl else None) for i in range(n)]  # fmt: skip
    sources = [(p.announcement.address, cfg.port) for p in peers]
    # warm-up: every peer started and announcing at its pace (three of the longest intervals)
    longest = cfg.interval_s * (max(1.0, n / cfg.group_rate) if paced else 1.0)
    t_warm = START_WITHIN_S + max(5.0 if not paced else 30.0, 3 * longest)
    t_end = t_warm + seconds
    events: list[tuple[float, int, int]] = []  # (time, peer, kind)
    look, change = 0, 1
    for i in range(n):
        events.append((rng.uniform(0, START_WITHIN_S), i, look))
        if i >= n_ctl:
            events.append((rng.expovariate(1 / CHANGE_EVERY_S), i, change))
    next_look = [e[0] for e in events if e[2] == look]  # (in the order of the peers)
    heapq.heapify(events)
    cpu = dict.fromkeys(hosts, 0.0)
    send_cpu = 0.0
    sent = sent_bytes = changes = 0
    per_second: dict[int, int] = {}
    wakes0 = dict.fromkeys(hosts, 0)
    dropped0 = dict.fromkeys(hosts, 0)
    tick = 0.0
    clock = time.process_time
    measuring = False
    while events and events[0][0] < t_end:
        t, i, kind = heapq.heappop(events)
        while tick <= t:  # every listener's thread: held wake-ups, expiry
            for name, listener in hosts.items():
                c0 = clock()
                listener.tick(tick)
                if measuring:
                    cpu[name] += clock() - c0
            tick += TICK_S
        if not measuring and t >= t_warm:
            measuring = True
            wakes0 = {k: h._cond.wakes for k, h in hosts.items()}  # type: ignore[attr-defined]
            dropped0 = {k: len(h.peers()) for k, h in hosts.items()}
        peer = peers[i]
        if kind == change:
            busy = peer.announcement.state is PeerState.IDLE
            peer.update_state(
                state=PeerState.BUSY if busy else PeerState.IDLE, slots_free=0 if busy else 8
            )
            changes += measuring
            heapq.heappush(events, (t + rng.expovariate(1 / CHANGE_EVERY_S), i, change))
            # (update_state wakes the announcer thread: it looks at its timer now)
            if next_look[i] > t:
                next_look[i] = t
                heapq.heappush(events, (t, i, look))
            continue
        if t != next_look[i]:  # superseded by an earlier look
            continue
        c0 = clock()
        size = peer.group_size()
        due = peer.due(t, size)
        data = None
        if due <= t:
            data = peer.datagram(t, EPOCH + t, size)
            due = peer.due(t, size)
        wait = min(due - t, cfg.interval_s)  # the thread looks again at least every interval_s
        if measuring:
            send_cpu += clock() - c0
        next_look[i] = t + wait
        heapq.heappush(events, (t + wait, i, look))
        if data is None:
            continue
        if measuring:
            sent += 1
            sent_bytes += len(data) + HEADERS
            per_second[int(t)] = per_second.get(int(t), 0) + 1
        for name, listener in hosts.items():
            c0 = clock()
            listener.receive(data, sources[i], EPOCH + t, t)
            if measuring:
                cpu[name] += clock() - c0
    out: dict[str, Any] = {
        "n": n, "paced": paced, "seconds": seconds,
        "group_datagrams_per_s": sent / seconds,
        "group_peak_per_s": max(per_second.values(), default=0),
        "sent_Bps": sent_bytes / n / seconds,
        "received_Bps": sent_bytes * (n - 1) / n / seconds,
        "send_cpu_s_per_min": send_cpu / n / seconds * 60,
        "changes_per_s": changes / seconds,
        "interval_s": peers[-1].timer.interval(peers[-1].group_size()),
    }  # fmt: skip
    for name, listener in hosts.items():
        runs = []
        for _ in range(5):
            c0 = clock()
            watchers[name](listener)
            runs.append(clock() - c0)
        wakes = listener._cond.wakes - wakes0[name]  # type: ignore[attr-defined]
        listed = len(listener.peers())
        watcher = min(1.0, wakes / seconds * statistics.median(runs)) * 60
        out[name] = {
            "listed": listed, "heard": listener.group_size(GROUP), "lost": dropped0[name] - listed,
            "verified_per_s": sent * (n - 1) / n / seconds,
            "listener_cpu_s_per_min": cpu[name] / seconds * 60,
            "wakes_per_s": wakes / seconds, "watcher_cpu_s_per_min": watcher,
            "cpu_s_per_min": cpu[name] / seconds * 60 + out["send_cpu_s_per_min"] + watcher,
            "memory_B": deep_size(listener._table, listener._decoders),
        }  # fmt: skip
    return out


def _row(r: dict[str, Any]) -> list[str]:
    w, c = r["worker"], r["controller"]
    return [f"{r['n']:,}".replace(",", " "), f"{r['interval_s']:.1f} s", f"{r['group_datagrams_per_s']:.0f}",
            f"{r['group_peak_per_s']:.0f}", f"{r['sent_Bps']:.0f}", f"{r['received_Bps'] / 1e3:.1f}",
            f"{w['verified_per_s']:.0f}", f"{w['memory_B'] / 1e3:.0f}", f"{c['memory_B'] / 1e3:.0f}",
            f"{w['cpu_s_per_min']:.2f}", f"{c['listener_cpu_s_per_min'] + r['send_cpu_s_per_min']:.2f}",
            f"{c['cpu_s_per_min']:.2f}", f"{w['wakes_per_s']:.1f} / {c['wakes_per_s']:.1f}",
            f"{c['listed']:.0f}/{r['n']}"]  # fmt: skip


HEADER = ["peers", "interval", "group/s", "peak/s", "sent B/s", "recv kB/s", "verified/s",
          "worker table kB", "controller table kB", "worker CPU s/min", "controller CPU s/min",
          "+ its watcher", "wake-ups/s (w / c)", "listed"]  # fmt: skip


def _figures(record: Any, results: list[dict[str, Any]]) -> None:
    def sig(x: float) -> float:
        return float(f"{x:.3g}")

    both = {(r["n"], r["paced"]): r for r in results}
    measures = [
        ("recv", "kB/s a host receives", lambda r: r["received_Bps"] / 1e3, "kB/s"),
        ("sent", "B/s a host sends", lambda r: r["sent_Bps"], "B/s"),
        ("verified", "announcements a host verifies", lambda r: r["worker"]["verified_per_s"], "datagrams/s"),
        ("mem-worker", "peer-table memory, worker daemon", lambda r: r["worker"]["memory_B"] / 1e3, "kB"),
        ("mem-controller", "peer-table memory, controller", lambda r: r["controller"]["memory_B"] / 1e3, "kB"),
        ("cpu-worker", "CPU s per minute, worker daemon (its watcher included)",
         lambda r: r["worker"]["cpu_s_per_min"], "s/min"),
        ("cpu-controller", "CPU s per minute, controller's discovery (its watcher left out)",
         lambda r: r["controller"]["listener_cpu_s_per_min"] + r["send_cpu_s_per_min"], "s/min"),
    ]  # fmt: skip
    for group, what, get, unit in measures:
        for n in sorted({r["n"] for r in results}):
            ours, theirs = both.get((n, True)), both.get((n, False))
            if ours is None:
                continue
            name = f"{what}, group of " + f"{n:,}".replace(",", " ")
            alts = (
                [("every second, at once on a change (version 1's pace)", sig(get(theirs)))]
                if theirs
                else []
            )
            record.compare(group, name, ("paced by the group's size", sig(get(ours))), alts, unit)


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' figures, each the median of its values (nested dicts alike)."""
    out: dict[str, Any] = {}
    for k, v in runs[0].items():
        if isinstance(v, dict):
            out[k] = median_of([r[k] for r in runs])
        elif (
            isinstance(v, (int, float)) and not isinstance(v, bool) and any(r[k] != v for r in runs)
        ):
            out[k] = statistics.median(r[k] for r in runs)
        else:
            out[k] = v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000,10000", help="group sizes (comma-separated)")
    ap.add_argument("--seconds", type=float, default=60.0, help="the measured window (simulated)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of each group under 10 000 peers (medians shown); larger ones run once")  # fmt: skip
    ap.add_argument("--max-datagrams", type=int, default=200_000,
                    help="shorten an unpaced run's window to about this many datagrams")  # fmt: skip
    ap.add_argument("--paced-only", action="store_true", help="skip the unpaced runs")
    ap.add_argument(
        "--json", metavar="FILE", help="also write the figures to FILE (for bench/report.py)"
    )
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import table
    from report import Figures

    record = Figures("peer_sim", sys.argv[1:])
    sizes = [int(x) for x in args.sizes.split(",")]
    load = os.getloadavg()[0]
    print(f"peer network simulated, {args.seconds:g} s measured after a warm-up, load {load:.2f}")
    modes = (False, True) if not args.paced_only else (True,)
    results = []
    for n in sizes:  # both paces of a size one after the other: under the same load
        for _ in range(args.rounds if n < 10_000 else 1):
            for paced in modes:
                seconds = (
                    args.seconds if paced else min(args.seconds, args.max_datagrams / (1.1 * n))
                )
                results.append(simulate(n, paced, seconds, seed=len(results) // len(modes) + 1))
                print(f"  {'paced' if paced else 'every second'}, {n} peers: {seconds:.0f} s measured",
                      file=sys.stderr)  # fmt: skip
    merged = [median_of([r for r in results if r["n"] == n and r["paced"] == paced])
              for paced in modes for n in sizes]  # fmt: skip
    for paced in modes:
        title = ("paced by the group's size (this version)" if paced
                 else "every second, at once on a change (version 1's pace)")  # fmt: skip
        rows = [_row(r) for r in merged if r["paced"] == paced]
        print(f"\n{title}:\n{table(HEADER, rows)}")
    if args.json:
        _figures(record, merged)
        record.write(args.json)


if __name__ == "__main__":
    main()
