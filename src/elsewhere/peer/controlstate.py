"""What a job's controller holds, and its plain bookkeeping of the job's tasks.

:class:`ControllerState` is the state that the parts of the
:class:`~.controller.Controller` share (each part is a mixin of it, in a module
of its own: see :mod:`.controller`), all made by its constructor:

- the job's tasks: ``n`` (how many so far) and ``closed`` (no more will come);
  ``pending`` (to place, in order), ``inflight`` (task -> the batches it is
  in), ``final`` (its result or fate is stored), ``cancelled``; ``attempts``,
  ``lost_count`` and ``resubmits`` of each; ``entries`` and ``prepared``, the
  tasks an Executor handed in memory, until they are final;
- the workers (``workers``, by peer id) and the batches asked for or sent
  (``batches``, by batch id), the records of :mod:`.placement`;
- the selector loop's: ``sel`` and ``waker``, ``commands`` from other threads,
  ``_state`` (the lock a turn of the loop, or a ``put``, holds), ``unflushed``
  and ``_corked`` (frames that leave together at the end of a turn);
- the way back: ``to_record`` and ``recorder`` (results to the job folder),
  ``durable`` (their ACKs, once synced), ``outcomes`` and ``on_outcome`` (values
  to an Executor);
- what others are told: ``note``, ``running_view``, ``stats``.

Here too is the bookkeeping that moves a task between those sets: read from
the job folder (:meth:`~ControllerState._load_state`,
:meth:`~ControllerState._read_queue`), handed in memory
(:meth:`~ControllerState._on_put`), finished (:meth:`~ControllerState._finalise`).
"""

from __future__ import annotations

import collections
import dataclasses
import getpass
import heapq
import os
import queue
import selectors
import socket
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..folder.taskmap import TaskSet
from ..util.errors import ConfigError
from ..util.progress import NoteTeller
from .announce import new_peer_id
from .discovery import Announcer, Listener
from .encoder import TaskEncoder
from .messages import LANE_SUFFIX, Identity, Refuse, Result
from .net import Waker
from .placement import Batch, ControllerSettings, Worker
from .recorder import Recorder
from .stream import ReusableBuffers

if TYPE_CHECKING:
    from ..folder.store import JobStore

__all__ = ["Blocked", "ControllerState"]


class Blocked(NamedTuple):
    """What a placing turn that left tasks waiting (no worker had room) saw: until one of
    these changes, the next turns need not look at every worker (see ``Batching._place``)."""

    epoch: int  # ControllerState.placing_epoch
    pending: int  # the tasks waiting
    roster: int  # ControllerState.roster_epoch
    connecting: int  # the workers still connecting ...
    known: int  # ... and the slots of those and of the ready ones (a batch's depth: Candidates)


