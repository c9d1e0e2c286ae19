"""The controller's connections to workers: found, connected, read, written, lost.

Workers come from discovery (:meth:`~Links._refresh_workers`, every 50 ms of
the loop): a new or returning one is connected to without waiting
(:mod:`.net`), its handshake checked (the peer id it announced; without a
group key, the same user), and then its frames are read as the selector says
(:meth:`~Links._on_readable`) and handed by type to the batching (ACCEPT,
REFUSE) and the results (RESULT). What is sent waits in its pump until the end
of the turn (``_corked``), so that the frames of one turn leave in one send.

A connection that breaks voids its ASKs (their tasks are placed again) and is
made again at once: the worker sends every result not yet acknowledged on the
new one. A worker whose announcements stop, or that refuses the connection,
is lost: its batches go to other workers (:mod:`.retries`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import selectors
import time
from typing import Any

from ..util.errors import PeerError, ProtocolError
from .access import same_user
from .announce import Announcement, PeerState
from .controlstate import ControllerState
from .handshake import HandshakeRefused
from .messages import Accept, Ask, Bye, Error, Ping, Refuse, Result
from .net import connect_error, connect_tcp, watch_after_flush
from .peertable import PeerInfo
from .placement import Worker
from .stream import Closed, ConnectionPump
from .wire import Connection, HandshakeComplete, Received, Role

__all__ = ["Links"]

log = logging.getLogger("elsewhere.peer.controller")

LANE_IDLE_S = 5.0
"""An Executor that sent no task for this long closes its lanes (their slots go back to the
workers, for other controllers); they open again once tasks come."""
_KILLED_S = 10.0
"""A lane that closes within this long of a CANCEL that asked its worker to stop the task it
ran (see ``Batching._cancel_sent``) ended as asked: it did not break."""
_OPENING = 8
"""Connections in their handshake at once: a controller that found 32 workers and opened
them all at once did each handshake's steps in turn, and on a busy machine every one ran
past the workers' deadline (``HANDSHAKE_DEADLINE_S``), was cut and opened again, over and
over; a few at a time, each is done in milliseconds and the next ones follow."""


class Links(ControllerState):
    """The connections of :class:`~.controller.Controller` to its workers (see the module doc)."""

    def _refresh_workers(self, now: float) -> None:
        assert self.listener is not None
        listed: set[str] = set()
        opening = sum(1 for w in self.workers.values() if w.state in ("connecting", "handshake"))
        for info in self.listener.peers():
            a = info.announcement
            if a.state is PeerState.CONTROLLER or a.peer_id == self.peer_id:
                continue
            listed.add(a.peer_id)
            w = self.workers.get(a.peer_id)
            if w is None:
                w = self.workers[a.peer_id] = Worker(a.peer_id, info)
                self._roster_changed()
            elif w.info is not info:
                if not w.listed or self._fit(w.info.announcement) != self._fit(a):
                    self._roster_changed()  # what it offers this job changed (not only its free slots)
                w.info = info
                w.listed = True
                if w.lane is not None:
                    w.lane.info, w.lane.listed = _lane_info(info), True
            if w.unsuitable and (w.offer != w.unsuitable_for or now - w.unsuitable_since > 30.0):
                w.unsuitable = ""  # its offer changed, or a while passed: ask again
                self._roster_changed()
            if self.settings.key is not None and a.encrypt != self.settings.encrypt:  # both ends must agree
                if not w.unsuitable:
                    self._roster_changed()
                w.unsuitable, w.unsuitable_for, w.unsuitable_since = _encryption_differs(a.encrypt), w.offer, now
            if w.state in ("new", "closed") and w.connectable() and now - w.since > min(0.2 * 2 ** w.failures, 5.0) \
                    and opening < _OPENING:  # fmt: skip
                self._connect(w, now)
                opening += 1
        for w in list(self.workers.values()):
            if w.peer_id not in listed and w.listed:
                w.listed = False
                self._roster_changed()
                self._lose(w, "its announcements stopped (it expired)")
        if self.lanes_wanted:
            self._open_lanes(now)
        self._update_note()

    # -- lanes: a connection of this controller's served by a task process of the worker
    def _open_lanes(self, now: float) -> None:
        """Open a lane to each ready worker that serves lanes and has none, while the tasks
        are short and come (an open Executor whose tasks declare no memory or time: see
        "Lanes" in docs/peer-protocol.md). Tasks no longer short, or none sent for
        :data:`LANE_IDLE_S`: the lanes close once idle, and give their slots back (a lane's
        cancelled task is stopped by its worker daemon, told on this controller's own
        connection: see ``Batching._cancel_sent``)."""
        idle = now - self.last_sent > LANE_IDLE_S
        if self.closed or not self._short() or idle:
            why = "no task came for a while" if idle and self._short() else "the tasks are not short"
            for lane in [w for w in self.workers.values() if w.lane_of is not None and not any(
                    b.sent for b in w.batches.values())]:  # fmt: skip
                self._send(lane, Bye(why))
                self._lane_closed(lane, why, ended=True)
            return
        for w in list(self.workers.values()):
            if (w.lane_of is not None or w.lane is not None or w.state != "ready" or now < w.lane_after
                    or w.conn is None or w.conn.peer is None or "lane" not in w.conn.peer.caps
                    or not w.usable(self.settings)):  # fmt: skip
                continue
            lane = Worker(w.peer_id, _lane_info(w.info))
            lane.lane_of, w.lane = w, lane
            self.workers[lane.key] = lane
            self.stats["lanes_opened"] += 1
            self._connect(lane, now)

    def _lane_closed(self, lane: Worker, why: str, *, ended: bool) -> None:
        """A lane ended (``ended``: its worker took the slot back, or said why with BYE) or
        broke: what it had, ran or was granted goes to be placed again, and the next lane to
        that worker is opened after a moment (a second; after a break, a refusal or a
        failure, half a minute: the next batch there goes through the worker itself). A lane
        whose worker stopped the task it ran, as this controller asked, ended."""
        main = lane.lane_of
        log.debug("lane to %s closed: %s", lane.host, why)
        if not ended and lane.lane_killed and time.monotonic() - lane.lane_killed < _KILLED_S:
            ended = True  # its worker stopped the task we cancelled: no break of the lane's own
        self._drop_connection(lane)
        for b in list(lane.batches.values()):
            if b.sent and not ended:  # (its death, the daemon's path tells of it as lost)
                self.off_lanes.update(b.indices)
            self._unplace(b, requeue_front=True, resubmit=bool(b.sent))
        self.workers.pop(lane.key, None)
        lane.listed = False
        if main is not None and main.lane is lane:
            main.lane = None
            main.lane_after = time.monotonic() + (1.0 if ended else 30.0)
        self.stats["lanes_ended" if ended else "lanes_broken"] += 1
        self._roster_changed()

    def _fit(self, a: Announcement) -> tuple[int, bool, bool, bool]:
        """What of a worker's offer decides whether this job's tasks may go there, and how
        many: its slots, whether it stops, whether its time and its memory fall short of the
        tasks' needs. Its free memory and time left change in nearly every announcement; a
        change that crosses no need changes nothing a placing turn would find (each
        announcement a pass over every worker, two of every three turns that placed nothing)."""
        s = self.settings
        return (a.slots, a.state is PeerState.ZOMBIE, bool(s.time_s) and a.time_s < s.time_s,
                bool(s.mem_bytes) and a.mem_bytes < s.mem_bytes)  # fmt: skip

    def _connect(self, w: Worker, now: float) -> None:
        w.state, w.since = "connecting", now
        self._roster_changed()
        sock, why = connect_tcp(w.info.connect_address)
        if sock is None:
            self._connect_failed(w, why)
            return
        w.sock = sock
        self.sel.register(sock, selectors.EVENT_WRITE, ("connect", w))
        w.events = selectors.EVENT_WRITE

    def _on_connected(self, w: Worker) -> None:
        sock = w.sock
        assert sock is not None
        why = connect_error(sock)
        if why:
            self.sel.unregister(sock)
            sock.close()
            w.sock = None
            self._connect_failed(w, why)
            return
        identity = self.identity if w.lane_of is None else self.lane_identity
        w.conn = Connection(Role.INITIATOR, self.settings.key, identity, allocate=self.buffers,
                            encrypt=self.settings.encrypt)  # fmt: skip
        w.pump = ConnectionPump(sock, w.conn)
        w.state = "handshake"
        self.sel.modify(sock, selectors.EVENT_READ, ("worker", w))
        w.events = selectors.EVENT_READ
        self._flush(w)

    def _connect_failed(self, w: Worker, why: str) -> None:
        w.state = "closed"
        self._roster_changed()
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
        except HandshakeRefused as exc:  # connecting again does not help: say why, and do not
            log.warning("worker %s refused this controller: %s", w.host, exc)
            w.unsuitable, w.unsuitable_for, w.unsuitable_since = str(exc), w.offer, time.monotonic()
            self._disconnected(w, str(exc))
        except (Closed, ProtocolError, OSError) as exc:
            self._disconnected(w, str(exc) or type(exc).__name__)

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
            why = getattr(msg, "reason", "") or getattr(msg, "message", "")
            if w.lane_of is not None:
                self._lane_closed(w, why, ended=isinstance(msg, Bye))
            else:
                self._disconnected(w, why)

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
        self._roster_changed()
        w.host = g.host or w.host
        if not w.wid:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in w.host)[:40] or "peer"
            lane = "-lane" if w.lane_of is not None else ""  # (its results go to a file of its own)
            w.wid = f"peer-{safe}-{w.peer_id[:8]}{lane}-{self.short}"
            self._write_worker_info(w)

    def _write_worker_info(self, w: Worker) -> None:
        from ..folder.store import write_json

        # (no pid: the daemon's is not told, and the task process that sent the last RESULT
        # need not be the one running the task now, on a daemon of several slots)
        info = {"host": w.host, "peer_id": w.peer_id, "user": w.info.announcement.user,
                "address": list(w.info.connect_address), "python": ""}  # fmt: skip
        with contextlib.suppress(OSError):
            write_json(self.store.path / "workers" / f"{w.wid}.json", info, fsync=False)

    def _send(self, w: Worker, message: Any, buffers: Any = (), *, flush: bool = True) -> bool:
        if w.conn is None or w.state != "ready":
            return False
        if w.lane_of is not None and not w.lane_asked and isinstance(message, Ask):
            message = Ask(message.task_id, lane=True)  # a lane's first ASK asks for the lane
            w.lane_asked = True
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

    def _flush(self, w: Worker) -> None:
        if w.pump is None or w.sock is None:
            return
        try:
            done = w.pump.flush()
        except OSError as exc:
            self._disconnected(w, str(exc))
            return
        watch_after_flush(self.sel, w.sock, w, "worker", done)

    def _flush_unflushed(self) -> None:
        for w in self.unflushed:
            self._flush(w)
        self.unflushed.clear()

    def _drop_connection(self, w: Worker) -> None:
        self._roster_changed()  # (a worker connecting counts when batches are sized)
        if w.pump is not None:
            self.stats["bytes_sent"] += w.pump.bytes_sent
            self.stats["bytes_received"] += w.pump.bytes_received
        if w.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(w.sock)
            with contextlib.suppress(OSError):
                w.sock.close()
        if w.conn is not None:
            w.conn.close()  # frees what it holds now, not at the next cycle collection
        if w.pump is not None:
            w.pump.failed = None  # (its traceback would keep the connection alive)
        w.sock = w.conn = w.pump = None
        w.sent_fns.clear()
        w.state = "closed"
        w.since = time.monotonic()

    def _disconnected(self, w: Worker, why: str) -> None:
        """The connection broke: ASKs are void; running batches wait for a reconnect."""
        if w.lane_of is not None:  # (nothing waits for a lane's reconnect: it kept no result)
            self._lane_closed(w, why, ended=False)
            return
        log.debug("connection to %s lost: %s", w.host, why)
        self.stats["disconnections"] += 1
        was_ready = w.state == "ready"
        self._drop_connection(w)
        for b in list(w.batches.values()):
            if not b.sent:
                self._unplace(b, requeue_front=True)
        if not was_ready and w.listed and w.connectable():
            w.failures += 1  # cut in its handshake: opened again later, a few at a time
        elif w.listed and w.connectable():
            self._connect(w, time.monotonic())  # results it keeps come again on the new one
        elif w.batches:
            self._lose(w, f"its connection broke ({why})")

    def _lose(self, w: Worker, why: str) -> None:
        """The worker is gone: its batches go elsewhere."""
        if w.lane is not None:
            self._lane_closed(w.lane, why, ended=False)
        if w.lane_of is not None:
            self._lane_closed(w, why, ended=False)
            return
        if w.batches:
            log.info("worker %s lost (%s): %d batch(es) placed again", w.host, why, len(w.batches))
        for b in list(w.batches.values()):
            self._unplace(b, requeue_front=True, resubmit=bool(b.sent))
        self._drop_connection(w)
        if not w.listed:
            self.workers.pop(w.key, None)


def _lane_info(info: PeerInfo) -> PeerInfo:
    """A lane's view of its worker's announcement: one slot, free (the lane's own)."""
    return dataclasses.replace(info, announcement=dataclasses.replace(info.announcement, slots=1, slots_free=1))


def _encryption_differs(worker_encrypts: bool) -> str:
    """Why a worker whose choice of encryption differs from this controller's is not used."""
    if worker_encrypts:
        return ("it encrypts (the default with a group key) and this controller turned encryption off "
                "(encrypt=False): such a controller is served only by workers started with --no-encrypt")
    return ("it was started with --no-encrypt (clear text) and this controller encrypts: pass "
            "encrypt=False to ew.peers() to use it, or restart it without --no-encrypt")
