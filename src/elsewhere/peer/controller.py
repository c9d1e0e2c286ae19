"""The controller: runs one job's tasks on the peers of a group (peercellfun, peerfeval).

A thread in the client process, owned by the job's :class:`PeerCluster`::

    user thread ── tasks_added / put / cancel / stop ──> command queue + wake socket
                                                        │
    listener thread (discovery) ── workers changed ──> wake
                                                        v
    controller thread: one selector loop over its TCP connections to workers
        place:   pending tasks -> batches -> ASK to the best worker (idle first,
                 local first, best memory fit); held or refused with a reason
        ACCEPT:  TASK = pickled (fn, args, kwargs) of the batch + out-of-band buffers
                 (+ the job's function and job data, once per connection)
        RESULT:  each task's value -> the Executor's future at once (``on_outcome``);
                 its pickled value, error or fate -> the recorder thread, which writes
                 it to the job folder and syncs; then ACK (the worker forgets it)
        timers:  ASKs not admitted in time move elsewhere; overdue batches run twice;
                 workers whose announcements stop, or whose connection is refused,
                 lose their batches to others. The first result wins.

Task fates in a RESULT (see ``child.Outcome``): OK and ERROR are written as
they are; KILLED (past its admitted time or memory) is written as an error;
LOST (its process crashed) is run again while the job's ``retries`` last, then
written off as lost; REQUEUE (handed back by a stopping worker, or never run)
is placed again at no cost. Tasks whose worker vanishes are placed again too
(at most ``MAX_RESUBMITS`` times each).

The settings, the records of workers and batches and the pure choices of placing
are in :mod:`.placement`; the pickling of a batch into its TASK is a
:class:`~.encoder.TaskEncoder`; results are made durable by the
:class:`~.recorder.Recorder`.
"""

from __future__ import annotations

import collections
import contextlib
import getpass
import json
import logging
import os
import pickle
import queue
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from ..util.errors import PeerError, ProtocolError
from ..util.progress import NoteTeller
from .access import same_user
from .announce import Announcement, PeerInfo, PeerState, new_peer_id
from .child import Outcome
from .discovery import Announcer, Listener
from .encoder import TaskEncoder
from .messages import (
    MAX_ACKS,
    Accept,
    Ack,
    Ask,
    Bye,
    Cancel,
    Error,
    Identity,
    Ping,
    Refuse,
    RefuseReason,
    Result,
    Task,
)
from .placement import (
    Batch,
    ControllerSettings,
    Standing,
    Worker,
    batch_size,
    choose_standing,
    choose_worker,
    local_addresses,
)
from .recorder import GroupWriter, Recorder
from .stream import Closed, ConnectionPump, ReusableBuffers
from .wire import Connection, HandshakeComplete, Limits, Received, Role

if TYPE_CHECKING:
    from ..api.job import Job

__all__ = ["MAX_RESUBMITS", "Controller"]

log = logging.getLogger(__name__)

MAX_RESUBMITS = 5
"""How often one task is placed again because its worker vanished (not its own fault)."""
RUNNING_FILE = "peer-running.json"
"""In the job folder: the tasks on workers now and the controller's note (see ``_show``)."""
_ACK_S = 0.02
"""How soon the loop looks for results the recorder made durable, to acknowledge them."""
_SHORT_S = 0.005
"""Tasks shorter than this: an open Executor asks ahead at the worker running its task."""
_PUT_WAIT_S = 0.002
"""How long ``put`` waits for the loop to finish its turn before leaving the task to it."""
_PERMANENT = (RefuseReason.MEMORY, RefuseReason.TIME, RefuseReason.NOT_ALLOWED)


