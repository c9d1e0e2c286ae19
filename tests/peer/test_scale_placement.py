"""Placing among many workers and several controllers: which worker a controller asks, when
it moves a waiting batch, and what the daemon reads to check a task's memory.

Pure or in-process (no sockets): the controller's placing and timers run on a stand-in
that holds their state, with workers made from announcements. What
``bench/peer_scale.py`` measures on 32 real daemons and 4 controllers.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import threading
import types
from typing import Any

import pytest

from elsewhere.folder.taskmap import TaskSet
from elsewhere.peer.announce import Announcement, PeerState
from elsewhere.peer.batching import RECORD_BACKLOG_BYTES, Batching
from elsewhere.peer.links import Links
from elsewhere.peer.peertable import PeerInfo
from elsewhere.peer.placement import Batch, Candidates, ControllerSettings, Worker
from elsewhere.peer.retries import Retries

LOCAL = frozenset({"10.77.0.1", "127.0.0.1"})


def _worker(i: int, *, slots: int = 1, free: int = 0, state: PeerState = PeerState.BUSY, host: int = 1,
            mem_gb: int = 8, ready: str = "ready") -> Worker:  # fmt: skip
    ann = Announcement(peer_id=f"{i:032x}", group="lab", address=f"10.77.0.{host}", port=7000 + i, user="u",
                       host=f"h{host}", state=state, slots=slots, slots_free=free, mem_bytes=mem_gb << 30,
                       time_s=math.inf)  # fmt: skip
    w = Worker(ann.peer_id, PeerInfo(ann, (f"10.77.0.{host}", 7000 + i), 0.0, 0.0))
    w.state = ready
    return w


def _hold(w: Worker, n: int, *, sent: int = 0, asked: float = 0.0) -> list[Batch]:
    """Give ``w`` ``n`` of our batches, the first ``sent`` of them running there."""
    out = []
    for j in range(n):
        b = Batch(
            f"{w.peer_id[-4:]}-{len(w.batches)}", w, [j], [0], asked, sent=1.0 if j < sent else 0.0
        )
        w.batches[b.bid] = b
        out.append(b)
    return out


# -- the choice of worker: one pass a turn, the same order as one choice per batch -----------------


def _reference_choice(
    ready: list[Worker], s: ControllerSettings, depth: int, now: float
) -> Worker | None:
    """The rule, one worker at a time: idle first, then local, then the least loaded by our
    batches, then the closest fit in memory, then the first listed (as placed before the
    choice was made in one pass)."""
    best, best_key = None, None
    for w in ready:
        a = w.info.announcement
        slots = max(1, a.slots // s.cores)
        if len(w.batches) >= depth * slots or w.busy_until > now:
            continue
        running = sum(1 for b in w.batches.values() if b.sent)
        idle = a.slots_free >= s.cores or (running < slots and a.state is PeerState.IDLE)
        local = s.prefer_local and w.info.connect_address[0] in LOCAL
        fit = (a.mem_bytes - s.mem_bytes) if s.mem_bytes else 0
        key = (0 if idle else 1, 0 if local else 1, len(w.batches) / slots, fit)
        if best_key is None or key < best_key:
            best, best_key = w, key
    return best


@pytest.mark.parametrize("seed", range(40))
def test_one_pass_asks_the_workers_in_the_order_of_one_choice_per_batch(seed: int) -> None:
    rng = random.Random(seed)
    s = ControllerSettings(mem_bytes=rng.choice([0, 2 << 30]), prefer_local=rng.random() < 0.8)
    workers = []
    for i in range(rng.randint(1, 40)):
        slots = rng.choice([1, 1, 2, 4])
        w = _worker(i, slots=slots, free=rng.randint(0, slots), host=rng.randint(1, 3),
                    state=rng.choice([PeerState.IDLE, PeerState.BUSY]), mem_gb=rng.choice([1, 4, 8, 16]),
                    ready=rng.choice(["ready"] * 8 + ["connecting", "closed"]))  # fmt: skip
        n = rng.randint(0, 2 * slots + 1)
        _hold(w, n, sent=rng.randint(0, n))
        w.busy_until = rng.choice([0.0, 0.0, 0.0, 11.0])
        w.listed = rng.random() < 0.95
        workers.append(w)
    usable = [w for w in workers if w.state == "ready" and w.usable(s)]
    pending = 10_000  # more tasks than slots: two batches a slot, connecting workers or not
    pick = Candidates(workers, s, LOCAL, 10.0, pending)
    assert pick.depth == 2
    assert pick.total_slots == sum(max(1, w.info.announcement.slots // s.cores) for w in usable)
    got, want = [], []
    while True:
        w = pick.take()
        expected = _reference_choice(usable, s, 2, 10.0)
        assert w is expected, (len(got), w and w.peer_id, expected and expected.peer_id)
        if w is None:
            break
        got.append(w)
        want.append(expected)
        _hold(w, 1)  # as the controller's ASK does
    assert got == want


def test_while_workers_connect_a_batch_a_slot_unless_the_tasks_outnumber_every_slot() -> None:
    s = ControllerSettings()
    ready = [_worker(i, free=1, state=PeerState.IDLE) for i in range(3)]
    connecting = [_worker(10 + i, ready="handshake") for i in range(3)]
    for w in ready:
        _hold(w, 1, sent=1)
    # six slots known, five tasks: they may all start at once, so none waits behind a busy slot
    assert Candidates([*ready, *connecting], s, LOCAL, 0.0, pending=5).take() is None
    # a thousand tasks: most wait anyway; queue one behind each running batch (before, one
    # worker connecting anywhere held every other at one batch a slot)
    pick = Candidates([*ready, *connecting], s, LOCAL, 0.0, pending=1000)
    assert pick.depth == 2
    assert {pick.take(), pick.take(), pick.take()} == set(ready)
    assert pick.take() is None
    assert Candidates(ready, s, LOCAL, 0.0, pending=5).depth == 2  # nobody connecting


def test_a_worker_busy_with_other_controllers_is_not_spare() -> None:
    s = ControllerSettings()
    assert _worker(0, free=1, state=PeerState.IDLE).spare(s)
    assert not _worker(1, free=0, state=PeerState.BUSY).spare(s)  # none of ours there, all taken
    mine = _worker(2, free=1, state=PeerState.IDLE)
    _hold(mine, 1)
    assert not mine.spare(s)  # ours waits there already
    assert not _worker(3, free=1, state=PeerState.IDLE, ready="connecting").spare(s)


# -- the controller's timers: a batch waiting in line, and idle workers -----------------------------


class _Controller(Retries, Batching):
    """The state the placing and the timers of a controller work on, without its sockets."""

    def __init__(self, workers: list[Worker]) -> None:
        self.settings = ControllerSettings()
        self.workers = {w.peer_id: w for w in workers}
        self.batches: dict[str, Batch] = {b.bid: b for w in workers for b in w.batches.values()}
        self.pending: collections.deque[int] = collections.deque()
        self.inflight: dict[int, set[str]] = {}
        for b in self.batches.values():
            for i in b.indices:
                self.inflight.setdefault(i, set()).add(b.bid)
        self.final, self.cancelled = TaskSet(), set()
        self.later: dict[int, float] = {}
        self.alone: set[int] = set()
        self.attempts: dict[int, int] = {}
        self.resubmits: dict[int, int] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.running_view: dict[int, Any] = {}
        self.recorder = None
        self.local_addresses = LOCAL
        self.mean_s, self.n_measured, self.result_bytes_per_task = 0.1, 10, 0.0
        self.stream, self.closed, self.standing_after = False, True, 0.0
        self._seq, self.short = 0, "ctl"
        self.placing_epoch, self.blocked, self.blocked_until, self.freed = 0, None, 0.0, set()
        self.resting: list[tuple[float, int, Worker]] = []
        self.roster_epoch, self.roster_slots = 0, (-1, 0)
        self.sent: list[tuple[Worker, Any]] = []

    def _send(self, w: Worker, message: Any, buffers: Any = (), *, flush: bool = True) -> bool:
        self.sent.append((w, message))
        return True


def _waiting_behind(i: int, task: int, asked: float) -> tuple[Worker, Batch]:
    """A worker running another controller's task, where a batch of ours waits (asked at ``asked``)."""
    w = _worker(i, free=0, state=PeerState.BUSY)
    b = Batch(f"b{i}", w, [task], [0], asked)
    w.batches[b.bid] = b
    return w, b


