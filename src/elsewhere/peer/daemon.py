"""The peer worker daemon (``elsewhere peer worker``, FieldTrip's peerworker).

One process offers this machine's slots to the group. Who talks to whom::

    controllers ==TCP==> [listening socket] --accept--> Peer (Connection + pump)
                                                          |  ASK   -> refuse at once (reason), or hold
                                                          |  held ASKs -> ACCEPT when a slot frees,
                                                          |               fairest controller first
                                                          |  TASK  -> Run on a child process
                                                          |  ACK   -> forget the result
    announcer thread  <-- state changes (coalesced)       |
    listener thread   --> a new controller appears: announce at once
    child processes  <==unix socket==> "run" / "results" (see child.py)

Everything but the two discovery threads runs in one selector loop: no
thread per connection or per task, no process per task. The daemon never
unpickles anything; it moves authenticated bytes to a child and back. A
child that crashes, or that is killed for running past the time or memory
its task was admitted under, is replaced; the daemon carries on.

Results wait in memory until their controller acknowledges them (ACK); a
controller that reconnects (same peer id) gets every unacknowledged result
again. Ctrl-C or SIGTERM drains: no new work is admitted, running batches
finish and are delivered; a second Ctrl-C hands the running batches back
(their tasks go back to their controllers to run elsewhere) and exits.

What it is told to offer is a :class:`~.options.WorkerOptions`; the connections
and the ASKs held or admitted are kept in :mod:`.admission`, the batches and
their RESULTs in :mod:`.runs`, the children in :mod:`.children`.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import math
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from typing import Any

from ..util.errors import ConfigError, PeerError, ProtocolError
from .access import same_user
from .admission import Admission, Peer
from .announce import Announcement, PeerState, new_peer_id
from .child import Outcome
from .children import ChildProcess, describe_exit, read_capture, tree_rss
from .discovery import Announcer, Listener
from .fairshare import FairShare
from .keys import LOOPBACK_HOST, GroupKey
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
    Pong,
    Refuse,
    RefuseReason,
    Result,
    Task,
)
from .options import WorkerOptions, machine_memory
from .runs import (
    Done,
    Run,
    build_result,
    build_run_message,
    cap_result,
    fill_unfinished,
    job_context,
    take_results,
)
from .stream import Closed, SharedBuffers
from .wire import Connection, HandshakeComplete, Limits, Received, Role

__all__ = ["PeerWorker"]

log = logging.getLogger(__name__)

_MAX_PEERS = 256
_HANDSHAKE_S = 10.0
_ANNOUNCE_EVERY_S = 0.05  # coalesce state changes into at most 20 announcements a second
_MEM_CHECK_S = 0.25
_MAX_STARTING = max(1, (os.cpu_count() or 1) // 2)
"""Children started at once to replace others (each start keeps a core busy a while)."""
_TICK_S = 0.1
_CHILD_FNS = 16  # function and job parts a child keeps unpickled (the daemon says which go)


# ---------------------------------------------------------------- the daemon


class PeerWorker:
    """The worker daemon: see the module docstring. ``serve()`` runs it until it exits."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.key = options.key
        self.peer_id = new_peer_id()
        self.identity = Identity(self.peer_id, options.user[:256], options.host[:256])
        self.fair = FairShare(options.half_life_s, enabled=options.fair_share)
        self.pool = SharedBuffers()
        total = machine_memory()  # once: reading it costs ~100 us, and it does not change
        self.mem_total = min(total, options.memavail) if options.memavail is not None else total
        self.sel = selectors.DefaultSelector()
        self.peers: set[Peer] = set()
        self.by_controller: dict[str, Peer] = {}
        self._corked: set[Peer] | None = None  # peers whose frames wait to leave together
        self._folding: tuple[Peer, list[str]] | None = None  # ACCEPTs for the RESULT being made
        self.admission = Admission(self.fair)  # held ASKs, and admissions until their TASK
        self.queued: collections.deque[Run] = collections.deque()  # TASK received, no child free
        self.running: dict[int, Run] = {}  # seq -> run on a child
        self.children: list[ChildProcess] = []
        self.unacked: dict[str, dict[str, Done]] = {}
        self.gone_since: dict[str, float] = {}
        self._last_prune = 0.0
        self.stats: collections.Counter[str] = collections.Counter()
        self.started = time.monotonic()
        self.last_busy = self.started
        self.tasks_done = 0
        self.draining: str | None = None
        self.hand_back = False
        self.stopping = False
        self._seq = 0
        self._announce_due = True
        self._last_announce = 0.0
        self._poll_until = 0.0  # see WorkerOptions.poll_s
        self._last_tick = 0.0
        self._last_stats = 0.0
        self._last_mem_check = 0.0
        self._signals = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._capture_fds: list[int] = []
        self.listen_sock: socket.socket | None = None
        self.announcers: list[Announcer] = []  # one per group served
        self.listener: Listener | None = None  # one for every group served
        self._watch_thread: threading.Thread | None = None
        self.address: tuple[str, int] = ("", 0)
        self._ready = threading.Event()

    # -- set-up ------------------------------------------------------------------
    def start(self) -> tuple[str, int]:
        """Bind, start discovery and the first child; returns the TCP address."""
        opts = self.options
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((opts.bind_address(), opts.port))
        except OSError as exc:
            sock.close()
            where = f"{opts.bind_address()}:{opts.port}" if opts.port else opts.bind_address()
            hint = {errno.EADDRINUSE: "the port is taken (another worker? --tcp-port chooses another, 0 any)",
                    errno.EADDRNOTAVAIL: "it must be an address of this machine (`ip -4 addr` lists them)",
                    errno.EACCES: "ports below 1024 need privileges (--tcp-port 0: any free port)"}  # fmt: skip
            raise ConfigError(f"cannot listen for tasks on {where} ({exc.strerror})"
                              + (f": {hint[exc.errno]}" if exc.errno in hint else "")) from exc  # fmt: skip
        sock.listen(128)
        sock.setblocking(False)
        self.listen_sock = sock
        self.address = (opts.bind_address(), sock.getsockname()[1])
        self.sel.register(sock, selectors.EVENT_READ, ("listen", None))
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._spawn_child()
        announced = self.address[0]
        if announced == "0.0.0.0":
            announced = opts.discovery.interface or _primary_address()
        served: list[GroupKey | None] = [*opts.group_keys()] or [None]
        for key in served:  # each group served hears of this worker
            ann = Announcement(
                self.peer_id, key.group if key else "", announced, self.address[1],
                opts.user[:256], opts.host[:256], PeerState.IDLE, opts.slots, opts.slots,
                self._mem_offer(), min(opts.timavail, opts.maxtime),
            )  # fmt: skip
            self.announcers.append(Announcer(ann, key, opts.discovery).start())
        if opts.listen_for_controllers:  # one listener for every group served
            try:
                self.listener = Listener(self.key, opts.discovery, more_keys=opts.more_keys).start()
            except OSError as exc:  # e.g. static peers on a port another peer here holds
                log.warning("not listening for controllers (%s); announcing anyway", exc)
            else:
                self._watch_thread = threading.Thread(target=self._watch_controllers,
                                                      name="elsewhere-peer-watch", daemon=True)  # fmt: skip
                self._watch_thread.start()
        self._ready.set()
        group = (", ".join(f"{k.group!r} (key {k.fingerprint})" for k in opts.group_keys())
                 or "(loopback only)")  # fmt: skip
        log.info("peer worker %s on %s:%d, group %s, %d slot(s), %s", self.peer_id[:8],
                 self.address[0], self.address[1], group,
                 opts.slots, "fair share" if opts.fair_share else "first come, first served")  # fmt: skip
        return self.address

    def wait_ready(self, timeout: float) -> bool:
        """Wait until :meth:`start` has bound its socket (for callers in another thread)."""
        return self._ready.wait(timeout)

    def _watch_controllers(self) -> None:
        """Announce at once when a new controller appears, so it finds us in milliseconds."""
        listener = self.listener
        assert listener is not None
        known: set[str] = set()

        def controllers(peers: list[Any]) -> set[str]:
            return {p.peer_id for p in peers if p.announcement.state is PeerState.CONTROLLER}

        def new(peers: list[Any]) -> bool:
            return bool(controllers(peers) - known) or self.stopping

        while not self.stopping:
            if listener.wait_for(new, timeout=1.0) and not self.stopping:
                known.clear()
                known.update(controllers(listener.peers()))
                for announcer in self.announcers:
                    with contextlib.suppress(Exception):
                        announcer.update_state()

    # -- the loop ------------------------------------------------------------------
    def serve(self, *, install_signals: bool = True) -> int:
        """Run until drained or stopped; returns an exit status."""
        if self.listen_sock is None:
            self.start()
        if install_signals and threading.current_thread() is threading.main_thread():
            self._install_signals()
        poll_s = self.options.poll_s
        try:
            while True:
                now = time.monotonic()
                if self._finished(now):
                    break
                polling = now < self._poll_until
                events = self.sel.select(0.0 if polling else self._timeout())
                if not events and polling:
                    self.stats["busy_polls"] += 1
                    os.sched_yield()  # a process that wants this core has it first
                for key, mask in events:
                    kind, obj = key.data
                    if kind == "peer":
                        self._poll_until = now + poll_s
                        self._on_peer(obj, mask)
                    elif kind == "child":
                        self._poll_until = now + poll_s
                        self._on_child(obj)
                    elif kind == "listen":
                        self._accept()
                    else:
                        self._on_wake()
                self._tick(time.monotonic())
        finally:
            self._shutdown()
        return 0

    def request_stop(self, *, hand_back: bool = False) -> None:
        """Drain (or, with ``hand_back``, hand running batches back) and exit. Thread-safe."""
        self._signals = max(self._signals + 1, 2 if hand_back else 1)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"s")

    def _install_signals(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            self._signals += 1
            with contextlib.suppress(OSError):
                self._wake_w.send(b"s")

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, handler)  # its terminal closed: drain, as for SIGTERM

    def _on_wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_r.recv(4096)
        if self._signals >= 2 and not self.hand_back:
            self.hand_back = True
            self._drain("stopping now: running batches are handed back")
            for run in list(self.running.values()):
                self._kill_run(run, Outcome.REQUEUE, "the worker was stopped")
            for run in list(self.queued):
                self.queued.remove(run)
                self._finish_unstarted(run)
        elif self._signals >= 1 and self.draining is None:
            self._drain("asked to stop: finishing the running tasks (Ctrl-C again hands them back)")

    def _timeout(self) -> float:
        return 0.0 if self._announce_due and time.monotonic() - self._last_announce >= _ANNOUNCE_EVERY_S else _TICK_S

    def _finished(self, now: float) -> bool:
        if self.draining is None:
            return False
        if self.running or self.queued or self.admission.reserved:
            return False
        if not self.unacked:
            return True
        # results nobody is connected to collect: give controllers a moment to return
        limit = 2.0 if self.hand_back else 10.0
        return now - self.last_busy > limit

    def _drain(self, why: str) -> None:
        if self.draining is None:
            log.info("draining: %s", why)
        elif why != self.draining:  # a second Ctrl-C: say that it was heard
            log.info("%s", why)
        self.draining = why
        for h in self.admission.take_held():
            self._refuse(h.peer, h.ask, RefuseReason.DRAINING, "the worker is stopping")
        self._announce_due = True

    # -- connections ------------------------------------------------------------------
    def _accept(self) -> None:
        assert self.listen_sock is not None
        for _ in range(64):
            try:
                sock, addr = self.listen_sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("accept failed: %s", exc)
                return
            self.stats["connections"] += 1
            if len(self.peers) >= _MAX_PEERS:
                sock.close()
                self.stats["connections_over_cap"] += 1
                continue
            if self.key is None and not _is_loopback(addr[0]):
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = Peer(sock, addr[0])
            peer.connect(Connection(Role.RESPONDER, self.key, self.identity, more_keys=self.options.more_keys,
                                    allocate=self.pool.allocator(peer)))  # fmt: skip
            self.peers.add(peer)
            self.sel.register(sock, selectors.EVENT_READ, ("peer", peer))

    def _on_peer(self, peer: Peer, mask: int) -> None:
        if peer.closed:
            return
        try:
            if mask & selectors.EVENT_READ:
                for event in peer.pump.read():
                    self._on_event(peer, event)
                    if peer.closed:
                        return
                if peer.pump.failed is not None:
                    raise peer.pump.failed
            self._flush(peer)
        except Closed:
            self._close(peer, "")
        except ProtocolError as exc:
            self.stats["protocol_errors"] += 1
            log.debug("peer %s: %s", peer.address, exc)
            with contextlib.suppress(OSError):
                peer.pump.flush()  # perhaps an ERROR frame for the peer
            self._close(peer, str(exc))
        except OSError as exc:
            self._close(peer, str(exc))

    def _flush(self, peer: Peer) -> None:
        if peer.closed:
            return
        try:
            done = peer.pump.flush()
        except OSError as exc:
            self._close(peer, str(exc))
            return
        events = selectors.EVENT_READ if done else selectors.EVENT_READ | selectors.EVENT_WRITE
        if peer.events != events:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.modify(peer.sock, events, ("peer", peer))
            peer.events = events

    def _close(self, peer: Peer, why: str) -> None:
        if peer.closed:
            return
        peer.closed = True
        self.peers.discard(peer)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(peer.sock)
        with contextlib.suppress(OSError):
            peer.sock.close()
        if why:
            log.debug("closed connection from %s: %s", peer.address, why)
        if peer.controller and self.by_controller.get(peer.controller) is peer:
            del self.by_controller[peer.controller]
            self.gone_since[peer.controller] = time.monotonic()
        self.admission.forget(peer)
        self.pool.reclaim(peer)  # buffers of a frame that never became a task
        self._announce_due = True
        self._admit()

    def _send(self, peer: Peer, message: Any, buffers: Any = ()) -> None:
        if peer.closed:
            return
        try:
            peer.conn.send(message, buffers)
        except PeerError as exc:
            log.debug("cannot send %s to %s: %s", type(message).__name__, peer.address, exc)
            return
        if self._corked is not None:
            self._corked.add(peer)
        else:
            self._flush(peer)

    def _refuse(self, peer: Peer, ask: Ask, reason: RefuseReason, detail: str) -> None:
        self.stats[f"refused_{reason.name.lower()}"] += 1
        self._send(peer, Refuse(ask.task_id, reason, detail[:1000]))

    # -- messages ----------------------------------------------------------------------
    def _on_event(self, peer: Peer, event: Any) -> None:
        if isinstance(event, HandshakeComplete):
            self._on_handshake(peer, event)
            return
        assert isinstance(event, Received)
        msg = event.message
        if isinstance(msg, Ask):
            self._on_ask(peer, msg)
        elif isinstance(msg, Task):
            self._on_task(peer, msg, event.buffers)
            nxt = msg.next_ask()  # a folded ASK: after the TASK, which takes its slot first
            if nxt is not None and not peer.closed:
                self._on_ask(peer, nxt)
        elif isinstance(msg, Ack):
            done = self.unacked.get(peer.controller, {})
            for task_id in (msg.task_id, *msg.more):
                entry = done.pop(task_id, None)
                if entry is not None:
                    self._forget_done(entry)
            if not done:
                self.unacked.pop(peer.controller, None)
        elif isinstance(msg, Cancel):
            self._on_cancel(peer, msg.task_id)
        elif isinstance(msg, Ping):
            self._send(peer, Pong(msg.token))
        elif isinstance(msg, (Bye, Error)):
            self._close(peer, "")

    def _on_handshake(self, peer: Peer, event: HandshakeComplete) -> None:
        self.stats["handshakes"] += 1
        g = event.peer
        peer.controller, peer.user, peer.host = g.peer_id, g.user, g.host
        peer.refusal = self.options.access.check(g.user, g.host, peer.address)
        if peer.refusal is None and self.key is None and not same_user(peer.sock):
            peer.refusal = "without a group key a worker serves only its own user"
        old = self.by_controller.get(g.peer_id)
        self.by_controller[g.peer_id] = peer
        self.gone_since.pop(g.peer_id, None)
        if old is not None and old is not peer:
            self._close(old, "replaced by a new connection of the same controller")
        for task_id, done in list(self.unacked.get(g.peer_id, {}).items()):
            self._send(peer, Result(task_id, done.info), done.buffers)

    def _on_ask(self, peer: Peer, ask: Ask) -> None:
        self.stats["asks"] += 1
        opts = self.options
        if peer.refusal is not None:
            self._refuse(peer, ask, RefuseReason.NOT_ALLOWED, peer.refusal)
        elif self.draining is not None:
            self._refuse(peer, ask, RefuseReason.DRAINING, "the worker is stopping")
        elif ask.cores > opts.slots:
            self._refuse(peer, ask, RefuseReason.BUSY,
                         f"the task needs {ask.cores} cores; this worker has {opts.slots}")  # fmt: skip
        elif ask.mem_bytes > self._mem_total():
            self._refuse(peer, ask, RefuseReason.MEMORY,
                         f"the task needs {ask.mem_bytes} bytes; this worker offers {self._mem_total()}")  # fmt: skip
        elif ask.time_s > self._time_offer(time.monotonic()):
            self._refuse(peer, ask, RefuseReason.TIME,
                         f"the task needs {ask.time_s:.0f} s; this worker offers "
                         f"{self._time_offer(time.monotonic()):.0f} s")  # fmt: skip
        elif self.admission.waiting(peer) >= 2 * opts.slots + 2:
            self._refuse(peer, ask, RefuseReason.BUSY, "too many requests waiting here")
        else:
            self.admission.hold(peer, ask, time.monotonic())
            self._admit()

    def _admit(self) -> None:
        """Accept waiting ASKs while slots and memory are free: fairest controller first."""
        if self.draining is not None:
            return
        now = time.monotonic()
        while self.admission.held:
            free_slots, free_mem = self._free(now)
            chosen = self.admission.choose(free_slots, free_mem, now)
            if chosen is None:
                return
            self._seq += 1
            run = Run(self._seq, chosen.peer.controller, chosen.ask.task_id, chosen.ask, {},
                       accepted=now)  # fmt: skip
            self.admission.reserve(chosen.peer, chosen.ask.task_id, run)
            self.stats["accepted"] += 1
            self._announce_due = True
            folding = self._folding
            if folding is not None and folding[0] is chosen.peer and len(folding[1]) < MAX_ACKS - 1:
                folding[1].append(chosen.ask.task_id)  # it leaves inside the RESULT being made
            else:
                self._send(chosen.peer, Accept(chosen.ask.task_id))

    def _on_task(self, peer: Peer, msg: Task, buffers: tuple[Any, ...]) -> None:
        run = self.admission.take(peer, msg.task_id)
        if run is None:  # accepted earlier, then withdrawn by us (connection replaced)
            self._seq += 1
            run = Run(self._seq, peer.controller, msg.task_id, Ask(msg.task_id), {})
        info = msg.info
        try:
            ntask = int(info["ntask"])
            nfn = int(info.get("nfn", 0))
            njp = int(info.get("njpart", 0))
            items = [[int(i), int(a)] for i, a in info["items"]]
            if not (ntask >= 1 and nfn >= 0 and njp >= 0 and ntask + nfn + njp == len(buffers) and items):
                raise ValueError("buffer counts do not match")
        except (KeyError, TypeError, ValueError) as exc:
            self._send(peer, Error("task", f"malformed TASK {msg.task_id!r}: {exc}"))
            self._close(peer, f"malformed TASK: {exc}")
            return
        digest = str(info.get("fn") or "")
        jdigest = str(info.get("jpart") or "")
        for buf in buffers[:ntask]:
            self.pool.claim(buf, run)
        # the function part and the job part: kept for later TASKs of this connection, as
        # plain bytes, not pooled memory
        for name, start, count, what in ((digest, ntask, nfn, "function"),
                                         (jdigest, ntask + nfn, njp, "job part")):  # fmt: skip
            if count:
                part = buffers[start : start + count]
                peer.fns[name] = tuple(bytes(b) if self.pool.fd_of(b) >= 0 else b for b in part)
                for buf in part:
                    self.pool.free(buf)
            elif name and name not in peer.fns:
                self._send(peer, Error("task", f"TASK {msg.task_id!r} names a {what} never sent"))
                self._close(peer, f"TASK without its {what}")
                return
        forget = info.get("forget")
        if isinstance(forget, list):  # the controller bounds what is kept for it
            for old in forget:
                if isinstance(old, str) and old not in (digest, jdigest):
                    peer.fns.pop(old, None)
        run.info = {"job": info.get("job") or {}, "diary": str(info.get("diary", "always")),
                    "items": items, "fn": digest, "jpart": jdigest,
                    "time_s": float(info.get("time_s") or 0.0)}  # fmt: skip
        run.context = job_context(peer.user, peer.host, run.info["job"])
        run.buffers = tuple(buffers[:ntask])
        run.fn_buffers = peer.fns.get(digest, ()) if digest else ()
        run.job_buffers = peer.fns.get(jdigest, ()) if jdigest else ()
        maxnum = self.options.maxnum
        if maxnum is not None:  # at most maxnum tasks run: the rest of a batch goes back
            ahead = sum(len(r.info["run"]) for r in (*self.running.values(), *self.queued))
            allowed = max(0, maxnum - self.tasks_done - ahead)
            run.info["run"] = items[:allowed]
            if self.tasks_done + ahead + len(run.info["run"]) >= maxnum:
                self._drain(f"{maxnum} tasks taken (maxnum)")
        else:
            run.info["run"] = items
        if self.hand_back or not run.info["run"]:
            self._finish_unstarted(run)
            return
        self.queued.append(run)
        self._dispatch()

    def _on_cancel(self, peer: Peer, task_id: str) -> None:
        if self.admission.withdraw(peer, task_id):
            self._announce_due = True
            self._admit()
            return
        for run in list(self.queued):
            if run.controller == peer.controller and run.task_id == task_id:
                self.queued.remove(run)
                self._free_buffers(run, None)
                self._admit()
                return
        for run in list(self.running.values()):
            if run.controller == peer.controller and run.task_id == task_id:
                self._kill_run(run, None, "cancelled by its controller")
                return

    # -- children ----------------------------------------------------------------------
    def _spawn_child(self) -> ChildProcess:
        cap = os.memfd_create("elsewhere-child-output", os.MFD_CLOEXEC)
        try:
            child = ChildProcess(self.options.python, cap)
        except OSError:
            os.close(cap)
            raise
        self.children.append(child)
        self.sel.register(child.sock, selectors.EVENT_READ, ("child", child))
        self.stats["children_started"] += 1
        return child

    def _dispatch(self) -> None:
        """Start queued runs on idle children; start children as needed."""
        while self.queued:
            run = self.queued[0]
            busy = sum(r.ask.cores for r in self.running.values())
            if busy and busy + run.ask.cores > self.options.slots:
                return  # over-admitted (an unused admission lost its slot): wait for one
            idle = [c for c in self.children if c.ready and c.run is None and not c.dead and not c.retiring]
            # a child that has the job's modules loaded first: the clean one stays clean
            child = next((c for c in sorted(idle, key=lambda c: not c.dirty) if self._may_run(c, run)), None)
            if child is None:
                self._replace_children(idle, busy)
                return
            self.queued.popleft()
            self._start(run, child)
        # Keep one child warm and clean (it has imported no user module: it can run any
        # job at once, another member's, or one after a module was edited).
        live = [c for c in self.children if not c.dead and not c.retiring]
        if (not any(c.run is None and not c.dirty for c in live) and len(live) <= self.options.slots
                and all(c.ready for c in live)):  # fmt: skip
            self._spawn_child()

    def _may_run(self, child: ChildProcess, run: Run) -> bool:
        """Whether ``child`` may run ``run``: a child that imported user modules runs only
        its job, or a later job of the same context (:func:`~.runs.job_context`: the same
        user, folder, ``sys.path`` and environment) while those modules' files, all in that
        job's folders, are unchanged; so no job ever runs code another left loaded, nor an
        old version of its own (a notebook's user who edits a module and maps again)."""
        if not child.dirty or child.job_id == run.info["job"].get("id"):
            return True
        if child.context != run.context or not child.user_files:
            return False
        folders = tuple(os.path.join(p, "") for p in (run.context[2], *run.context[3]) if p)
        for path, mtime_ns, size in child.user_files:
            if not path.startswith(folders):  # a job's own scratch or files= folder
                return False
            try:
                st = os.stat(path)
            except OSError:
                return False
            if st.st_mtime_ns != mtime_ns or st.st_size != size:
                return False
        return True

    def _replace_children(self, idle: list[ChildProcess], busy: int) -> None:
        """Queued runs wait and no idle child may run the first: start as many children as
        the free slots can use, several at once (one after the other, a job of eight tasks
        after another's would wait for eight interpreters in turn) but no more than half
        the machine's cores (a start is a core busy for a while: more at once delay the
        first that is ready), retiring idle children that imported another job's modules
        to make room."""
        want = min(len(self.queued), max(1, self.options.slots - busy), _MAX_STARTING)
        starting = sum(1 for c in self.children if not c.ready and not c.dead and not c.retiring)
        dirty = [c for c in idle if c.dirty]
        while starting < want:
            live = sum(1 for c in self.children if not c.dead and not c.retiring)
            if live >= self.options.slots + 1:
                if not dirty:
                    return
                self._retire(dirty.pop())  # a dirty idle child would run another job's code
                continue
            self._spawn_child()
            starting += 1

    def _start(self, run: Run, child: ChildProcess) -> None:
        now = time.monotonic()
        used = [d for d in (run.info["fn"], run.info.get("jpart")) if d]
        send_fn = bool(run.info["fn"]) and run.info["fn"] not in child.fns
        send_job = bool(run.info.get("jpart")) and run.info["jpart"] not in child.fns
        header, body, fds = build_run_message(run, send_fn, send_job, self.pool.fd_of,
                                              self._max_result(self.by_controller.get(run.controller)))  # fmt: skip
        for d in used:  # the child holds them now; the last to be dropped
            child.fns.pop(d, None)
            child.fns[d] = None
        forget = []
        while len(child.fns) > _CHILD_FNS:  # the child drops what it is told to, only
            oldest = next(iter(child.fns))
            del child.fns[oldest]
            forget.append(oldest)
        if forget:
            header["forget"] = forget
        if self.options.poll_s:
            header["poll"] = self.options.poll_s  # after the batch, the child polls this long too
        child.send(header, body, fds)
        child.run = run
        child.job_id = run.info["job"].get("id")
        run.child = child
        run.started = now
        self.running[run.seq] = run  # run.buffers stay referenced: their memfds must stay open
        self.fair.started(run.controller, run.seq, now)
        self.last_busy = now
        self._announce_due = True
        self._flush_child(child)

    @staticmethod
    def _max_result(peer: Peer | None) -> int:
        """The largest RESULT frame that can go to the controller on ``peer`` (None: not
        connected now; the default cap)."""
        return peer.conn.limits.max_body_bytes if peer is not None else Limits().max_body_bytes

    def _flush_child(self, child: ChildProcess) -> None:
        try:
            done = child.flush()
        except OSError:
            done = True  # it died: its socket will say so
        events = selectors.EVENT_READ if done else selectors.EVENT_READ | selectors.EVENT_WRITE
        if child.events != events:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.modify(child.sock, events, ("child", child))
            child.events = events

    def _on_child(self, child: ChildProcess) -> None:
        self._flush_child(child)
        try:
            messages, open_ = child.reader.read_available()
            for header, body, fds in messages:
                op = header.get("op")
                if op == "ready":
                    child.ready = True
                    child.base_rss = int(header.get("rss", 0))
                elif op == "results":
                    self._on_results(child, header, body, fds)
                else:
                    for fd in fds:
                        os.close(fd)
        except Exception as exc:  # a task may scribble on its socket: replace the child
            log.warning("child %d sent something unreadable (%s); replacing it", child.pid, exc)
            if child.run is not None:
                self._kill_run(child.run, Outcome.LOST, "its process sent garbage and was replaced")
            child.kill()
            return
        if not open_:
            self._child_died(child)
        elif messages:
            self._dispatch()

    def _on_results(self, child: ChildProcess, header: dict[str, Any], body: memoryview,
                    fds: list[int]) -> None:  # fmt: skip
        """A group of outcomes from a child (see :func:`~.runs.take_results`); the last
        one ends its run."""
        run = child.run
        kept = len(run.kept) if run is not None else 0
        take_results(child, header, body, fds)
        if run is not None and len(run.kept) > kept:
            self.stats["results_from_inputs"] += len(run.kept) - kept
        files = header.get("user_files")
        if isinstance(files, list):
            for f in files:
                with contextlib.suppress(TypeError, ValueError):
                    child.user_files.append((str(f[0]), int(f[1]), int(f[2])))
        with contextlib.suppress(TypeError, ValueError):
            self.stats["child_busy_polls"] += int(header.get("polls", 0))
        if header.get("last") and run is not None:
            child.dirty = bool(header.get("dirty"))
            if child.dirty and child.context is None:
                child.context = run.context
            child.run = None
            self._free_buffers(run, [int(i) for i in header.get("released", [])])
            self._complete(run)

    def _child_died(self, child: ChildProcess) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(child.sock)
        code = child.reap()
        run = child.run
        idx, since, log_off = child.current()
        child.close()
        self.children.remove(child)
        if run is not None:
            self.stats["child_deaths"] += 1
            self._free_buffers(run, None)  # its maps died with it
            run.leases = [(c, i) for c, i in run.leases if c is not child]
            culprit, why = run.kill if run.kill is not None else (
                Outcome.LOST, f"its process {describe_exit(code)}")  # fmt: skip
            tail = b""
            if culprit is not Outcome.REQUEUE:
                tail = read_capture(child.capture_fd, log_off)
            fill_unfinished(run, idx, culprit, why, tail, since, child.pid, self.options.host)
            self._complete(run)
        with contextlib.suppress(OSError):
            os.close(child.capture_fd)
        if not self.stopping and not self.hand_back and not child.retiring:
            self._spawn_child()  # (a retired child's successor was started with its retirement)
        self._dispatch()

    def _retire(self, child: ChildProcess) -> None:
        child.retiring = True
        child.send({"op": "exit"}, [], [])
        self._flush_child(child)
        child.kill()

    def _kill_run(self, run: Run, outcome: Outcome | None, why: str) -> None:
        """Stop a running batch by killing its child (replaced at once)."""
        if run.child is None or run.kill is not None:
            return
        run.kill = (outcome if outcome is not None else Outcome.REQUEUE, why)
        if outcome is None:
            run.info["cancelled"] = True
        run.child.kill()

    def _complete(self, run: Run) -> None:
        """A batch ended: deliver its RESULT (kept until acknowledged); free its slot."""
        now = time.monotonic()
        self.running.pop(run.seq, None)
        charged = self.fair.finished(run.seq, now)
        self.stats["batches"] += 1
        if len(run.outcomes) < len(run.info.get("items", ())):  # a batch cut short by maxnum
            fill_unfinished(run, -1, None, "", b"", 0.0, 0, self.options.host)
        self.tasks_done += sum(1 for row, _ in run.outcomes.values() if row[2] != Outcome.REQUEUE)
        self.stats["tasks"] = self.tasks_done
        self.last_busy = now
        self._announce_due = True
        if run.info.get("cancelled"):
            self._free_held(run.held)
            run.held = []
            self._after_batch()
            return
        peer = self.by_controller.get(run.controller)
        self.stats["results_too_large"] += cap_result(run, self._max_result(peer), self.options.host)
        info, buffers = build_result(run, self.options.host, charged)
        self.unacked.setdefault(run.controller, {})[run.task_id] = Done(info, buffers, now, run.leases,
                                                                        run.held)  # fmt: skip
        run.held = []
        # The RESULT and what the freed slot brings (an ACCEPT of a held ASK, often of the
        # same controller) leave together: one send, one wake-up of the controller. To a
        # controller that said ``fold`` its ACCEPTs ride inside the RESULT: the slot is
        # given out first.
        fold = peer is not None and peer.conn.peer is not None and "fold" in peer.conn.peer.caps
        corked = self._corked = set()
        try:
            if fold:
                assert peer is not None
                accepted: list[str] = []
                self._folding = (peer, accepted)
                self._after_batch()
                self._send(peer, Result(run.task_id, info, tuple(accepted)), buffers)
            else:
                if peer is not None:
                    self._send(peer, Result(run.task_id, info), buffers)
                self._after_batch()
        finally:
            self._folding = None
            self._corked = None
            for p in corked:
                self._flush(p)

    def _free_buffers(self, run: Run, released: list[int] | None) -> None:
        """The run's large input buffers: back to the pool, unless its child keeps a map
        (``released``: the positions the child unmapped; None: the child is gone)."""
        done: list[tuple[Any, bool]] = []
        for i, buf in enumerate(run.buffers):  # a result in it: freed once acknowledged
            (run.held if i in run.kept else done).append((buf, released is None or i in released))
        self._free_held(done)
        run.buffers = ()

    def _forget_done(self, done: Done) -> None:
        """A result was acknowledged (or expired): its children may reuse their memory."""
        done.buffers = []
        self._free_held(done.held)
        done.held = []
        by_child: dict[ChildProcess, list[int]] = {}
        for child, lid in done.leases:
            if lid >= 0 and not child.dead:
                by_child.setdefault(child, []).append(lid)
        for child, ids in by_child.items():
            child.send({"op": "release", "ids": ids}, [], [])
            self._flush_child(child)
        done.leases = []

    def _free_held(self, held: list[tuple[Any, bool]]) -> None:
        """Input buffers now unused, each with whether it may be reused: back to the pool,
        unless the child kept a map of it (a task holds a view of its input)."""
        for buf, reusable in held:
            if reusable:
                self.pool.free(buf)
            else:
                self.pool.discard(buf)

    def _finish_unstarted(self, run: Run) -> None:
        """Hand a batch that never reached a child back to its controller."""
        self._free_buffers(run, None)
        fill_unfinished(run, -1, None, "", b"", 0.0, 0, self.options.host)
        self._complete(run)

    def _after_batch(self) -> None:
        maxnum = self.options.maxnum
        if maxnum is not None and self.tasks_done >= maxnum and self.draining is None:
            self._drain(f"ran {self.tasks_done} tasks (maxnum)")
        self._dispatch()
        self._admit()

    # -- time ---------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        if self._announce_due and now - self._last_announce >= _ANNOUNCE_EVERY_S:
            self._announce(now)
        if now - self._last_tick < 0.05:
            return
        self._last_tick = now
        opts = self.options
        if now - self.started > opts.maxtime and self.draining is None:
            self._drain(f"ran for its maximum time ({opts.maxtime:.0f} s)")
        idle = not (self.running or self.queued or self.admission.reserved or self.admission.held)
        if idle and now - self.last_busy > opts.maxidle and self.draining is None:
            self._drain(f"idle for {opts.maxidle:.0f} s (maxidle)")
        self._check_limits(now)
        for h in self.admission.take_held(opts.hold_s, now):
            if h.passed_over and self.fair.enabled:
                self._refuse(h.peer, h.ask, RefuseReason.FAIR_SHARE,
                             "other controllers, with less recent use, came first")  # fmt: skip
            else:
                self._refuse(h.peer, h.ask, RefuseReason.BUSY, "no slot became free in time")
        for peer in [p for p in self.peers if not p.controller and now - p.opened > _HANDSHAKE_S]:
            self._close(peer, "handshake timed out")
        if self.admission.drop_unused(now, 60.0):  # accepted, but their TASKs never came
            self._admit()
        for controller, done in list(self.unacked.items()):
            for task_id, d in list(done.items()):
                if now - d.finished > opts.keep_results_s:
                    self._forget_done(done.pop(task_id))
            if not done:
                del self.unacked[controller]
        for run in list(self.running.values()):
            gone = self.gone_since.get(run.controller)
            if run.controller not in self.by_controller and gone is not None and now - gone > opts.orphan_s:
                self.stats["orphans_stopped"] += 1
                self._kill_run(run, None, "its controller is gone")
        if now - self._last_prune > 60.0:  # a worker up for weeks meets thousands of controllers
            self._last_prune = now
            self._prune(now)
        if opts.stats_file and now - self._last_stats > 1.0:
            self._write_stats()
            self._last_stats = now

    def _prune(self, now: float) -> None:
        """Forget the controllers gone for good: their fair-share use decayed to nothing,
        their departure (kept to stop their orphaned runs) long past."""
        self.fair.prune(now)
        running = {r.controller for r in self.running.values()}
        for controller, since in list(self.gone_since.items()):
            if now - since > 2 * self.options.orphan_s and controller not in running:
                del self.gone_since[controller]

    def _check_limits(self, now: float) -> None:
        opts = self.options
        measure: list[tuple[Run, ChildProcess, int]] = []
        for run in list(self.running.values()):
            child = run.child
            if child is None or run.kill is not None:
                continue
            idx, since, _ = child.current()
            per_task = run.info.get("time_s") or 0.0
            limit = min(opts.timavail, per_task * 1.2 + 2.0 if per_task > 0 else math.inf)
            if idx >= 0 and since and time.time() - since > limit:
                self._kill_run(run, Outcome.KILLED,
                               f"task {idx} ran past the time it was admitted under ({limit:.1f} s) "
                               "and was stopped")  # fmt: skip
                continue
            if idx >= 0:
                measure.append((run, child, idx))
        if not measure or now - self._last_mem_check < _MEM_CHECK_S:
            return
        self._last_mem_check = now
        rss = tree_rss([c.pid for _, c, _ in measure])  # one pass over /proc for all
        declared = sum(r.ask.mem_bytes for r in self.running.values())
        for run, child, idx in measure:
            mem = run.ask.mem_bytes
            # A batch that declared no memory may use what this worker offers and the
            # others running have not declared.
            cap = mem or max(0, self.mem_total - declared)
            used = rss.get(child.pid, 0) - child.base_rss
            if used > cap * 1.1 + (16 << 20):
                self.stats["memory_kills"] += 1
                what = (f"the {mem >> 20} MiB it was admitted with" if mem else
                        f"the {cap >> 20} MiB this worker offers (declare what a task needs: "
                        "ew.peers(memory=...))")  # fmt: skip
                self._kill_run(run, Outcome.KILLED,
                               f"task {idx} used {used >> 20} MiB, more than {what}, and was stopped")

    def _free(self, now: float) -> tuple[int, int]:
        used_slots, committed = self.admission.in_use(now)
        for runs in (self.running.values(), self.queued):
            for r in runs:
                used_slots += r.ask.cores
                committed += r.ask.mem_bytes
        return self.options.slots - used_slots, self._mem_total() - committed

    def _mem_total(self) -> int:
        return self.mem_total

    def _mem_offer(self) -> int:
        import psutil

        return max(0, min(self._free(time.monotonic())[1], int(psutil.virtual_memory().available)))

    def _time_offer(self, now: float) -> float:
        return min(self.options.timavail, self.options.maxtime - (now - self.started))

    def _announce(self, now: float) -> None:
        self._announce_due = False
        self._last_announce = now
        if not self.announcers:
            return
        free, _ = self._free(now)
        if self.draining is not None:
            state = PeerState.ZOMBIE
        else:
            state = PeerState.IDLE if free > 0 else PeerState.BUSY
        task = None
        for run in self.running.values():
            job = run.info.get("job", {})
            items = run.info.get("items") or [[0, 0]]
            task = f"{str(job.get('name', ''))[:200]}#{items[0][0]}"
            break
        time_offer = max(0.0, self._time_offer(now))
        mem = self._mem_offer()
        for announcer in self.announcers:
            with contextlib.suppress(Exception):
                announcer.update_state(state=state, slots_free=max(0, free), mem_bytes=mem,
                                       time_s=time_offer, task=task)  # fmt: skip

    def _write_stats(self) -> None:
        path = self.options.stats_file
        if not path:
            return
        data: dict[str, Any] = dict(self.stats)
        if self.listener is not None:
            data["datagrams_dropped"] = self.listener.dropped
            data["datagrams_received"] = self.listener.received
        data["unacked"] = sum(len(done) for done in self.unacked.values())  # results kept
        data["function_parts"] = sum(len(p.fns) for p in self.peers)  # kept for controllers
        data["pid"] = os.getpid()
        data["peer_id"] = self.peer_id
        data["port"] = self.address[1]
        data["children"] = [c.pid for c in self.children]
        data["running"] = len(self.running)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)

    # -- the end -----------------------------------------------------------------------
    def _shutdown(self) -> None:
        self.stopping = True
        for peer in list(self.peers):
            if peer.controller:
                self._send(peer, Bye("the worker stops"))
            self._close(peer, "")
        for child in list(self.children):
            with contextlib.suppress(OSError):
                child.send({"op": "exit"}, [], [])
                child.flush()
        deadline = time.monotonic() + 2.0
        for child in list(self.children):
            try:
                child.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.reap()
            child.close()
            with contextlib.suppress(OSError):
                os.close(child.capture_fd)
        self.children.clear()
        for announcer in self.announcers:
            announcer.stop()
        if self.listener is not None:
            self.listener.stop()
        if self._watch_thread is not None:
            self._watch_thread.join(2.0)
        if self.listen_sock is not None:
            self.listen_sock.close()
        if self.options.stats_file:
            with contextlib.suppress(OSError):
                self._write_stats()
        for s in (self._wake_r, self._wake_w):
            s.close()
        self.sel.close()
        log.info("peer worker %s stopped after %d task(s)", self.peer_id[:8], self.tasks_done)


def _is_loopback(address: str) -> bool:
    return address.startswith("127.")


def _primary_address() -> str:
    """The address of the interface of the default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed
            return str(s.getsockname()[0])
        except OSError:
            return LOOPBACK_HOST
