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

Where each part of the daemon is (each a mixin of
:class:`~.workerstate.WorkerState`, which holds the state they share):

- here: starting, the loop, signals and draining, the timers, the end;
- :mod:`.workerstate`: the state;
- :mod:`.inbound`: connections from controllers: accepted, handshake, frames
  read and sent, closed;
- :mod:`.intake`: ASKs answered or held, admitted fairest first; TASKs queued;
  CANCELs;
- :mod:`.dispatch`: the children: which runs a batch, started, replaced,
  retired, killed at their limits, and what they send back;
- :mod:`.delivery`: a batch that ended: its RESULT sent (with the ACCEPTs its
  slot brings) and kept until acknowledged, its buffers freed;
- :mod:`.offer`: what the worker offers and says of itself: free slots, memory
  and time, its announcements, its stats file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Any

from ..util.errors import ConfigError
from .announce import Announcement, PeerState
from .childmsg import Outcome
from .ciphers import offered_ciphers
from .delivery import Delivery
from .discovery import Announcer, Listener
from .dispatch import Dispatch
from .inbound import Inbound
from .intake import Intake
from .keys import GroupKey
from .keywatch import retired
from .lanes import Lanes
from .messages import Bye, RefuseReason
from .net import listen_tcp, primary_address
from .offer import Offer
from .workerstate import WorkerState

__all__ = ["PeerWorker"]

log = logging.getLogger(__name__)

_ANNOUNCE_EVERY_S = 0.05  # coalesce state changes into at most 20 announcements a second
_TICK_S = 0.1


