"""What the controller knows of workers and batches, and how it chooses among them.

The settings a job's controller runs with (:class:`ControllerSettings`); a
worker as the controller knows it (:class:`Worker`: its announcement, our
connection, its batches, whether this job's tasks may go there); a batch of
tasks asked to run on one worker (:class:`Batch`, and :class:`Standing`, one
asked ahead of its tasks); and the pure choices of placing: which worker to
ask (:class:`Candidates`, :func:`choose_standing`) and for how many tasks
(:func:`batch_size`). The controller that acts on them is
:class:`~.controller.Controller` (its placing in :mod:`.batching`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .announce import Announcement, PeerState
from .discovery import DiscoveryConfig
from .keys import GroupKey
from .messages import LANE_SUFFIX, Ask
from .peertable import PeerInfo
from .recorder import GroupWriter
from .stream import ConnectionPump
from .wire import Connection

__all__ = [
    "Batch",
    "Candidates",
    "ControllerSettings",
    "Standing",
    "Worker",
    "batch_size",
    "choose_standing",
    "local_addresses",
]

_MAX_BATCH = 4096


@dataclass(frozen=True)
class ControllerSettings:
    """What each task needs, and how the controller finds and uses workers."""

    key: GroupKey | None = None
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    mem_bytes: int = 0
    time_s: float = 0.0
    cores: int = 1
    diary: str = "always"
    prefer_local: bool = True
    batch_target_s: float = 0.1
    batch_min_s: float = 0.002
    start_timeout_s: float = 5.0
    connect_timeout_s: float = 3.0
    peer_id: str = ""
    encrypt: bool = True  # with a key: tasks and results encrypted (workers must agree)


@dataclass(slots=True)
class Batch:
    """Tasks asked to run on one worker together: one ASK, one TASK, one RESULT."""

    bid: str
    worker: Worker
    indices: list[int]
    attempts: list[int]
    asked: float
    sent: float = 0.0
    sent_wall: float = 0.0
    copied: bool = False
    withdrawn: bool = False  # its tasks went elsewhere; waiting for the worker's answer
    standing: bool = False  # asked before any task was there (an open Executor's next task)
    accepted: float = 0.0


@dataclass
class Standing:
    """A batch asked for before any task was there, and its ASK."""

    batch: Batch  # standing, empty
    ask: Ask  # its ASK, sent alone or inside a TASK


_made = itertools.count()


class Worker:
    """A worker as this controller knows it: its announcement and our connection."""

    def __init__(self, peer_id: str, info: PeerInfo) -> None:
        self.seq = next(_made)  # the order workers were found in (a pass over them goes in it)
        self.peer_id = peer_id
        self.info = info
        self.sock: socket.socket | None = None
        self.conn: Connection | None = None
        self.pump: ConnectionPump | None = None
        self.state = "new"  # new, connecting, handshake, ready, closed
        self.since = 0.0
        self.batches: dict[str, Batch] = {}
        self.sent_fns: dict[str, None] = {}  # function parts the worker holds, oldest first
        self.busy_until = 0.0
        self.unsuitable = ""  # why it cannot take this job's tasks (memory, time, not allowed)
        self.unsuitable_for: tuple[Any, ...] = ()
        self.unsuitable_since = 0.0
        self.wid = ""
        self.writer: GroupWriter | None = None
        self.host = info.announcement.host
        self.failures = 0
        self.listed = True
        self.events = 0  # what the controller's selector watches its socket for now
        self.lane_of: Worker | None = None  # a lane: the worker whose task process it reaches
        self.lane: Worker | None = None  # this worker's lane, if it has one
        self.lane_after = 0.0  # no lane is opened to it before this (one was refused, or ended)
        self.lane_asked = False  # (a lane: its one lane ASK went)
        self.lane_killed = 0.0  # (a lane: when its worker was asked to stop the task it runs)

    @property
    def key(self) -> str:
        """Its key among the controller's workers: the peer id (a lane's: with LANE_SUFFIX)."""
        return self.peer_id + LANE_SUFFIX if self.lane_of is not None else self.peer_id

    @property
    def offer(self) -> tuple[Any, ...]:
        """What a refusal for memory, time or access depended on (asked again when it changes)."""
        a = self.info.announcement
        return (a.slots, a.user, a.host, math.floor(a.time_s / 60) if a.time_s != math.inf else -1)

    def connectable(self) -> bool:
        """Whether to connect to it: it was not found unsuitable, is listed and not stopping."""
        return not self.unsuitable and self.listed and self.info.announcement.state is not PeerState.ZOMBIE

    def why_not(self, settings: ControllerSettings) -> str:
        """Why tasks that need what ``settings`` say cannot go to it now ("" if they can)."""
        from ..util.units import format_duration, format_size

        a = self.info.announcement
        s = settings
        if self.unsuitable:
            return self.unsuitable
        if not self.listed:
            return "gone"
        if a.state is PeerState.ZOMBIE:
            return "stopping"
        if a.slots < s.cores:
            return f"{a.slots} core(s), the tasks need {s.cores}"
        if s.time_s and a.time_s < s.time_s:
            return f"offers {format_duration(a.time_s)}, the tasks need {format_duration(s.time_s)}"
        if s.mem_bytes and a.mem_bytes < s.mem_bytes:
            return f"offers {format_size(a.mem_bytes)} of memory, the tasks need {format_size(s.mem_bytes)}"
        return ""

    def usable(self, settings: ControllerSettings) -> bool:
        """Whether tasks that need what ``settings`` say can go to it now."""
        # why_not without its messages (Candidates writes it out again: keep the two alike)
        a = self.info.announcement
        s = settings
        return not (self.unsuitable or not self.listed or a.state is PeerState.ZOMBIE or a.slots < s.cores
                    or (s.time_s and a.time_s < s.time_s) or (s.mem_bytes and a.mem_bytes < s.mem_bytes))

    def spare(self, settings: ControllerSettings) -> bool:
        """Whether it sits idle, for a batch waiting elsewhere to move to: ready, usable,
        holding none of our batches, and a slot free by its last announcement. A worker
        busy with other controllers' tasks is not spare: a batch moved there waits as long."""
        return (
            self.state == "ready"
            and not self.batches
            and self.usable(settings)
            and self.info.announcement.slots_free >= settings.cores
        )