class ControllerState:
    """The state of one job's controller (see the module doc), and its task bookkeeping."""

    if TYPE_CHECKING:  # what the parts call of each other (each defined in its own module)

        # .links
        def _send(self, w: Worker, message: Any, buffers: Any = (), *, flush: bool = True) -> bool: ...
        def _disconnected(self, w: Worker, why: str) -> None: ...
        def _lane_closed(self, lane: Worker, why: str, *, ended: bool) -> None: ...
        def _short(self) -> bool: ...
        def _write_worker_info(self, w: Worker) -> None: ...

        # .batching
        def _on_accept(self, w: Worker, bid: str) -> None: ...
        def _on_refuse(self, w: Worker, msg: Refuse) -> None: ...
        def _withdraw(self, b: Batch) -> None: ...
        def _forget(self, b: Batch) -> None: ...

        # .results
        def _on_result(self, w: Worker, msg: Result, buffers: tuple[Any, ...]) -> None: ...

        # .retries
        def _unplace(self, b: Batch, *, requeue_front: bool, resubmit: bool = False) -> None: ...
        def _requeue(self, index: int) -> None: ...
        def _write_lost(self, w: Worker, index: int, attempt: int, pickled: Any, log_bytes: bytes,
                        t0: float, t1: float) -> None: ...  # fmt: skip
        def _fail_tasks(self, indices: list[int], exc: BaseException) -> None: ...
        def _rerun_later(self, index: int, attempt: int, group: tuple[Any, list[Any]], item: int) -> bool: ...

        # .notes
        def _update_note(self) -> None: ...

    def __init__(self, store: JobStore, settings: ControllerSettings) -> None:
        from ..folder.payload import PayloadReader

        self.store = store
        self.settings = settings
        meta = store.meta()
        self.meta = meta
        self.stream = bool(meta.get("stream"))
        # an open Executor whose tasks declare no memory or time takes lanes where workers
        # serve them (ELSEWHERE_PEER_LANES=0: none, every task through the worker daemon)
        self.lanes_wanted = (self.stream and not settings.mem_bytes and not settings.time_s
                             and settings.cores == 1 and os.environ.get("ELSEWHERE_PEER_LANES", "1") != "0")  # fmt: skip
        self.spin_s = _spin_s()  # how long a caller waiting for a short task's result spins
        self.retries = int(meta.get("retries", 0))
        self.rerun_spec = meta.get("retry")  # retries=ew.Retry(on=...): errors run again
        self.later: dict[int, float] = {}  # errors run again: task -> when (monotonic) to place it
        self.alone: set[int] = set()  # tasks to send each in a batch of its own (see Batching._alone_cut)
        self.last_sent = 0.0  # when the last TASK went (an Executor idle for long closes its lanes)
        self.off_lanes: set[int] = set()  # tasks whose lane broke under them: through a worker daemon
        self.seed = meta.get("seed")
        self.peer_id = settings.peer_id or new_peer_id()
        self.short = os.urandom(3).hex()
        self.identity = Identity(self.peer_id, getpass.getuser()[:256], socket.gethostname()[:256])
        self.lane_identity = dataclasses.replace(self.identity, peer_id=self.peer_id + LANE_SUFFIX)
        job_info = {
            "id": meta.get("id", ""), "name": meta.get("name", ""), "seed": self.seed,
            "cwd": meta.get("cwd"), "sys_path": list(meta.get("sys_path") or []),
            "env": {str(k): str(v) for k, v in (meta.get("env") or {}).items()},
            "cores": settings.cores,
        }  # fmt: skip
        self.encoder = TaskEncoder(PayloadReader(store.path / "payload.log"), job_info,
                                   settings.diary, settings.time_s, store.path / "files")  # fmt: skip
        self.sel = selectors.DefaultSelector()
        self.waker = Waker()  # commands, the discovery watch and stop() wake the loop
        self.waker.register(self.sel)
        self.commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.running_view: dict[int, tuple[str, float]] = {}
        self.result_bytes_per_task = 0.0  # the mean size of a result, for batch sizes
        self._last_shown = 0.0
        self._shown: dict[str, Any] = {}
        self.note = ""
        self.teller = NoteTeller(str(meta.get("name", ""))) if self.stream else None  # an Executor's
        self.reasons: dict[int, str] = {}
        self.workers: dict[str, Worker] = {}
        self.batches: dict[str, Batch] = {}
        self.pending: collections.deque[int] = collections.deque()
        self.inflight: dict[int, set[str]] = {}
        self.final = TaskSet()  # runs of task numbers: a million final tasks are a few runs
        self.written = TaskSet()  # of them, those the recorder made durable (or found so)
        self.cancelled: set[int] = set()
        self.attempts: dict[int, int] = {}
        self.lost_count: dict[int, int] = {}
        self.resubmits: dict[int, int] = {}
        self.n = 0
        self.closed = not self.stream
        self.mean_s = 0.0
        self.n_measured = 0
        self.entries: dict[int, Any] = {}  # tasks handed in memory (put), until final
        self.prepared: dict[int, Any] = {}  # their pickles (prepare), until final
        self.on_outcome: Any = None  # (index, ok, value or error description) -> None
        self.outcomes: list[tuple[int, bool, Any, int]] = []  # for on_outcome, after the turn
        self.durable: queue.SimpleQueue[tuple[list[Any], list[Any]]] = queue.SimpleQueue()
        self.recorder: Recorder | None = None
        self.unflushed: set[Worker] = set()  # workers with frames queued, not yet flushed
        self._corked = False  # a put or a turn of the loop is on: its frames leave at its end
        self.to_record: list[Any] = []  # results for the recorder, handed over together
        self.first_to_record = 0.0
        self._state = threading.RLock()  # the loop's, while it works; a put's, while it places
        self._loop_ended = False
        self._last_refresh = 0.0
        self._last_queue = 0.0
        self.stats: collections.Counter[str] = collections.Counter()
        self.standing_after = 0.0
        # what may give a worker room for a batch bumps this (a batch gone, a connection
        # made or lost, a worker's offer changed); a placing turn that placed what it could
        # and left tasks waiting keeps what it saw (Blocked) and until when to look at every
        # worker again anyway: the turns after it skip the pass over the workers while its
        # epoch and tasks waiting hold, and look only at the workers a batch came back from
        # (``freed``) while its roster holds
        self.placing_epoch = 0
        self.blocked: Blocked | None = None
        self.blocked_until = 0.0
        self.freed: set[Worker] = set()
        # workers not to be asked until a moment passes (they refused us, or a batch waited
        # there too long): (until, seq, worker), a heap; each is looked at again when its
        # rest ends, as a worker a batch came back from is (``freed``)
        self.resting: list[tuple[float, int, Worker]] = []
        self.roster_epoch = 0  # the part of it that changes which workers are ready and usable
        self.roster_slots = (-1, 0)  # (roster_epoch, the slots of those workers) when last added up
        self._seq = 0
        self._stop = threading.Event()
        self._cancelled_job = False
        self._thread: threading.Thread | None = None
        self._watch: threading.Thread | None = None
        self.listener: Listener | None = None
        self.announcer: Announcer | None = None
        self.error: BaseException | None = None
        self.local_addresses: frozenset[str] = frozenset({"127.0.0.1"})
        self.buffers = ReusableBuffers()  # large RESULT buffers, reused once written to disk
        self.finished = threading.Event()

    def _rest(self, w: Worker, until: float) -> None:
        """Ask ``w`` nothing before ``until`` (monotonic); then a placing turn looks at it (not
        before: the batch it refused, just come back, does not make it one to look at now)."""
        w.busy_until = until
        heapq.heappush(self.resting, (until, w.seq, w))
        self.freed.discard(w)

    def _roster_changed(self) -> None:
        """A worker was found, lost, connected, closed, or offers other than it did: which
        workers may be asked, and their slots, are looked at again (see ``placing_epoch``)."""
        self.roster_epoch += 1
        self.placing_epoch += 1

    # -- the job's tasks ---------------------------------------------------------------
    def _load_state(self) -> None:
        from ..folder.journal import JournalReader

        reader = JournalReader(self.store)
        reader.refresh()
        with self.store.locked_queue() as q:
            self.n = q.n
            self.closed = q.closed or not self.stream
            self.cancelled = set(q.cancelled_tasks)
            again, _ = q.take_reruns(len(q.to_rerun))  # this controller places them
            attempts = q.attempts()
            if q.cancelled:
                self._cancelled_job = True
        rerun = set(again)
        self.final = TaskSet(t for t in reader.final if t not in rerun)
        self.written = self.final.copy()
        for t, (_, rec) in reader.reruns.items():  # errors run again (retries=ew.Retry): their next attempt
            if t not in self.final:
                attempts[t] = max(attempts.get(t, 0), rec.attempt + 1)
        self.attempts = attempts
        self._queue_new(0)
        for i in again:
            if i not in self.pending and i not in self.cancelled:
                self.pending.append(i)

    def _queue_new(self, start: int) -> None:
        cancelled, pending = self.cancelled, self.pending
        for a, b in self.final.gaps(start, self.n):  # (a run at a time: a new job is one)
            pending.extend(range(a, b) if not cancelled else (i for i in range(a, b) if i not in cancelled))

    def _read_queue(self) -> None:
        q = self.store.queue()
        n = q.n
        if n > self.n:
            old, self.n = self.n, n
            self._queue_new(old)
        self.closed = q.closed or not self.stream
        if q.to_rerun:
            with self.store.locked_queue() as lq:
                again, _ = lq.take_reruns(len(lq.to_rerun))  # this controller places them
                for i in again:
                    self.attempts[i] = lq.attempt(i, self.attempts.get(i, 0))
            for i in again:
                self.final.discard(i)
                self.cancelled.discard(i)
                if i not in self.pending and i not in self.inflight:
                    self.pending.append(i)
        if q.cancelled:
            self._cancelled_job = True

    def _on_put(self, index: int, entry: Any, prepared: Any = None) -> None:
        self.entries[index] = entry
        if prepared is not None:
            self.prepared[index] = prepared
        if index >= self.n:
            self.n = index + 1  # those before it (callers on other threads) come on their own
        elif index in self.pending or index in self.inflight or index in self.final:
            return  # known already
        if index not in self.cancelled:
            self.pending.append(index)

    def _ended_among(self, tasks: list[int]) -> bool:
        """Whether any of ``tasks`` is final or cancelled: a look at the runs of
        final tasks between the smallest and the largest, not a lookup per task."""
        final, cancelled = self.final, self.cancelled
        if not tasks:
            return False
        return bool(final and final.overlaps(min(tasks), max(tasks) + 1)) or bool(
            cancelled and not cancelled.isdisjoint(tasks))

    def _finalise(self, index: int) -> None:
        self._finalise_all((index,))

    def _finalise_all(self, indices: Sequence[int]) -> None:
        """Tasks ``indices`` have their outcome: forget their inputs, withdraw copies of them
        still out (a task placed twice), under one hold of the lock (a RESULT's tasks)."""
        entries, prepared, reasons, inflight = self.entries, self.prepared, self.reasons, self.inflight
        for held in (entries, prepared, reasons):
            if held:  # (empty for a job's tasks read from its payload)
                for index in indices:
                    held.pop(index, None)
        final, view = self.final, self.running_view
        with self.lock:  # (final and written are read from other threads: see Notes.on_the_way)
            final.update(indices)  # (a run at a time)
            if view:
                for index in indices:
                    view.pop(index, None)
        for index in indices:
            bids = inflight.pop(index, None)  # (none left, usually: the batch was forgotten first)
            for bid in list(bids) if bids else ():
                b = self.batches.get(bid)
                if b is not None and all(i in final or i in self.cancelled for i in b.indices):
                    self._withdraw(b)  # a copy elsewhere that nobody needs any more


def _spin_s() -> float:
    """``ELSEWHERE_PEER_SPIN_MS``: how long, at most, a thread waiting for a short task's
    result polls its connection without sleeping (default 2 ms; 0: it sleeps at once)."""
    text = os.environ.get("ELSEWHERE_PEER_SPIN_MS", "2")
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0.0 <= ms <= 1000.0:
        raise ConfigError(f"ELSEWHERE_PEER_SPIN_MS must be 0 to 1000 (milliseconds), not {text!r}")
    return ms / 1000.0