class PeerWorker(Inbound, Intake, Dispatch, Delivery, Lanes, Offer, WorkerState):
    """The worker daemon: see the module docstring. ``PeerWorker(options)`` makes it (see
    :class:`~.workerstate.WorkerState`); ``serve()`` runs it until it exits."""

    # -- set-up ------------------------------------------------------------------
    def start(self) -> tuple[str, int]:
        """Bind, start discovery and the first child; returns the TCP address."""
        opts = self.options
        try:
            sock = listen_tcp((opts.bind_address(), opts.port))
        except OSError as exc:
            where = f"{opts.bind_address()}:{opts.port}" if opts.port else opts.bind_address()
            hint = {errno.EADDRINUSE: "the port is taken (another worker? --tcp-port chooses another, 0 any)",
                    errno.EADDRNOTAVAIL: "it must be an address of this machine (`ip -4 addr` lists them)",
                    errno.EACCES: "ports below 1024 need privileges (--tcp-port 0: any free port)"}  # fmt: skip
            raise ConfigError(f"cannot listen for tasks on {where} ({exc.strerror})"
                              + (f": {hint[exc.errno]}" if exc.errno in hint else "")) from exc  # fmt: skip
        self.listen_sock = sock
        self.address = (opts.bind_address(), sock.getsockname()[1])
        self.sel.register(sock, selectors.EVENT_READ, ("listen", None))
        self.waker.register(self.sel)
        self._spawn_child()
        announced = self.address[0]
        if announced == "0.0.0.0":
            announced = opts.discovery.interface or primary_address()
        served: list[GroupKey | None] = [*opts.group_keys()] or [None]
        ciphers = offered_ciphers()  # (ELSEWHERE_PEER_CIPHER naming none: an error, now)
        for key in served:  # each group served hears of this worker
            ann = Announcement(
                self.peer_id, key.group if key else "", announced, self.address[1],
                opts.user[:256], opts.host[:256], PeerState.IDLE, opts.slots, opts.slots,
                self._mem_offer(), min(opts.timavail, opts.maxtime),
                encrypt=opts.encrypt and key is not None, ciphers=ciphers if key is not None else (),
            )  # fmt: skip
            self.announcers.append(Announcer(ann, key, opts.discovery).start())
        if opts.listen_for_controllers:  # one listener for every group served
            try:
                self.listener = Listener(self.key, opts.discovery, more_keys=opts.more_keys,
                                         only_states=(PeerState.CONTROLLER,)).start()  # fmt: skip
            except OSError as exc:  # e.g. static peers on a port another peer here holds
                log.warning("not listening for controllers (%s); announcing anyway", exc)
            else:
                for announcer in self.announcers:  # less often in a large group (see AnnounceTimer)
                    announcer.pace_by(self.listener.pace_for(announcer.announcement.group))
                self._watch_thread = threading.Thread(target=self._watch_controllers,
                                                      name="elsewhere-peer-watch", daemon=True)  # fmt: skip
                self._watch_thread.start()
        self._ready.set()
        group = (", ".join(f"{k.group!r} (key {k.fingerprint}" + (f", and the previous one until "
                           f"{time.ctime(k.overlap_ends())}" if k.overlap_ends() else "") + ")"
                           for k in opts.group_keys()) or "(loopback only)")  # fmt: skip
        wire = ("" if self.key is None else f", tasks and results encrypted ({', '.join(ciphers)})" if opts.encrypt
                else ", tasks and results in clear text (--no-encrypt)")  # fmt: skip
        log.info("peer worker %s on %s:%d, group %s, %d slot(s), %s%s", self.peer_id[:8],
                 self.address[0], self.address[1], group,
                 opts.slots, "fair share" if opts.fair_share else "first come, first served", wire)  # fmt: skip
        return self.address

    def wait_ready(self, timeout: float) -> bool:
        """Wait until :meth:`start` has bound its socket (for callers in another thread)."""
        return self._ready.wait(timeout)

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
                polling = now < self._poll_until and self._cores.may_spin(now)
                if not polling:
                    self._poll_until = 0.0  # (until the next frame: every core was wanted)
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
        self.waker.wake()

    def _install_signals(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            self._signals += 1
            self.waker.wake()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, handler)  # its terminal closed: drain, as for SIGTERM

    def _on_wake(self) -> None:
        self.waker.drain()
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
        self._end_lanes("the worker is stopping")  # after the batch each runs: then it exits
        self._announce_due = True

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
        # (a lane is busy while its task process runs a task, and keeps last_busy as it tells
        # the tasks it ran; an idle Executor's lane lets the worker idle out, as its unused
        # admissions do)
        idle = not (any(not r.info.get("lane") or (r.child is not None and r.child.current()[0] != -1)
                        for r in self.running.values())
                    or self.queued or self.admission.reserved or self.admission.held)  # fmt: skip
        if idle and now - self.last_busy > opts.maxidle and self.draining is None:
            self._drain(f"idle for {opts.maxidle:.0f} s (maxidle)")
        self._check_limits(now)
        for h in self.admission.take_held(opts.hold_s, now):
            if h.passed_over and self.fair.enabled:
                self._refuse(h.peer, h.ask, RefuseReason.FAIR_SHARE,
                             "other controllers, with less recent use, came first")  # fmt: skip
            else:
                self._refuse(h.peer, h.ask, RefuseReason.BUSY, "no slot became free in time")
        self._expire_handshakes(now)
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
        self._rekey(now)
        if now - self._last_prune > 60.0:  # a worker up for weeks meets thousands of controllers
            self._last_prune = now
            self._prune(now)
        if opts.stats_file and now - self._last_stats > 1.0:
            self._write_stats()
            self._last_stats = now

    def _rekey(self, now: float) -> None:
        """A key file changed (a rotation): announce with its new key and take it for new
        connections; close the connections that proved a key no longer accepted (dropped, or
        past its overlap), so that a retired key opens nothing, not even a connection it opened."""
        keys = self.keywatch.check(now)
        if keys is None:
            return
        if self.keywatch.changed:
            self.options = dataclasses.replace(self.options, key=keys[0], more_keys=tuple(keys[1:]))
            self.key = keys[0]
            for announcer, key in zip(self.announcers, keys):
                announcer.key = key
            if self.listener is not None:
                self.listener.rekey(keys)
        wall = time.time()
        for peer in list(self.by_controller.values()):
            if retired(peer.conn.proven_secret, peer.conn.group, keys, wall):
                self._close(peer, "the key it proved was retired (a rotation)")
                log.info("closed the connection of %s@%s: the key it proved is no longer accepted",
                         peer.user, peer.host or peer.address)  # fmt: skip

    def _prune(self, now: float) -> None:
        """Forget the controllers gone for good: their fair-share use decayed to nothing,
        their departure (kept to stop their orphaned runs) long past."""
        self.fair.prune(now)
        running = {r.controller for r in self.running.values()}
        for controller, since in list(self.gone_since.items()):
            if now - since > 2 * self.options.orphan_s and controller not in running:
                del self.gone_since[controller]

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
        self.waker.close()
        self.sel.close()
        self._cores.close()
        log.info("peer worker %s stopped after %d task(s)", self.peer_id[:8], self.tasks_done)