def batch_size(settings: ControllerSettings, w: Worker, total_slots: int, pending: int,
               mean_s: float, n_measured: int, bytes_per_task: float = 0.0, *, least: bool = True) -> int:  # fmt: skip
    """How many tasks to ask ``w`` to take at once: ``settings.batch_target_s`` of work at
    the mean task time (``mean_s`` of ``n_measured`` tasks; one task until one was
    measured), at most half a fair share of the ``pending`` tasks over ``total_slots``
    but, with ``least``, not less than ``settings.batch_min_s`` of work (the end of a job
    of tiny tasks then takes a few batches, not a round trip per task or two: ends within
    that much of each other are balanced enough; an Executor's job goes without it, since
    its calls' results must not wait for a slow call placed in their batch), no more than
    ``w`` offers the time for, and no more than :data:`BATCH_BYTES` of results at the mean
    ``bytes_per_task`` (a RESULT is one frame, at most 4 GiB)."""
    if n_measured and mean_s > settings.batch_target_s:
        return 1  # (what the rest makes of a task longer than a batch: the usual case at scale)
    k = floor = 1
    if n_measured:
        mean = max(mean_s, 1e-6)
        k = int(settings.batch_target_s / mean)
        if least:
            floor = int(settings.batch_min_s / mean)
    k = min(k, max(1, floor, math.ceil(pending / (2 * total_slots))), _MAX_BATCH)
    if bytes_per_task > 0:
        k = min(k, int(BATCH_BYTES / bytes_per_task))
    offer = w.info.announcement.time_s
    if settings.time_s > 0 and offer != math.inf:
        k = min(k, max(1, int(offer / settings.time_s)))
    return max(1, k)


BATCH_BYTES = 1 << 30
"""The results a batch is sized to bring back at most (their mean so far per task)."""