def test_a_batch_waiting_behind_another_controllers_task_keeps_its_place() -> None:
    # Before: a worker holding none of our batches counted as idle, though busy with another
    # controller's tasks; every batch waiting a quarter of a second went back to the queue, and
    # its worker was left alone for a second: among four controllers, most ASKs were withdrawn.
    w1, b1 = _waiting_behind(1, 0, asked=0.0)
    other = _worker(2, free=0, state=PeerState.BUSY)
    c = _Controller([w1, other])
    c._timers(now=1.0)
    assert not b1.withdrawn and c.batches[b1.bid] is b1
    assert list(c.pending) == [] and w1.busy_until == 0.0


def test_one_idle_worker_takes_one_waiting_batch_the_oldest() -> None:
    waiting = [_waiting_behind(i, i, asked=0.1 * i) for i in range(1, 4)]
    idle = _worker(9, free=1, state=PeerState.IDLE)
    c = _Controller([*(w for w, _ in waiting), idle])
    c._timers(now=1.0)
    moved = [b for _, b in waiting if b.withdrawn]
    assert moved == [waiting[0][1]]  # one, not all three
    assert list(c.pending) == [1]
    # the worker it left may be asked again at once: among controllers, a worker admits by use
    assert waiting[0][0].busy_until <= 1.0
    c._place(1.0)
    asked = [w for w, m in c.sent if type(m).__name__ == "Ask"]
    assert asked == [idle]


