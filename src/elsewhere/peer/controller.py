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

Where each part of the controller is (each a mixin of
:class:`~.controlstate.ControllerState`, which holds the state they share):

- here: the user's side (start, put, cancel, stop, from any thread) and the loop;
- :mod:`.controlstate`: the state, and the bookkeeping of the job's tasks;
- :mod:`.links`: the connections to workers, and the frames they send;
- :mod:`.batching`: placing and batching, ASKs (standing ones too), TASKs sent;
- :mod:`.results`: RESULTs to the Executor and the job folder, ACKs once durable;
- :mod:`.retries`: timers, batches taken back, tasks run twice or written off;
- :mod:`.notes`: the note, ``peer-running.json``, the counters.

The settings, the records of workers and batches and the pure choices of placing
are in :mod:`.placement`; the pickling of a batch into its TASK is a
:class:`~.encoder.TaskEncoder`; results are made durable by the
:class:`~.recorder.Recorder`; sockets come from :mod:`.net`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import selectors
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .announce import Announcement, PeerState
from .batching import Batching
from .ciphers import offered_ciphers
from .controlstate import ControllerState
from .discovery import Announcer, Listener
from .links import Links
from .messages import Bye
from .notes import RUNNING_FILE, Notes
from .peertable import PeerInfo
from .placement import ControllerSettings, Worker, local_addresses
from .recorder import Recorder
from .results import _ACK_S, Results
from .retries import MAX_RESUBMITS, Retries

if TYPE_CHECKING:
    from ..folder.handle import JobHandle as Job

__all__ = ["MAX_RESUBMITS", "RUNNING_FILE", "Controller"]

log = logging.getLogger(__name__)

_PUT_WAIT_S = 0.002
"""How long ``put`` waits for the loop to finish its turn before leaving the task to it."""
_SPIN_LEAST_S = 0.0005
"""A waiting caller polls for twice the tasks' mean time and this (at most ``spin_s``)."""