class Candidates:
    """The workers one placing turn may ask for batches, best first: the choice of
    :meth:`take`, made for every worker in one pass when the turn starts.

    A worker may be asked if it is ready and usable, not busy (refused us a moment ago),
    and holds fewer than ``depth`` of our batches a slot: two; or one while other workers
    are still connecting and the ``pending`` tasks fit in the slots of all (a batch that
    waited behind a busy slot here would lose to a free worker ready a moment later; with
    more tasks than slots, some wait anyway, and one of ours waiting at each worker keeps
    our place in its line). The best is idle first (a slot free by its announcement, or
    none of our batches running on an idle one), then local (if ``settings.prefer_local``),
    then the least loaded by our batches, then the closest fit in memory, then the first
    listed.

    The pass runs at events the controller handles, often to find that each worker holds all
    it may (the usual case under contention; the controller then skips it until something
    may have given a worker room: a batch came back, a worker's rest ended): it is one loop
    with nothing called per worker, a worker is looked at further only if it has room, and
    the slots of all (:attr:`total_slots`) are added up only when a batch is sized, and not
    again until a worker's state or offer changes (the controller passes the sum it kept,
    ``total_slots``).
    """

    __slots__ = ("_heap", "_ready", "_settings", "_total_slots", "connecting", "depth", "known")

    def __init__(
        self,
        workers: Iterable[Worker],
        settings: ControllerSettings,
        local_addresses: frozenset[str],
        now: float,
        pending: int,
        *,
        total_slots: int = -1,
        depth: int = 0,
    ) -> None:
        s = settings
        cores, prefer_local, mem, time_s = s.cores, s.prefer_local, s.mem_bytes, s.time_s
        zombie = PeerState.ZOMBIE
        known = connecting = 0
        ready: list[tuple[Worker, Announcement, int]] = []
        room: list[tuple[Worker, Announcement, int, int]] = []
        for w in workers:
            a = w.info.announcement
            slots = a.slots // cores or 1
            if w.state != "ready":
                if w.state in ("connecting", "handshake"):
                    connecting += 1
                    known += slots
                continue
            known += slots
            if total_slots < 0:
                ready.append((w, a, slots))
            n = len(w.batches)
            if n < 2 * slots and w.busy_until <= now:  # (one that rests is asked once it is over)
                room.append((w, a, slots, n))
        self._ready, self._settings, self._total_slots = ready, s, total_slots
        self.known, self.connecting = known, connecting
        if not depth:
            depth = 1 if connecting and pending <= known else 2
        self.depth = depth
        heap: list[tuple[int, float, int, int, Worker, int, int]] = []
        for order, (w, a, slots, n) in enumerate(room):
            # Worker.usable, written out (here and in total_slots): a call per worker would
            # cost as much as the rest
            if (n >= depth * slots or w.unsuitable or not w.listed or a.state is zombie or a.slots < cores
                    or (time_s and a.time_s < time_s) or (mem and a.mem_bytes < mem)):  # fmt: skip
                continue
            idle = a.slots_free >= cores or (
                a.state is PeerState.IDLE and sum(1 for b in w.batches.values() if b.sent) < slots)  # fmt: skip
            local = prefer_local and w.info.connect_address[0] in local_addresses
            rank = 2 * ((0 if idle else 2) + (0 if local else 1)) + (0 if w.lane_of is not None else 1)
            heap.append((rank, n / slots, (a.mem_bytes - mem) if mem else 0, order, w, slots, n))
        heapq.heapify(heap)
        self._heap = heap

    @property
    def slots_known(self) -> bool:
        """Whether :attr:`total_slots` was given or added up (the controller keeps it until
        a worker's state or offer changes)."""
        return self._total_slots >= 0

    @property
    def total_slots(self) -> int:
        """The slots of the ready, usable workers (what :func:`batch_size` shares the pending
        tasks over): added up when a batch is sized, not at a turn that places nothing."""
        if self._total_slots < 0:
            s = self._settings
            cores, mem, time_s, zombie = s.cores, s.mem_bytes, s.time_s, PeerState.ZOMBIE
            total = 0
            for w, a, slots in self._ready:
                if (w.unsuitable or not w.listed or a.state is zombie or a.slots < cores
                        or (time_s and a.time_s < time_s) or (mem and a.mem_bytes < mem)):  # fmt: skip
                    continue
                total += slots
            self._total_slots = total
        return self._total_slots

    def take(self) -> Worker | None:
        """The worker to ask for the next batch (counted as holding one batch more), or
        None when no worker may be asked."""
        heap = self._heap
        if not heap:
            return None
        rank, _, fit, order, w, slots, n = heap[0]
        n += 1
        if n < self.depth * slots:
            heapq.heapreplace(heap, (rank, n / slots, fit, order, w, slots, n))
        else:
            heapq.heappop(heap)
        return w


def choose_standing(workers: Iterable[Worker], settings: ControllerSettings,
                    local_addresses: frozenset[str], short: bool, now: float) -> Worker | None:
    """The worker to ask ahead, for an open Executor's next task: a ready, usable one,
    local first; for ``short`` tasks the one with the most batches (where the last task
    runs), up to two a slot; else the one with the fewest, up to one a slot."""
    s = settings
    best = None
    for w in workers:
        if w.state != "ready" or not w.usable(s) or w.busy_until > now:
            continue
        slots = max(1, w.info.announcement.slots // s.cores)
        if len(w.batches) >= (2 * slots if short else slots):
            continue
        local = w.info.connect_address[0] in local_addresses
        key = (0 if local else 1, 0 if w.lane_of is not None else 1, -len(w.batches) if short else len(w.batches))
        if best is None or key < best[0]:
            best = (key, w)
    return best[1] if best is not None else None


def local_addresses() -> frozenset[str]:
    """This machine's IPv4 addresses (a worker at one of them is local)."""
    import psutil

    out = {"127.0.0.1"}
    with contextlib.suppress(Exception):
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address for a in addrs if a.family == socket.AF_INET)
    return frozenset(out)