def test_a_batch_stuck_past_the_start_timeout_moves_and_its_worker_rests() -> None:
    w1, b1 = _waiting_behind(1, 0, asked=0.0)
    c = _Controller([w1, _worker(2, free=0, state=PeerState.BUSY)])
    c._timers(now=c.settings.start_timeout_s + 0.1)
    assert b1.withdrawn and list(c.pending) == [0]
    assert w1.busy_until > c.settings.start_timeout_s


# -- turns that would place nothing are skipped --------------------------------------------------


def _asks(c: _Controller) -> list[Worker]:
    return [w for w, m in c.sent if type(m).__name__ == "Ask"]


def _full_controller(n_workers: int = 32) -> _Controller:
    """Every worker holding all the batches it may (two a slot), tasks waiting."""
    workers = [_worker(i, free=0, state=PeerState.BUSY) for i in range(n_workers)]
    for w in workers:
        _hold(w, 2, sent=1)
    c = _Controller(workers)
    c.pending.extend(range(100, 200))
    return c


def test_a_turn_with_every_worker_full_is_skipped_until_a_batch_comes_back() -> None:
    # Before: every event the controller handled (an ACCEPT, an announcement, a timeout) ran
    # the pass over every worker, to find again that none had room: under contention half of
    # the placing turns of bench/peer_scale.py placed nothing, and they were most of its CPU.
    c = _full_controller()
    c._place(1.0)
    assert _asks(c) == [] and c.stats["placing_skipped"] == 0
    for t in (1.01, 1.02, 1.1):
        c._place(t)
    assert _asks(c) == [] and c.stats["placing_skipped"] == 3
    # a RESULT: its batch is forgotten, and the next turn asks that worker at once
    w = next(iter(c.workers.values()))
    c._forget(next(iter(w.batches.values())))
    c._place(1.11)
    assert _asks(c) == [w] and c.stats["placing_skipped"] == 3