class Controller:
    """Places the tasks of one job on peers and stores their results (see the module doc)."""

    def __init__(self, job: Job, settings: ControllerSettings) -> None:
        from ..folder.payload import PayloadReader

        self.job = job
        self.store = job.store
        self.settings = settings
        meta = job.store.meta()
        self.meta = meta
        self.stream = bool(meta.get("stream"))
        self.retries = int(meta.get("retries", 0))
        self.seed = meta.get("seed")
        self.peer_id = settings.peer_id or new_peer_id()
        self.short = os.urandom(3).hex()
        self.identity = Identity(self.peer_id, getpass.getuser()[:256], socket.gethostname()[:256])
        job_info = {
            "id": meta.get("id", ""), "name": meta.get("name", ""), "seed": self.seed,
            "cwd": meta.get("cwd"), "sys_path": list(meta.get("sys_path") or []),
            "env": {str(k): str(v) for k, v in (meta.get("env") or {}).items()},
            "cores": settings.cores,
        }  # fmt: skip
        self.encoder = TaskEncoder(PayloadReader(job.store.path / "payload.log"), job_info,
                                   settings.diary, settings.time_s, job.store.path / "files")  # fmt: skip
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
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
        self.final: set[int] = set()
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

    # -- the user's side (any thread) ----------------------------------------------------
    def start(self) -> Controller:
        """Start discovery and the controller thread; returns self."""
        s = self.settings
        group = s.key.group if s.key is not None else ""
        self.local_addresses = local_addresses()
        self.listener = Listener(s.key, s.discovery).start()
        address = s.discovery.for_key(s.key).interface or "0.0.0.0"
        ann = Announcement(self.peer_id, group, address, 0, self.identity.user, self.identity.host,
                           PeerState.CONTROLLER, task=str(self.meta.get("name", ""))[:200])  # fmt: skip
        try:
            self.announcer = Announcer(ann, s.key, s.discovery).start()
        except OSError as exc:
            log.warning("controller announcements are off (%s)", exc)
        self._load_state()
        self.recorder = Recorder(self.store, self._on_durable)
        self._thread = threading.Thread(target=self._main, name="elsewhere-peer-controller", daemon=True)
        self._thread.start()
        self._watch = threading.Thread(target=self._watch_peers, name="elsewhere-peer-watch", daemon=True)
        self._watch.start()
        return self

    def alive(self) -> bool:
        """True while the controller thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def tasks_added(self) -> None:
        """New tasks were appended to a stream job (``q["n"]`` grew)."""
        self._command("tasks")

    def put(self, index: int, entry: tuple[Any, tuple[Any, ...], dict[str, Any]],
            prepared: Any = None) -> None:  # fmt: skip
        """Task ``index`` of a stream job, ``(fn, args, kwargs)``, handed in memory: it is
        placed at once (the caller appends it to the job's payload on its own time).
        Each index comes once. ``prepared``: what :meth:`prepare` made of ``entry``.

        The calling thread places it itself, under the loop's lock, while the loop waits
        for the network: a task admitted ahead then goes out without waking the loop's
        thread (on two shared cores, a thread's wake-up costs as much as a frame).
        """
        if self._thread is None or threading.current_thread() is self._thread:
            self._command("put", index, entry, prepared)
            return
        if not self._state.acquire(timeout=_PUT_WAIT_S):  # the loop is busy (a large frame?):
            self._command("put", index, entry, prepared)  # it places the task when done
            return
        try:
            if self._loop_ended:
                self._command("put", index, entry, prepared)  # a new controller will place it
                return
            self._corked = True  # the TASK and the next standing ASK leave in one send
            try:
                self._on_put(index, entry, prepared)
                self._place(time.monotonic())
            finally:
                self._corked = False
            self._flush_unflushed()
        finally:
            self._state.release()

    def prepare(self, entry: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> Any:
        """Pickle a task for :meth:`put`, in the calling thread: its function part once per
        function (cached), its inputs now. A task placed alone is then sent without pickling
        anything in the loop, and the caller learns at once what cannot be pickled (this
        raises what pickling raises)."""
        return self.encoder.prepare(entry)

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

    def cancel_task(self, index: int) -> None:
        """Drop task ``index``: it is not placed again, and its result is not kept."""
        self._command("cancel_task", index)

    def cancel(self) -> None:
        """Cancel every task and stop."""
        # A flag, not a queued command: a ``stop()`` that follows can end the loop in a turn
        # that has read no command yet, and the workers must still be told to drop their tasks.
        self._cancelled_job = True
        self._wake()

    def refresh_queue(self) -> None:
        """Re-read the queue (retries added by ``job.retry()``, a closed stream)."""
        self._command("queue")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (results received so far are stored and acknowledged)."""
        self._stop.set()
        self._command("stop")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def counters(self) -> dict[str, int]:
        """What this controller did so far: asks (``asks_folded``: standing ASKs sent inside
        a TASK; ``accepts_folded``: ACCEPTs that came inside a RESULT), refusals by reason,
        batches, duplicates,
        bytes on the wire both ways (``bytes_sent``, ``bytes_received``) and the payload
        bytes they carried (``payload_bytes`` of tasks, ``result_bytes`` of results)."""
        out = dict(self.stats)
        for w in list(self.workers.values()):
            pump = w.pump
            if pump is not None:
                out["bytes_sent"] = out.get("bytes_sent", 0) + pump.bytes_sent
                out["bytes_received"] = out.get("bytes_received", 0) + pump.bytes_received
        return out

    def running(self) -> dict[int, tuple[str, float]]:
        """Tasks on workers now: index -> (worker id, since)."""
        with self.lock:
            return dict(self.running_view)

    def is_running(self, index: int) -> bool:
        """Whether task ``index`` is on a worker now (sent, no result yet)."""
        return index in self.running_view  # one lookup: atomic, no copy

    def _command(self, *cmd: Any) -> None:
        self.commands.put(cmd)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"c")

    def _on_durable(self, acks: list[Any], buffers: list[Any]) -> None:
        # The recorder thread: what it wrote is durable. The loop sends the ACKs at its next
        # turn (at most _ACK_S later): waking it for each would cost more than the wait.
        self.durable.put((acks, buffers))

    # -- state from the job folder ---------------------------------------------------------
    def _load_state(self) -> None:
        from ..folder.journal import JournalReader

        reader = JournalReader(self.store)
        reader.refresh()
        with self.store.locked_queue() as q:
            self.n = int(q.get("n", 0))
            self.closed = bool(q.get("closed", True)) or not self.stream
            self.cancelled = set(q.get("cancelled_tasks", []))
            again = [int(i) for i in q.get("retry", [])]
            q["retry"] = []
            attempts = {int(k): int(v) for k, v in q.get("attempts", {}).items()}
            if q.get("cancelled"):
                self._cancelled_job = True
        self.final = set(reader.final) - set(again)
        self.attempts = attempts
        self._queue_new(0)
        for i in again:
            if i not in self.pending and i not in self.cancelled:
                self.pending.append(i)

    def _queue_new(self, start: int) -> None:
        for i in range(start, self.n):
            if i not in self.final and i not in self.cancelled:
                self.pending.append(i)

    def _read_queue(self) -> None:
        q = self.store.queue()
        n = int(q.get("n", 0))
        if n > self.n:
            old, self.n = self.n, n
            self._queue_new(old)
        self.closed = bool(q.get("closed", True)) or not self.stream
        if q.get("retry"):
            with self.store.locked_queue() as lq:
                again = [int(i) for i in lq.get("retry", [])]
                lq["retry"] = []
                for i in again:
                    self.attempts[i] = int(lq.get("attempts", {}).get(str(i), self.attempts.get(i, 0)))
            for i in again:
                self.final.discard(i)
                self.cancelled.discard(i)
                if i not in self.pending and i not in self.inflight:
                    self.pending.append(i)
        if q.get("cancelled"):
            self._cancelled_job = True

    # -- the loop -----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug: say so where the user looks, then stop
            self.error = exc
            log.exception("peer controller of job %r failed", self.meta.get("name"))
            self.note = f"the peer controller failed: {type(exc).__name__}: {exc}"
        finally:
            with self._state:
                self._loop_ended = True
                self._close_all()
            self.finished.set()

    def _loop(self) -> None:
        self._last_refresh = 0.0
        self._last_queue = time.monotonic()
        while True:
            busy = bool(self.pending or self.batches)
            recording = self.to_record or (self.recorder is not None and self.recorder.outstanding)
            timeout = _ACK_S if recording or not self.durable.empty() else (0.05 if busy else 0.25)
            events = self.sel.select(timeout)
            with self._state:
                self._corked = True  # what this turn sends leaves together, at its end
                try:
                    self._turn(events)
                finally:
                    self._corked = False
                self._flush_unflushed()
            if self.outcomes:
                self._deliver_outcomes()
            if self._loop_ended:
                break
        with self._state:
            if self._cancelled_job:
                for b in list(self.batches.values()):
                    self._send(b.worker, Cancel(b.bid))
            self._send_acks(wait=True)

    def _turn(self, events: list[Any]) -> None:
        """One turn of the loop, on what the selector returned (sets ``_loop_ended``)."""
        for key, mask in events:
            kind, worker = key.data
            if kind == "wake":
                self._on_wake()
            elif kind == "connect":
                self._on_connected(worker)
            else:
                self._on_readable(worker, mask)
        now = time.monotonic()
        if self._stop.is_set() or self._cancelled_job:
            self._loop_ended = True
            return
        if now - self._last_refresh > 0.05:
            self._refresh_workers(now)
            self._timers(now)
            self._last_refresh = now
            if now - self._last_shown >= 1.0:
                self._show(now)
        if self.stream and now - self._last_queue > 0.5:
            self._read_queue()
            self._last_queue = now
        self._send_acks()
        self._place(now)
        if self._done():
            self._loop_ended = True

    def _flush_unflushed(self) -> None:
        for w in self.unflushed:
            self._flush(w)
        self.unflushed.clear()

    def _done(self) -> bool:
        if self.closed:
            for b in [b for b in self.batches.values() if b.standing and not b.withdrawn]:
                self._withdraw(b)  # no next task will come
        busy = any(not (b.withdrawn or b.standing) for b in self.batches.values())
        if not self.closed or self.pending or busy:
            return False
        return all(i in self.final or i in self.cancelled for i in range(self.n))

    def _on_wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_r.recv(65536)
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "put":
                self._on_put(int(cmd[1]), cmd[2], cmd[3] if len(cmd) > 3 else None)
            elif cmd[0] == "tasks" or cmd[0] == "queue":
                self._read_queue()
            elif cmd[0] == "cancel_task":
                i = int(cmd[1])
                self.cancelled.add(i)
                with contextlib.suppress(ValueError):
                    self.pending.remove(i)
                for bid in list(self.inflight.get(i, ())):
                    b = self.batches.get(bid)
                    if b is not None and all(j in self.cancelled or j in self.final for j in b.indices):
                        self._withdraw(b)

    def _watch_peers(self) -> None:
        """Wake the loop when the set of workers or their state changes."""
        listener = self.listener
        assert listener is not None
        seen: list[Any] = [None]

        def signature(peers: list[PeerInfo]) -> Any:
            return tuple((p.peer_id, p.announcement.state, p.announcement.slots_free) for p in peers
                         if p.announcement.state is not PeerState.CONTROLLER)  # fmt: skip

        def changed(peers: list[PeerInfo]) -> bool:
            return signature(peers) != seen[0] or self._stop.is_set() or self.finished.is_set()

        while not (self._stop.is_set() or self.finished.is_set()):
            if listener.wait_for(changed, timeout=1.0):
                seen[0] = signature(listener.peers())
                with contextlib.suppress(OSError):
                    self._wake_w.send(b"p")

    # -- workers --------------------------------------------------------------------------
    def _refresh_workers(self, now: float) -> None:
        assert self.listener is not None
        listed: set[str] = set()
        for info in self.listener.peers():
            a = info.announcement
            if a.state is PeerState.CONTROLLER or a.peer_id == self.peer_id:
                continue
            listed.add(a.peer_id)
            w = self.workers.get(a.peer_id)
            if w is None:
                w = self.workers[a.peer_id] = Worker(a.peer_id, info)
            else:
                w.info = info
                w.listed = True
            if w.unsuitable and (w.offer != w.unsuitable_for or now - w.unsuitable_since > 30.0):
                w.unsuitable = ""  # its offer changed, or a while passed: ask again
            if w.state in ("new", "closed") and w.connectable() and now - w.since > min(0.2 * 2 ** w.failures, 5.0):
                self._connect(w, now)
        for w in list(self.workers.values()):
            if w.peer_id not in listed and w.listed:
                w.listed = False
                self._lose(w, "its announcements stopped (it expired)")
        if not self.workers:
            self.note = self._no_peer_note()
        elif self.pending and not any(w.usable(self.settings) for w in self.workers.values()):
            why = "; ".join(sorted({f"{w.host}: {w.why_not(self.settings)}" for w in self.workers.values()}))
            self.note = f"no peer can take these tasks now: {why}"[:1000]
        else:
            self.note = ""
        if self.teller is not None:  # no bar shows an Executor's note: it is logged if it stands
            self.teller.see(self.note if self.pending or self.batches else "")

    def _no_peer_note(self) -> str:
        """What to say while no peer was seen: where the controller listens, and the
        command that starts a worker it would see."""
        from .discovery import DEFAULT_PORT

        port = self.settings.discovery.port
        cmd = "elsewhere peer worker" + (f" --port {port}" if port != DEFAULT_PORT else "")
        assert self.listener is not None
        skewed = [f"{src}: {why}" for src, (_n, why, authentic) in sorted(self.listener.refusals().items())
                  if authentic]  # fmt: skip
        if skewed:  # members of the group are there, but refused
            return f"waiting for peers: refused the announcements of {'; '.join(skewed)}"[:1000]
        if self.settings.key is None:
            return (f"waiting for peers: none seen yet on discovery port {port} (without a key: this "
                    f"user's workers on this machine); start one with `{cmd}`")
        group = self.settings.key.group
        return (f"waiting for peers: none seen yet in group {group!r} on discovery port {port}; start "
                f"one with `{cmd} --group {group}` where its key is")

    def _connect(self, w: Worker, now: float) -> None:
        w.state, w.since = "connecting", now
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(w.info.connect_address)
        if err not in (0, 115, 11):  # EINPROGRESS, EAGAIN
            sock.close()
            self._connect_failed(w, os.strerror(err))
            return
        w.sock = sock
        self.sel.register(sock, selectors.EVENT_WRITE, ("connect", w))

    def _on_connected(self, w: Worker) -> None:
        sock = w.sock
        assert sock is not None
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.sel.unregister(sock)
            sock.close()
            w.sock = None
            self._connect_failed(w, os.strerror(err))
            return
        w.conn = Connection(Role.INITIATOR, self.settings.key, self.identity, allocate=self.buffers)
        w.pump = ConnectionPump(sock, w.conn)
        w.state = "handshake"
        self.sel.modify(sock, selectors.EVENT_READ, ("worker", w))
        self._flush(w)

    def _connect_failed(self, w: Worker, why: str) -> None:
        w.state = "closed"
        w.failures += 1
        w.since = time.monotonic()
        log.debug("cannot connect to worker %s (%s): %s", w.host, w.info.connect_address, why)
        if w.failures >= 2 or w.batches:
            self._lose(w, f"its connection was refused ({why})")

    def _on_readable(self, w: Worker, mask: int) -> None:
        if w.pump is None:
            return
        try:
            if mask & selectors.EVENT_READ:
                pump = w.pump
                for event in pump.read():
                    self._on_event(w, event)
                    if w.pump is not pump:
                        return
                if pump.failed is not None:
                    raise pump.failed
            self._flush(w)
        except (Closed, ProtocolError, OSError) as exc:
            self._disconnected(w, str(exc) or type(exc).__name__)

    def _flush(self, w: Worker) -> None:
        if w.pump is None or w.sock is None:
            return
        try:
            done = w.pump.flush()
        except OSError as exc:
            self._disconnected(w, str(exc))
            return
        events = selectors.EVENT_READ if done else selectors.EVENT_READ | selectors.EVENT_WRITE
        with contextlib.suppress(KeyError, ValueError):
            if self.sel.get_key(w.sock).events != events:
                self.sel.modify(w.sock, events, ("worker", w))

    def _send(self, w: Worker, message: Any, buffers: Any = (), *, flush: bool = True) -> bool:
        if w.conn is None or w.state != "ready":
            return False
        try:
            w.conn.send(message, buffers)
        except PeerError as exc:
            log.debug("cannot send %s to %s: %s", type(message).__name__, w.host, exc)
            return False
        if flush:
            if self._corked:
                self.unflushed.add(w)
            else:
                self._flush(w)
        return True

    def _drop_connection(self, w: Worker) -> None:
        if w.pump is not None:
            self.stats["bytes_sent"] += w.pump.bytes_sent
            self.stats["bytes_received"] += w.pump.bytes_received
        if w.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(w.sock)
            with contextlib.suppress(OSError):
                w.sock.close()
        w.sock = w.conn = w.pump = None
        w.sent_fns.clear()
        w.state = "closed"
        w.since = time.monotonic()

    def _disconnected(self, w: Worker, why: str) -> None:
        """The connection broke: ASKs are void; running batches wait for a reconnect."""
        log.debug("connection to %s lost: %s", w.host, why)
        self.stats["disconnections"] += 1
        self._drop_connection(w)
        for b in list(w.batches.values()):
            if not b.sent:
                self._unplace(b, requeue_front=True)
        if w.listed and w.connectable():
            self._connect(w, time.monotonic())  # results it keeps come again on the new one
        elif w.batches:
            self._lose(w, f"its connection broke ({why})")

    def _lose(self, w: Worker, why: str) -> None:
        """The worker is gone: its batches go elsewhere."""
        if w.batches:
            log.info("worker %s lost (%s): %d batch(es) placed again", w.host, why, len(w.batches))
        for b in list(w.batches.values()):
            self._unplace(b, requeue_front=True, resubmit=bool(b.sent))
        self._drop_connection(w)
        if not w.listed:
            self.workers.pop(w.peer_id, None)

    # -- messages ------------------------------------------------------------------------
    def _on_event(self, w: Worker, event: Any) -> None:
        if isinstance(event, HandshakeComplete):
            self._on_handshake(w, event)
            return
        msg = event.message
        assert isinstance(event, Received)
        if isinstance(msg, Accept):
            self._on_accept(w, msg.task_id)
        elif isinstance(msg, Refuse):
            self._on_refuse(w, msg)
        elif isinstance(msg, Result):
            for bid in msg.accepted:  # folded ACCEPTs (the wire checked they were asked for)
                self.stats["accepts_folded"] += 1
                self._on_accept(w, bid)
            self._on_result(w, msg, event.buffers)
        elif isinstance(msg, Ping):
            pass
        elif isinstance(msg, (Bye, Error)):
            self._disconnected(w, getattr(msg, "reason", "") or getattr(msg, "message", ""))

    def _on_handshake(self, w: Worker, event: HandshakeComplete) -> None:
        g = event.peer
        if g.peer_id != w.peer_id:  # another process at that address now: ours is gone
            self._lose(w, "it was restarted")
            w.unsuitable, w.unsuitable_for = "it answers with another peer id", w.offer
            return
        if self.settings.key is None and w.sock is not None and not same_user(w.sock):
            self._drop_connection(w)
            w.unsuitable, w.unsuitable_for = "it runs as another user (no group key)", w.offer
            return
        w.state = "ready"
        w.failures = 0
        w.host = g.host or w.host
        if not w.wid:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in w.host)[:40] or "peer"
            w.wid = f"peer-{safe}-{w.peer_id[:8]}-{self.short}"
            self._write_worker_info(w)

    def _write_worker_info(self, w: Worker) -> None:
        from ..folder.store import write_json

        info = {"host": w.host, "pid": w.pid, "peer_id": w.peer_id, "user": w.info.announcement.user,
                "address": list(w.info.connect_address), "python": ""}  # fmt: skip
        with contextlib.suppress(OSError):
            write_json(self.store.path / "workers" / f"{w.wid}.json", info, fsync=False)

    def _on_accept(self, w: Worker, bid: str) -> None:
        b = self.batches.get(bid)
        if b is None or b.worker is not w or b.withdrawn:
            self._send(w, Cancel(bid))
            if b is not None:
                self._forget(b)
            return
        b.accepted = time.monotonic()
        if b.standing:  # admitted ahead: the next task goes at once, with no ASK in its way
            if self.pending:
                self._fill_standing(b)
            return
        keep = [(i, a) for i, a in zip(b.indices, b.attempts) if i not in self.final and i not in self.cancelled]
        if not keep:
            self._withdraw(b)
            return
        b.indices, b.attempts = [i for i, _ in keep], [a for _, a in keep]
        self._send_task(w, b)

    def _fill_standing(self, b: Batch, *, send: bool = True) -> None:
        """Give a standing batch the pending tasks (as many as one batch takes); send them
        if it was admitted already."""
        if len(self.pending) == 1:  # an Executor's task, one at a time: no batch to size
            k = 1
        else:
            total = sum(max(1, x.info.announcement.slots // self.settings.cores)
                        for x in self.workers.values() if x.state == "ready")  # fmt: skip
            k = batch_size(self.settings, b.worker, max(1, total), len(self.pending), self.mean_s,
                           self.n_measured, self.result_bytes_per_task)  # fmt: skip
        while self.pending and len(b.indices) < k:
            i = self.pending.popleft()
            if i in self.final or i in self.cancelled:
                continue
            b.indices.append(i)
            b.attempts.append(self.attempts.get(i, 0))
            self.inflight.setdefault(i, set()).add(b.bid)
        b.standing = False
        if not b.indices:
            b.standing = True
        elif send:
            self._send_task(b.worker, b)

    def _send_task(self, w: Worker, b: Batch) -> None:
        """Send the TASK of an admitted batch."""
        bid = b.bid
        try:
            while True:
                info, buffers = self._encode(w, b)
                if self._fits(w, b, info, buffers):
                    break
        except Exception as exc:
            self._withdraw(b)
            self._fail_tasks(b.indices, exc)
            return
        nxt = self._fold_standing(w)
        ask = ()
        if nxt is not None:
            ask = Task.folding(nxt.ask)
            self.stats["asks_folded"] += 1
        if not self._send(w, Task(bid, info, ask), buffers):
            self._unsent_parts(w, info)
            if nxt is not None:
                self._forget(nxt.batch)
            self._send(w, Cancel(bid))  # the slot it admitted goes back (if the connection lives)
            self._unplace(b, requeue_front=True)
            return
        b.sent, b.sent_wall = time.monotonic(), time.time()
        self.stats["batches_sent"] += 1
        with self.lock:
            for i in b.indices:
                self.running_view[i] = (w.wid, b.sent_wall)

    @staticmethod
    def _unsent_parts(w: Worker, info: dict[str, Any]) -> None:
        """The function and job parts a TASK would have carried did not reach ``w``."""
        for name, count in ((info["fn"], info["nfn"]), (info.get("jpart", ""), info.get("njpart"))):
            if count:
                w.sent_fns.pop(name, None)

    def _fits(self, w: Worker, b: Batch, info: dict[str, Any], buffers: list[Any]) -> bool:
        """Whether the TASK of ``b`` fits in one frame (at most 4 GiB in at most 1024
        buffers). If not, a batch of several tasks keeps the first half (the others go back
        to the front of the queue) and is encoded again; a task alone raises why: it can
        never be sent, and would otherwise be placed again and again."""
        limits = w.conn.limits if w.conn is not None else Limits()
        size = sum(memoryview(x).nbytes for x in buffers)
        if size <= limits.max_body_bytes and len(buffers) <= limits.max_buffers:
            self.stats["payload_bytes"] += size
            return True
        self._unsent_parts(w, info)
        if len(b.indices) == 1:
            from ..util.units import format_size

            raise PeerError(
                f"its data with its function ({format_size(size)} in {len(buffers)} buffers) is over "
                f"what one message to a worker may carry ({format_size(limits.max_body_bytes)} in "
                f"{limits.max_buffers} buffers): pass a smaller argument, or a file path the task reads")
        keep = len(b.indices) // 2
        back, b.indices, b.attempts = b.indices[keep:], b.indices[:keep], b.attempts[:keep]
        with self.lock:
            for i in back:
                bids = self.inflight.get(i)
                if bids is not None:
                    bids.discard(b.bid)
                    if not bids:
                        del self.inflight[i]
        for i in reversed(back):
            if i not in self.pending:
                self.pending.appendleft(i)
        self.stats["batches_split"] += 1
        return False

    def _on_refuse(self, w: Worker, msg: Refuse) -> None:
        b = self.batches.get(msg.task_id)
        if b is None:
            return
        self.stats[f"refused_{msg.reason.name.lower()}"] += 1
        self._unplace(b, requeue_front=True)
        if b.withdrawn:
            return
        if msg.reason in _PERMANENT:
            why = msg.reason.name.lower().replace("_", " ")  # "not allowed", "memory", ...
            w.unsuitable, w.unsuitable_for = f"{why}: {msg.detail}", w.offer
            w.unsuitable_since = time.monotonic()
            for i in b.indices:
                self.reasons[i] = f"refused by {w.host}: {why} ({msg.detail})"
        else:
            w.busy_until = time.monotonic() + (0.05 if msg.reason is RefuseReason.FAIR_SHARE else 0.2)

    def _on_result(self, w: Worker, msg: Result, buffers: tuple[Any, ...]) -> None:
        info = msg.info
        pid = int(info.get("pid") or 0)
        if pid and pid != w.pid:
            w.pid = pid
            self._write_worker_info(w)
        b = self.batches.get(msg.task_id)
        if b is not None:
            self._forget(b)
        try:
            self._store_items(w, msg.task_id, info, buffers)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            log.warning("malformed RESULT from %s: %s", w.host, exc)
            self._disconnected(w, f"malformed RESULT: {exc}")
            return
        if b is not None:
            for i, a in zip(b.indices, b.attempts):  # tasks a worker did not report: place again
                if i not in self.final and i not in self.cancelled and not self.inflight.get(i):
                    if i not in self.pending:
                        self.pending.appendleft(i)
                    self.attempts.setdefault(i, a)

    def _store_items(self, w: Worker, bid: str, info: dict[str, Any], buffers: tuple[Any, ...]) -> None:
        """Hand a RESULT's outcomes to the Executor (if any) and to the recorder, which
        writes them to the job folder; the worker is acknowledged once they are durable."""
        pickles = memoryview(buffers[0]).cast("B")
        logs = memoryview(buffers[1]).cast("B")
        nbytes = sum(memoryview(b).nbytes for b in buffers)
        self.stats["result_bytes"] += nbytes
        groups: list[tuple[memoryview, list[Any]]] = []
        ppos, opos = 0, 2
        for plen, noob in info.get("groups", []):
            groups.append((pickles[ppos : ppos + plen], list(buffers[opos : opos + noob])))
            ppos, opos = ppos + plen, opos + noob
        items = info["items"]
        if items and info.get("seconds"):
            per_task = float(info["seconds"]) / len(items)
            self.mean_s = per_task if not self.n_measured else 0.7 * self.mean_s + 0.3 * per_task
            self.n_measured += len(items)
        if items:  # batches are sized to bring back at most placement.BATCH_BYTES
            per_task = nbytes / len(items)
            mean = self.result_bytes_per_task
            self.result_bytes_per_task = per_task if not mean else 0.7 * mean + 0.3 * per_task
        lpos = 0
        rows: dict[int, list[tuple[Any, ...]]] = {}  # group -> rows to write
        for index, attempt, status, group, item, t0, t1, rss, log_len in items:
            index, attempt, status = int(index), int(attempt), Outcome(int(status))
            log_bytes = bytes(logs[lpos : lpos + log_len])
            lpos += log_len
            if index in self.final or index in self.cancelled or not 0 <= index < self.n:
                self.stats["duplicates"] += 1
                continue
            if status is Outcome.REQUEUE:
                self._requeue(index)
                continue
            if status is Outcome.LOST:
                self.lost_count[index] = self.lost_count.get(index, 0) + 1
                if self.lost_count[index] <= self.retries:
                    self.attempts[index] = attempt + 1
                    self._requeue(index)
                    continue
                self._write_lost(w, index, attempt, groups[group][0], log_bytes, t0, t1)
                continue
            seed = (int(self.seed) + index) if self.seed is not None else 0
            rows.setdefault(int(group), []).append(
                (index, status is Outcome.OK, int(item), attempt, log_bytes, t0, t1, int(rss), seed))
            self._finalise(index)
        if self.on_outcome is not None:
            self._hand_out(groups, rows)
        if w.writer is None:
            if not w.wid:
                w.wid = f"peer-x-{w.peer_id[:8]}-{self.short}"
                self._write_worker_info(w)
            w.writer = GroupWriter(self.store, w.wid)
        parts = [(groups[g][0], groups[g][1], group_rows) for g, group_rows in rows.items()]
        if not self.to_record:
            self.first_to_record = time.monotonic()
        self.to_record.append((w.writer, parts, (w, bid), buffers))

    def _hand_out(self, groups: list[tuple[memoryview, list[Any]]],
                  rows: dict[int, list[tuple[Any, ...]]]) -> None:  # fmt: skip
        """Give the Executor each finished task's value from the buffers just received
        (no copy; the buffers are not reused while the values hold them). A value that
        cannot be unpickled here is left to the Executor's reading of the job folder."""
        from ..folder import serial

        for group, group_rows in rows.items():
            pickled, oob = groups[group]
            try:
                values = serial.loads(pickled, oob)
            except Exception as exc:
                log.debug("a result is read back from the job folder: %s", exc)
                continue
            for index, ok, item, *_rest, seed in group_rows:
                self.outcomes.append((index, ok, values[item], seed))

    def _deliver_outcomes(self) -> None:
        """Hand the values of this turn to the Executor, once the turn's lock is released and
        its frames are sent: the thread a value wakes may then place its next task at once."""
        outcomes, self.outcomes = self.outcomes, []
        for index, ok, value, seed in outcomes:
            try:
                self.on_outcome(index, ok, value, seed)
            except Exception:
                log.exception("the Executor's result callback failed")

    def _write_lost(self, w: Worker, index: int, attempt: int, pickled: Any, log_bytes: bytes,
                    t0: float, t1: float) -> None:  # fmt: skip
        from ..folder.records import Kind, make_record

        try:
            err = pickle.loads(pickled)  # [a small dict] the worker daemon made (authenticated)
            message = str(err[0].get("message", "")) if isinstance(err, list) and err else ""
        except Exception:
            message = ""
        tail = "\n".join(log_bytes.decode("utf-8", "replace").strip().splitlines()[-8:])
        why = (f"{message or 'its process died'} on {w.host}"
               f"{'' if self.retries == 0 else f' ({self.retries + 1} times)'}")  # fmt: skip
        if tail:
            why += f"; its last output:\n{tail}"
        with self.store.locked_queue() as q:
            q.setdefault("lost_reason", {})[str(index)] = why
            self.store.append_control([make_record(Kind.LOST, index, attempt, t_start=t0, t_end=t1)])
        self._finalise(index)

    def _finalise(self, index: int) -> None:
        self.final.add(index)
        self.entries.pop(index, None)
        self.prepared.pop(index, None)
        self.reasons.pop(index, None)
        with self.lock:
            self.running_view.pop(index, None)
        for bid in list(self.inflight.pop(index, ())):
            b = self.batches.get(bid)
            if b is not None and all(i in self.final or i in self.cancelled for i in b.indices):
                self._withdraw(b)  # a copy elsewhere that nobody needs any more

    def _requeue(self, index: int) -> None:
        if index not in self.pending:
            self.pending.appendleft(index)

    def _fail_tasks(self, indices: list[int], exc: BaseException) -> None:
        """Tasks that cannot even be sent (their inputs cannot be pickled here)."""
        from ..folder.journal import OutcomeWriter
        from ..run.jobrun import _describe_error

        writer = OutcomeWriter(self.store, f"peer-controller-{self.short}")
        try:
            for i in indices:
                err = _describe_error(exc, socket.gethostname(), i, (self.seed or 0) + i)
                err["message"] = f"the task could not be sent to a peer: {err['message']}"
                writer.write(i, ok=False, pickled=pickle.dumps(err, protocol=5), sync=True)
                self._finalise(i)
        finally:
            writer.close()
        self.store.notify()

    # -- placing --------------------------------------------------------------------------
    def _place(self, now: float) -> None:
        for b in [b for b in self.batches.values() if b.standing and not b.withdrawn]:
            if self.pending:
                # admitted: the tasks go now; not yet answered: they ride on that ASK
                self._fill_standing(b, send=bool(b.accepted))
        if not self.pending:
            self._stand(now)
            return
        ready = [w for w in self.workers.values() if w.state == "ready" and w.usable(self.settings)]
        if not ready:
            return
        s = self.settings
        total_slots = sum(max(1, w.info.announcement.slots // s.cores) for w in ready)
        # While other workers are still connecting, hold no more than fits at once here:
        # queueing behind a busy slot would be a loss if a free worker appears a moment later.
        depth = 1 if any(w.state in ("connecting", "handshake") for w in self.workers.values()) else 2
        while self.pending:
            best = choose_worker(ready, s, self.local_addresses, depth, now)
            if best is None:
                return
            k = batch_size(s, best, total_slots, len(self.pending), self.mean_s, self.n_measured,
                           self.result_bytes_per_task)  # fmt: skip
            self._ask(best, k, now)

    def _fold_standing(self, w: Worker) -> Standing | None:
        """For a TASK about to go to ``w``: the standing ASK :meth:`_stand` would send next,
        made now to ride inside the TASK, if ``w`` takes folded frames and is the worker
        :meth:`_stand` would ask (short tasks, nothing pending). Its ACCEPT then comes back
        inside the RESULT: two frames a task instead of four."""
        peer = w.conn.peer if w.conn is not None else None
        if peer is None or "fold" not in peer.caps or self.pending or not self._short():
            return None
        now = time.monotonic()
        if self._standing_worker(now) is not w:
            return None
        return self._new_standing(w, now)

    def _short(self) -> bool:
        """Whether the tasks are shorter than a round trip (as measured so far)."""
        return self.n_measured > 0 and self.mean_s < _SHORT_S

    def _standing_worker(self, now: float) -> Worker | None:
        """The worker an open stream job (an Executor) asks ahead, or None if it should not."""
        if not self.stream or self.closed or now < self.standing_after:
            return None
        if any(b.standing for b in self.batches.values()):
            return None
        return choose_standing(self.workers.values(), self.settings, self.local_addresses, self._short(), now)

    def _new_standing(self, w: Worker, now: float) -> Standing:
        s = self.settings
        self._seq += 1
        b = Batch(f"{self.short}-{self._seq}", w, [], [], now, standing=True)
        self.batches[b.bid] = b
        w.batches[b.bid] = b
        return Standing(b, Ask(b.bid, mem_bytes=s.mem_bytes, time_s=s.time_s, cores=s.cores))

    def _stand(self, now: float) -> None:
        """An open stream job (an Executor) with nothing to place: ask one worker ahead, so
        the next task skips a round trip. The worker lets another controller have the slot
        if this admission is not used within moments (``admission._STALE_RESERVATION_S``)."""
        # Tasks shorter than a round trip: ask where the last one runs. The worker holds the
        # ASK and admits it as the task ends, its ACCEPT leaving with the RESULT, and no
        # other worker is woken for it (with ``fold`` that ASK rode inside the TASK, see
        # _fold_standing). Longer tasks: ask an idle worker.
        best = self._standing_worker(now)
        if best is None:
            return
        nxt = self._new_standing(best, now)
        if not self._send(best, nxt.ask):
            self._forget(nxt.batch)

    def _ask(self, w: Worker, k: int, now: float) -> None:
        indices: list[int] = []
        while self.pending and len(indices) < k:
            i = self.pending.popleft()
            if i in self.final or i in self.cancelled:
                continue
            indices.append(i)
        if not indices:
            return
        self._seq += 1
        bid = f"{self.short}-{self._seq}"
        b = Batch(bid, w, indices, [self.attempts.get(i, 0) for i in indices], now)
        s = self.settings
        ask = Ask(bid, mem_bytes=s.mem_bytes, time_s=s.time_s * len(indices), cores=s.cores)
        self.batches[bid] = b
        w.batches[bid] = b
        for i in indices:
            self.inflight.setdefault(i, set()).add(bid)
        if not self._send(w, ask):
            self._unplace(b, requeue_front=True)
        self.stats["asks"] += 1

    def _encode(self, w: Worker, b: Batch) -> tuple[dict[str, Any], list[Any]]:
        """The TASK of a batch (see :meth:`TaskEncoder.encode`)."""
        prepared = self.prepared.get(b.indices[0]) if len(b.indices) == 1 else None
        peer = w.conn.peer if w.conn is not None else None
        job_part = peer is not None and "job-part" in peer.caps
        return self.encoder.encode(b.indices, b.attempts, prepared, self.entries, w.sent_fns, job_part)

    def _unplace(self, b: Batch, *, requeue_front: bool, resubmit: bool = False) -> None:
        """Take a batch back from its worker; its unfinished tasks wait to be placed again."""
        self._forget(b)
        back = []
        for i in b.indices:
            if i in self.final or i in self.cancelled or self.inflight.get(i):
                continue
            if resubmit:
                self.resubmits[i] = self.resubmits.get(i, 0) + 1
                if self.resubmits[i] > MAX_RESUBMITS:
                    self._write_gone(i, b.worker)
                    continue
            back.append(i)
        for i in reversed(back):
            if i not in self.pending:
                if requeue_front:
                    self.pending.appendleft(i)
                else:
                    self.pending.append(i)

    def _write_gone(self, index: int, w: Worker) -> None:
        from ..folder.records import Kind, make_record

        with self.store.locked_queue() as q:
            q.setdefault("lost_reason", {})[str(index)] = (
                f"its worker vanished {MAX_RESUBMITS + 1} times (last: {w.host}); given up")
            self.store.append_control([make_record(Kind.LOST, index, self.attempts.get(index, 0),
                                                   t_end=time.time())])  # fmt: skip
        self._finalise(index)
        self.store.notify()

    def _forget(self, b: Batch) -> None:
        self.batches.pop(b.bid, None)
        b.worker.batches.pop(b.bid, None)
        with self.lock:
            for i in b.indices:
                bids = self.inflight.get(i)
                if bids is not None:
                    bids.discard(b.bid)
                    if not bids:
                        del self.inflight[i]
                        self.running_view.pop(i, None)

    def _withdraw(self, b: Batch) -> None:
        """Take a batch's tasks back (they are done elsewhere, cancelled, or go elsewhere).

        A batch already sent (or admitted) is cancelled at its worker. An ASK still
        unanswered is not (an ACCEPT may be on its way: the protocol then refuses a
        CANCEL that crossed it); the batch stays, empty, until the answer comes.
        """
        if b.sent or b.accepted:
            self._send(b.worker, Cancel(b.bid))
            self._forget(b)
            return
        tasks = b.indices
        self._forget(b)
        b.withdrawn, b.indices, b.attempts = True, [], []
        self.batches[b.bid] = b
        b.worker.batches[b.bid] = b
        del tasks

    # -- timers -------------------------------------------------------------------------
    def _show(self, now: float) -> None:
        """What runs, and the note, for other processes (``elsewhere status`` of a job whose
        controller runs elsewhere): ``peer-running.json`` in the job folder, when it changed."""
        self._last_shown = now
        with self.lock:
            shown = {"running": {str(i): list(v) for i, v in self.running_view.items()}, "note": self.note}
        if shown == self._shown:
            return
        self._shown = shown
        path = self.store.path / RUNNING_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps({**shown, "pid": os.getpid()}))
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("cannot write %s: %s", path, exc)

    def _timers(self, now: float) -> None:
        s = self.settings
        spare = any(w.state == "ready" and w.usable(self.settings) and not w.batches for w in self.workers.values())
        for b in list(self.batches.values()):
            w = b.worker
            if b.standing:
                if b.accepted and now - b.accepted > 1.0:  # unused: give the slot back a while
                    self._withdraw(b)
                    self.standing_after = now + 1.0
                continue
            if not b.sent:
                # Not admitted yet: it waits behind busy slots there. Move it when a worker
                # sits idle (soon), or when it waited too long anyway.
                patience = 0.25 if spare else s.start_timeout_s
                if now - b.asked > patience and (spare or now - b.asked > s.start_timeout_s) \
                        and not b.withdrawn and len(self.workers) > 1:
                    tasks = list(b.indices)
                    self._withdraw(b)  # not admitted in time: try elsewhere
                    for i in reversed(tasks):
                        if i not in self.final and i not in self.cancelled:
                            self._requeue(i)
                    w.busy_until = now + 1.0
                continue
            if b.copied:
                continue
            expected = s.time_s * len(b.indices) if s.time_s else 0.0
            if expected:
                overdue = now - b.sent > 2 * expected + 5.0
            else:
                overdue = self.n_measured > 0 and now - b.sent > max(30.0, 20 * self.mean_s * len(b.indices))
            if overdue and spare:
                b.copied = True
                self.stats["copies"] += 1
                log.info("batch %s on %s is overdue: running it elsewhere too", b.bid, w.host)
                for i in reversed(b.indices):
                    if i not in self.final and i not in self.cancelled and i not in self.pending:
                        self.pending.appendleft(i)

    def _send_acks(self, *, wait: bool = False) -> None:
        """Acknowledge the results the recorder made durable (all of them, with ``wait``);
        their buffers may then take the next results (once nothing else holds them)."""
        if self.recorder is not None and self.to_record and (
                wait or time.monotonic() - self.first_to_record >= _ACK_S):  # fmt: skip
            # handed over every few milliseconds, not per result: each hand-over wakes a thread
            self.recorder.record_many(self.to_record)
            self.to_record = []
        if wait and self.recorder is not None:
            self.recorder.wait_idle()
        while True:
            try:
                acks, buffers = self.durable.get_nowait()
            except queue.Empty:
                return
            by_worker: dict[Worker, list[str]] = {}
            for w, bid in acks:
                by_worker.setdefault(w, []).append(bid)
            for w, bids in by_worker.items():
                peer = w.conn.peer if w.conn is not None else None
                if peer is not None and "ack-many" in peer.caps:  # one frame for them all
                    for i in range(0, len(bids), MAX_ACKS):
                        self._send(w, Ack(bids[i], tuple(bids[i + 1 : i + MAX_ACKS])), flush=False)
                else:
                    for bid in bids:
                        self._send(w, Ack(bid), flush=False)  # they leave with the next frame
            for buf in buffers:
                self.buffers.free(buf)

    # -- the end -----------------------------------------------------------------------
    def _close_all(self) -> None:
        if self.recorder is not None:
            if self.to_record:
                self.recorder.record_many(self.to_record)
                self.to_record = []
            self.recorder.stop()
            self._send_acks()
        for w in list(self.workers.values()):
            if w.state == "ready":
                with contextlib.suppress(Exception):
                    self._send(w, Bye("done"))
            self._drop_connection(w)
            if w.writer is not None:
                w.writer.close()
                w.writer = None
        self._stop.set()
        if self.announcer is not None:
            self.announcer.stop()
        if self.listener is not None:
            self.listener.stop()
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(2.0)
        self.encoder.close()
        with self.lock:
            self.running_view.clear()
        for s in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        self.sel.close()