class Controller(Links, Batching, Results, Retries, Notes, ControllerState):
    """Places the tasks of one job on peers and stores their results (see the module doc)."""

    def __init__(self, job: Job, settings: ControllerSettings) -> None:
        self.job = job  # the only use of the job: every part works on its store
        super().__init__(job.store, settings)

    # -- the user's side (any thread) ----------------------------------------------------
    def start(self) -> Controller:
        """Start discovery and the controller thread; returns self."""
        s = self.settings
        group = s.key.group if s.key is not None else ""
        self.local_addresses = local_addresses()
        self.listener = Listener(s.key, s.discovery, carry_over=True).start()
        address = s.discovery.for_key(s.key).interface or "0.0.0.0"
        encrypt = s.encrypt and s.key is not None  # then nothing of the job in the clear
        ann = Announcement(self.peer_id, group, address, 0, self.identity.user, self.identity.host,
                           PeerState.CONTROLLER, task=None if encrypt else str(self.meta.get("name", ""))[:200],
                           encrypt=encrypt, ciphers=offered_ciphers() if s.key is not None else ())  # fmt: skip
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

    def wait_for(self, index: int, done: Callable[[], bool], deadline: float | None) -> None:
        """The caller's thread waits for task ``index`` (an Executor's ``result()``).

        While the tasks are short, the caller first polls the connection the task went on
        without sleeping, for about twice a task's time (at most ``spin_s``), reads what
        comes itself and hands it out: on two shared cores, a thread woken on another core
        costs more than the whole frame (measured: a caller that sleeps on the connection
        instead gains nothing over the loop's thread waking it). The loop does not watch
        that connection meanwhile. Returns once ``done()``, once the spin or ``deadline``
        (monotonic) is over, or at once when it cannot help: the caller then waits as usual.
        """
        if not self.spin_s or self._thread is None or threading.current_thread() is self._thread:
            return
        poller = select.poll()
        until = None
        while not done():
            if not self._state.acquire(blocking=False):
                return  # the loop is at work: it reads the result itself
            try:
                w = self._helping(index)
                if w is None:
                    return
                sock = w.sock
                assert sock is not None
                fd = sock.fileno()  # (polled by number: the loop may close it meanwhile)
                if until is None:
                    until = time.monotonic() + min(self.spin_s, 2 * self.mean_s + _SPIN_LEAST_S)
                    if deadline is not None:
                        until = min(until, deadline)
                try:
                    self.sel.unregister(sock)
                except (KeyError, ValueError):
                    return  # another caller's thread reads it now
            finally:
                self._state.release()
            readable: list[Any] = []
            try:
                poller.register(fd, select.POLLIN)
                try:
                    readable = _spin(poller, until)
                finally:
                    poller.unregister(fd)
            finally:
                with self._state:
                    try:
                        if readable and w.sock is sock:
                            self._read_for_caller(w)
                    finally:
                        # watched again once read (else the loop would wake for what was
                        # read), unless the loop dropped it meanwhile, and closed it
                        if w.sock is sock:
                            self.sel.register(sock, w.events or selectors.EVENT_READ, ("worker", w))
            if self.outcomes:
                self._deliver_outcomes()
            if not readable:
                return

    def _read_for_caller(self, w: Worker) -> None:
        """A turn of the loop on ``w``'s connection, in a waiting caller's thread."""
        self.stats["caller_reads"] += 1
        self._corked = True
        try:
            self._on_readable(w, selectors.EVENT_READ)
            self._place(time.monotonic())
        finally:
            self._corked = False
        self._flush_unflushed()

    def _helping(self, index: int) -> Worker | None:
        """The worker whose connection the caller may read for task ``index`` (see
        :meth:`wait_for`): the one batch it is in was sent there, its tasks are short, and
        nothing waits to be written to it."""
        if self._loop_ended or not self._short():
            return None
        bids = self.inflight.get(index)
        if bids is None or len(bids) != 1:
            return None
        b = self.batches.get(next(iter(bids)))
        if b is None or not b.sent:
            return None
        w = b.worker
        if w.state != "ready" or w.sock is None or w.events != selectors.EVENT_READ:
            return None
        return w

    def cancel_task(self, index: int) -> None:
        """Drop task ``index``: it is not placed again, and its result is not kept."""
        self._command("cancel_task", index)

    def withdraw(self, index: int) -> bool:
        """Cancel task ``index`` if no worker has it yet (an Executor's ``cancel``): True if
        it will not run, False if it was sent (it runs on) or has ended."""
        with self._state:
            if index in self.inflight or index in self.final:
                return False
            self.cancelled.add(index)  # a put still on its way is dropped when it comes
            with contextlib.suppress(ValueError):
                self.pending.remove(index)
            self.entries.pop(index, None)
            self.prepared.pop(index, None)
            return True

    def cancel(self) -> None:
        """Cancel every task and stop."""
        # A flag, not a queued command: a ``stop()`` that follows can end the loop in a turn
        # that has read no command yet, and the workers must still be told to drop their tasks.
        self._cancelled_job = True
        self.waker.wake()

    def refresh_queue(self) -> None:
        """Re-read the queue (retries added by ``job.retry()``, a closed stream)."""
        self._command("queue")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (results received so far are stored and acknowledged)."""
        self._stop.set()
        self._command("stop")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _command(self, *cmd: Any) -> None:
        self.commands.put(cmd)
        self.waker.wake()

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
                    self._cancel_sent(b)
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

    def _done(self) -> bool:
        if self.closed:
            for b in [b for b in self.batches.values() if b.standing and not b.withdrawn]:
                self._withdraw(b)  # no next task will come
        busy = any(not (b.withdrawn or b.standing) for b in self.batches.values())
        if not self.closed or self.pending or busy:
            return False
        # (the gaps of the final runs, not every task: this is asked at every turn)
        cancelled = self.cancelled
        return all(i in cancelled for a, b in self.final.gaps(0, self.n) for i in range(a, b))

    def _on_wake(self) -> None:
        self.waker.drain()
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
                self.waker.wake()

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
        self.waker.close()
        self.sel.close()


def _spin(poller: select.poll, until: float) -> list[Any]:
    """Poll without sleeping until ``until`` (monotonic), yielding the core between looks;
    what became ready, or [] once the time is up."""
    while True:
        ready = poller.poll(0)
        if ready or time.monotonic() >= until:
            return ready
        os.sched_yield()