@pytest.mark.parametrize("seed", range(6))
def test_a_turn_after_batches_came_back_looks_at_their_workers_alone_and_asks_as_a_full_pass_would(
    seed: int,
) -> None:
    # Under contention every worker is full and a placing turn follows each batch that comes
    # back: the pass over every worker cost most of a turn (bench/peer_scale.py: 99 us a task
    # at 32 workers). The narrow turn must choose as the full pass would, whatever happened.
    def controller() -> _Controller:
        rng = random.Random(seed)
        workers = []
        for i in range(32):
            slots = rng.choice([1, 1, 2])
            w = _worker(i, slots=slots, free=0, host=rng.randint(1, 3), mem_gb=rng.choice([4, 8, 16]))
            _hold(w, 2 * slots, sent=slots)
            workers.append(w)
        c = _Controller(workers)
        c.settings = ControllerSettings(prefer_local=rng.random() < 0.5, mem_bytes=rng.choice([0, 2 << 30]))
        c.pending.extend(range(1000, 3000))
        return c

    narrow, full = controller(), controller()
    rng = random.Random(seed + 100)
    now = 1.0
    for step in range(800):
        i, r, free = rng.randrange(32), rng.random(), rng.randint(0, 2)
        more = rng.sample(range(32), rng.choice([0, 0, 1, 2]))  # batches back from others too
        for c in (narrow, full):
            w = list(c.workers.values())[i]
            if r < 0.1:  # its announcement: idle or busy, its free slots (no room of ours changes)
                a = w.info.announcement
                free = min(free, a.slots)
                fields = {**{k: getattr(a, k) for k in a.__dataclass_fields__}, "slots_free": free,
                          "state": PeerState.IDLE if free else PeerState.BUSY}  # fmt: skip
                w.info = PeerInfo(Announcement(**fields), w.info.connect_address, 0.0, 0.0)
            elif r < 0.75:  # batches came back (from one worker or a few, between two turns)
                for back in [w, *(list(c.workers.values())[j] for j in more)]:
                    if back.batches:
                        c._forget(next(iter(back.batches.values())))
            elif r < 0.85 and w.batches:  # the worker refused one: it rests a moment
                c._forget(next(reversed(w.batches.values())))
                c._rest(w, now + 0.05)
            elif r < 0.9:
                c.pending.extend(range(10_000 + 10 * step, 10_000 + 10 * step + 10))
            if c is full and c.blocked is not None:
                c.blocked = c.blocked._replace(roster=-1)  # a pass over every worker, always
            c._place(now)
            for _w, m in c.sent:
                b = c.batches.get(m.task_id)
                if b is not None:
                    b.sent = b.sent or now  # (admitted at once)
        assert [(w.peer_id, m.task_id) for w, m in narrow.sent] == [(w.peer_id, m.task_id) for w, m in full.sent], step
        now += rng.choice([0.0005, 0.002, 0.01, 0.03])
    assert narrow.stats["placing_narrow"] > 200 and full.stats["placing_narrow"] == 0
    assert len(narrow.sent) > 200  # (it placed)


def _placed_once_then_no_pass(monkeypatch: pytest.MonkeyPatch) -> tuple[_Controller, list[Worker]]:
    """Every worker full but the first, asked in a pass over every worker (which adds up the
    slots); from then on, building a pass fails the test."""
    c = _full_controller()
    ws = list(c.workers.values())
    c._forget(next(iter(ws[0].batches.values())))
    c._place(1.0)
    assert _asks(c) == [ws[0]]
    from elsewhere.peer import batching

    def no_pass(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a pass was built")

    monkeypatch.setattr(batching, "Candidates", no_pass)
    return c, ws


def test_a_turn_after_one_batch_came_back_asks_its_worker_without_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # The usual turn under contention: one RESULT, its worker has room again. Building the
    # pass's candidates for that one worker was most of the turn (bench/peer_scale.py).
    c, ws = _placed_once_then_no_pass(monkeypatch)
    w = ws[5]
    c._forget(next(iter(w.batches.values())))
    c._place(1.01)
    assert _asks(c) == [ws[0], w] and c.stats["placing_narrow"] == 1
    c._place(1.02)  # full again: skipped
    assert _asks(c) == [ws[0], w] and c.stats["placing_skipped"] == 1


def _one_back_with_waiting(tasks: list[int], mean_s: float) -> _Controller:
    """Every worker full but one that a batch came back from; ``tasks`` waiting, of which 100
    ended (a copy of it ran elsewhere) and 101 was cancelled while they waited again."""
    c = _full_controller()
    c.pending.clear()
    c.pending.extend(tasks)
    c.final.add(100)
    c.cancelled.add(101)
    c.mean_s = mean_s
    w = next(iter(c.workers.values()))
    c._forget(next(iter(w.batches.values())))
    return c


@pytest.mark.parametrize("mean_s", [0.5, 0.001])  # batches of one task; of several
def test_a_task_that_ended_while_it_waited_again_is_not_asked_for(mean_s: float) -> None:
    # A task placed twice (it ran long, a copy went elsewhere) may end while it waits in the
    # queue again: the batch asked for skips it, and a task cancelled meanwhile too.
    c = _one_back_with_waiting([100, 101, 102, 103], mean_s)
    c._place(1.0)
    asked = [c.batches[m.task_id].indices for _w, m in c.sent]
    assert asked and asked[0][0] == 102 and not {100, 101} & {i for b in asked for i in b}
    c = _one_back_with_waiting([100, 101], mean_s)
    c._place(1.0)
    assert c.sent == [] and not c.pending


def test_a_skipped_turn_places_when_tasks_come_or_a_while_passed() -> None:
    c = _full_controller()
    c._place(1.0)
    c.pending.append(500)  # more tasks: looked at again (the depth a slot depends on them)
    c._place(1.01)
    assert c.stats["placing_skipped"] == 0
    c._place(1.02)
    assert c.stats["placing_skipped"] == 1
    # a change nothing announced (a safety net): the pass runs again a quarter second on
    w = next(iter(c.workers.values()))
    w.batches.clear()
    c._place(1.1)
    assert _asks(c) == []
    c._place(1.3)
    assert _asks(c) == [w, w]


def test_no_task_is_placed_while_the_results_waiting_for_the_disk_pass_their_bound() -> None:
    # Results that come faster than the job folder's disk takes them wait in the controller's
    # memory: past RECORD_BACKLOG_BYTES (with a window of 100 calls returning 1 MB each, 64 MB
    # of them held 100 MB more at the peak than 16), no new task goes out until they are written.
    c = _Controller([_worker(1, free=1, state=PeerState.IDLE)])
    c.pending.extend(range(3))
    c.recorder = types.SimpleNamespace(backlog_bytes=RECORD_BACKLOG_BYTES + 1)
    c._place(1.0)
    assert _asks(c) == [] and list(c.pending) == [0, 1, 2]
    c.recorder.backlog_bytes = RECORD_BACKLOG_BYTES  # written down to the bound: placing goes on
    c._place(1.01)
    assert _asks(c) and len(c.pending) < 3


def test_a_worker_that_refused_is_asked_again_when_its_wait_ends() -> None:
    c = _full_controller(2)
    a, _b = c.workers.values()
    a.batches.clear()
    c._rest(a, 1.05)  # it refused us a moment ago (fair share)
    c._place(1.0)
    assert _asks(c) == []
    c._place(1.04)
    assert c.stats["placing_skipped"] == 1
    c._place(1.06)
    assert _asks(c) == [a, a]


def test_a_worker_whose_rest_ends_is_asked_without_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under contention workers refuse (fair share) and rest a moment; the end of a rest ran
    # the pass over every worker again (bench/peer_scale.py: about half the passes of the
    # controller of the longest tasks). Only the rested worker may have gained room.
    c, ws = _placed_once_then_no_pass(monkeypatch)
    c._forget(next(iter(ws[3].batches.values())))  # a batch of ws[3]'s came back ...
    c._rest(ws[3], 1.05)  # ... refused: it rests
    c._place(1.01)
    assert _asks(c) == [ws[0]]
    c._place(1.03)  # still resting: skipped
    assert _asks(c) == [ws[0]] and c.stats["placing_skipped"] >= 1
    c._place(1.06)  # its rest is over: asked, in a narrow turn
    assert _asks(c) == [ws[0], ws[3]] and c.stats["placing_narrow"] >= 2


def test_the_turn_after_a_refusal_does_not_look_at_the_worker_that_rests(monkeypatch: pytest.MonkeyPatch) -> None:
    # A refused batch comes back (its worker freed) and its worker rests at once: the turn that
    # followed looked at that worker, found it resting and placed nothing (bench/peer_scale.py:
    # 252 such turns of 1660 that placed nothing, for the controller of the longest tasks).
    # It is looked at when its rest ends, not before.
    c, ws = _placed_once_then_no_pass(monkeypatch)
    looked: list[Worker] = []
    real = c._refill
    monkeypatch.setattr(c, "_refill", lambda w, *a: (looked.append(w), real(w, *a)))
    c._forget(next(iter(ws[3].batches.values())))
    c._rest(ws[3], 1.05)
    c._place(1.01)
    assert looked == [] and _asks(c) == [ws[0]]
    c._place(1.06)
    assert looked == [ws[3]] and _asks(c) == [ws[0], ws[3]]


def test_rests_that_ended_are_let_go_with_no_task_waiting() -> None:
    # an open Executor with nothing to place has its standing ASK refused again and again:
    # the rests must not pile up while no task waits
    c = _full_controller(4)
    c.pending.clear()
    ws = list(c.workers.values())
    for k in range(1000):
        c._rest(ws[k % 4], 1.0 + k * 0.001)
    c._place(3.0)
    assert c.resting == []


def test_the_slots_of_all_workers_are_added_up_again_only_when_a_worker_changes() -> None:
    workers = [_worker(i, free=1, state=PeerState.IDLE) for i in range(2)]
    c = _Controller(workers)
    c.settings = ControllerSettings(batch_min_s=0.0)  # no least batch: half a fair share alone
    c.mean_s = 1e-4  # tiny tasks: a batch is half a fair share of the tasks waiting
    c.pending.extend(range(100))
    c._place(1.0)
    assert c.roster_slots == (0, 2)
    assert next(len(b.indices) for b in c.batches.values()) == 25  # 100 / (2 x 2 slots)
    third = _worker(5, free=1, state=PeerState.IDLE)
    c.workers[third.peer_id] = third
    c._roster_changed()  # it turned ready
    waiting = len(c.pending)
    c._place(1.1)
    assert c.roster_slots == (1, 3)
    first = next(b for b in c.batches.values() if b.worker is third)
    assert len(first.indices) == math.ceil(waiting / 6)  # shared over 3 slots now, not 2


def test_a_worker_found_or_offering_more_ends_the_skip_its_free_slots_alone_do_not() -> None:
    w = _worker(1, ready="ready")
    c = _Links([w])
    c._refresh_workers(now=1.0)
    assert c.placing_epoch == 1  # found
    c.workers[w.peer_id] = w  # (the one the controller knows)

    def announce(**changed: Any) -> None:
        a = w.info.announcement
        fields = {**{k: getattr(a, k) for k in a.__dataclass_fields__}, **changed}
        c.listener.peers = lambda: [PeerInfo(Announcement(**fields), w.info.connect_address, 0.0, 0.0)]
        c._refresh_workers(now=2.0)

    announce(slots_free=1, state=PeerState.IDLE)  # a task ended there: no room of ours changes
    assert c.placing_epoch == 1
    # its free memory and time left move in nearly every announcement: nothing of ours changes
    # while they cross no need of the job's (with every such change a pass over the workers)
    announce(mem_bytes=w.info.announcement.mem_bytes + 12345, time_s=w.info.announcement.time_s - 7)
    assert c.placing_epoch == 1
    c.settings = ControllerSettings(mem_bytes=4 << 30, time_s=600.0)  # a job that needs 4 GiB, 10 min
    announce(mem_bytes=6 << 30, time_s=3600.0)  # less, still enough
    assert c.placing_epoch == 1
    announce(mem_bytes=2 << 30)  # too little memory now
    assert c.placing_epoch == 2
    announce(mem_bytes=8 << 30)  # enough again
    assert c.placing_epoch == 3
    announce(time_s=60.0)  # too little time
    assert c.placing_epoch == 4
    announce(slots=4)  # more slots: room for more batches
    assert c.placing_epoch == 5
    announce(state=PeerState.ZOMBIE)  # stopping: none
    assert c.placing_epoch == 6


# -- the daemon's memory check: the task's own processes, not all of /proc --------------------------


def test_the_memory_check_reads_the_task_process_tree_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from elsewhere.peer import dispatch

    grandchild = ("import time\nb = bytearray(64 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
                  "print('ready', flush=True)\ntime.sleep(30)\n")  # fmt: skip
    task = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}], stdout=sys.stdout)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    opened: list[str] = []
    real_open = open

    def watched(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    try:
        assert task.stdout is not None and task.stdout.readline().strip() == "ready"
        tree = {task.pid, *_descendants(task.pid)}
        monkeypatch.setattr("builtins.open", watched)
        got = dispatch.subtree_rss([task.pid, 999_999_999])
        monkeypatch.undo()
        assert got[task.pid] >= 64 << 20  # the grandchild's memory, and both interpreters
        assert got[999_999_999] == 0  # gone
        # a few files of the task's own processes, where a pass over /proc reads one of each
        # process of the machine
        read = {
            int(p.split("/")[2])
            for p in opened
            if p.startswith("/proc/") and p.split("/")[2].isdigit()
        }
        assert read <= tree | {999_999_999}
        assert len(opened) <= 4 * len(tree) + 2
    finally:
        monkeypatch.undo()
        for p in _descendants(task.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        task.kill()
        task.wait(10)


def _descendants(pid: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return []


# -- connecting to many workers: a few handshakes at a time ------------------------------------------


class _Links(Links):
    """The connection bookkeeping of a controller, its sockets left out (``_connect`` records)."""

    def __init__(self, workers: list[Worker]) -> None:
        infos = [w.info for w in workers]
        self.settings = ControllerSettings()
        self.workers: dict[str, Worker] = {}
        self.peer_id = "f" * 32
        self.listener = types.SimpleNamespace(peers=lambda: infos)
        self.stats: collections.Counter[str] = collections.Counter()
        self.opened: list[Worker] = []
        self.placing_epoch = self.roster_epoch = 0
        self.lanes_wanted = False  # (an Executor's lanes: not in these tests)

    def _connect(self, w: Worker, now: float) -> None:
        w.state, w.since = "connecting", now
        self.opened.append(w)

    def _update_note(self) -> None:
        pass


def test_a_controller_opens_a_few_connections_at_a_time() -> None:
    # Before: all 32 at once; on a busy machine every handshake ran past the workers' 1 s
    # deadline, was cut, and opened again at once (740 to 2 877 cut handshakes in a run).
    c = _Links([_worker(i, ready="new") for i in range(32)])
    c._refresh_workers(now=1.0)
    first = list(c.opened)
    assert 1 <= len(first) < 32
    for w in first[:3]:
        w.state = "ready"  # their handshakes are done: as many more may open
    c._refresh_workers(now=1.1)
    assert len(c.opened) == len(first) + 3
    for w in c.workers.values():
        w.state = "ready" if w.state != "new" else w.state
    for _ in range(32):
        c._refresh_workers(now=2.0)
        for w in c.opened:
            w.state = "ready"
    assert all(w.state == "ready" for w in c.workers.values())  # every worker, in the end


def test_a_connection_cut_in_its_handshake_opens_again_later() -> None:
    w = _worker(1, ready="handshake")
    c = _Links([w])
    c.workers[w.peer_id] = w
    c._disconnected(w, "closed by the worker: handshake timed out")
    assert c.opened == [] and w.state == "closed" and w.failures == 1
    c._refresh_workers(now=w.since + 0.1)  # within its back-off
    assert c.opened == []
    c._refresh_workers(now=w.since + 1.0)
    assert c.opened == [w]
    # a connection that was working opens again at once (the worker keeps results for it)
    w.state = "ready"
    c._disconnected(w, "reset")
    assert c.opened == [w, w]


# -- what a snapshot of the job asks the controller: results on their way to the disk -------------


def test_results_on_their_way_to_the_job_folder_are_those_not_yet_durable() -> None:
    # Before: every look at a running peer job (ew.map's wait, ten times a second) walked every
    # task that had ended here (a set of all of them, each looked up in the journal's outcomes):
    # a fifth of the caller's CPU in a job of 10 000 no-ops.
    import queue

    from elsewhere.peer.notes import Notes
    from elsewhere.peer.results import Results

    class _R(Results, Notes):
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.final, self.written, self.cancelled = TaskSet(), TaskSet(), set()
            self.entries, self.prepared, self.reasons = {}, {}, {}
            self.running_view: dict[int, Any] = {}
            self.inflight: dict[int, set[str]] = {}
            self.batches: dict[str, Batch] = {}
            self.durable: queue.SimpleQueue[Any] = queue.SimpleQueue()
            self.recorder, self.to_record = None, []
            self.buffers = types.SimpleNamespace(free=lambda buf: None)
            self.sent: list[Any] = []

        def _send(self, w: Any, message: Any, buffers: Any = (), *, flush: bool = True) -> bool:
            self.sent.append(message)
            return True

    r = _R()
    w = _worker(1)
    for i in range(100_000):
        r._finalise(i)
    assert r.on_the_way() == list(range(100_000))  # results in, none durable yet
    r.durable.put(([(w, "b1", list(range(0, 60_000))), (w, "b2", list(range(60_001, 100_000)))], []))
    r._send_acks()
    assert r.on_the_way() == [60_000]  # the recorder made all but one durable
    assert len(r.sent) == 2  # and the worker is acknowledged for both batches
