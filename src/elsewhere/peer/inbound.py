"""The worker daemon's connections from controllers: accepted, verified, read, closed.

A connection is accepted (without a group key, from this machine only) into
``handshaking``, where it has :data:`~.handshake.HANDSHAKE_DEADLINE_S` to prove the
group key, and read at once (a controller sends its HELLO as it connects, so under a
flood, when connections wait in the kernel's backlog, the HELLO is there already).
At most :data:`MAX_UNAUTHENTICATED` wait there: one more is always accepted, and
pushes out a connection of the address that holds the most places (a flood comes
from few), one that has not said HELLO first, the oldest first. So a flood
pushes out its own connections first, and connections that never speak do not
push out a handshake under way; refusing newcomers instead would let 64 idle
connections, opened again as each expires, lock every controller out.
Sockets dropped before their handshake are reset (:func:`~.net.abort`).

A connection that proved the key is a controller's, one of at most
:data:`MAX_AUTHENTICATED`; the worker's access rules (and, without a key, the
user owning the other end) decide whether its ASKs may ever be admitted. A
controller has one live connection: a new one replaces the old, and gets at
once every result not yet acknowledged. Frames are read as the selector says and
handed on by type (ASK, TASK, CANCEL to :mod:`.intake`; ACK forgets results, :mod:`.delivery`);
what is sent waits in the connection's pump, and leaves at once, or with the
others of the same moment (``_corked``, see :meth:`~.delivery.Delivery._complete`).
A protocol error closes the connection (after an ERROR frame, if one could go).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import selectors
import time
from typing import Any

from ..util.errors import PeerError, ProtocolError
from .access import same_user
from .admission import Peer
from .handshake import HANDSHAKE_DEADLINE_S
from .messages import LANE_SUFFIX, Ack, Ask, Bye, Cancel, Error, Ping, Pong, Result, Task
from .net import abort as _abort
from .net import tune, watch_after_flush
from .stream import Closed
from .wire import Connection, HandshakeComplete, Received, Role
from .workerstate import WorkerState

__all__ = ["MAX_AUTHENTICATED", "MAX_UNAUTHENTICATED", "Inbound"]

log = logging.getLogger("elsewhere.peer.daemon")  # the daemon's log, whichever part writes

MAX_UNAUTHENTICATED = 64
"""Connections in their handshake at once; one more pushes out another (see the module doc)."""
MAX_AUTHENTICATED = 256
"""Connections of controllers that proved the key; one more is told so and closed."""
_ACCEPTS_PER_TURN = 16  # then the loop reads what the open connections sent (a flood's
# connections cost ~0.1 ms each: frames of real work wait no more than a few ms for them)


def _is_loopback(address: str) -> bool:
    return address.startswith("127.")


class Inbound(WorkerState):
    """The connections of :class:`~.daemon.PeerWorker` (see the module doc)."""

    def _accept(self) -> None:
        assert self.listen_sock is not None
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, addr = self.listen_sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("accept failed: %s", exc)
                return
            self.stats["connections"] += 1
            if self.key is None and not _is_loopback(addr[0]):
                sock.close()
                continue
            if len(self.handshaking) >= MAX_UNAUTHENTICATED:
                self._make_room()
            tune(sock)
            peer = Peer(sock, addr[0])
            peer.connect(Connection(Role.RESPONDER, self.key, self.identity, more_keys=self.options.more_keys,
                                    allocate=self.pool.allocator(peer), encrypt=self.options.encrypt,
                                    ephemeral=self.ephemeral))  # fmt: skip
            self.peers.add(peer)
            self.handshaking[peer] = None
            self.sel.register(sock, selectors.EVENT_READ, ("peer", peer))
            self._on_peer(peer, selectors.EVENT_READ)  # its HELLO may be here already

    def _make_room(self) -> None:
        """Push out a connection in its handshake for a newcomer: one of the address that
        holds the most places, one that has not said HELLO first, the oldest first."""
        count = collections.Counter(p.address for p in self.handshaking)
        # min() keeps the first of equals: self.handshaking is oldest first
        victim = min(self.handshaking, key=lambda p: (-count[p.address], p.conn.peer is not None))
        self.stats["handshakes_pushed_out"] += 1
        self._close(victim, "pushed out by newer connections", abort=True)

    def _expire_handshakes(self, now: float) -> None:
        """Close the connections whose handshake is past its deadline (oldest first)."""
        while self.handshaking:
            peer = next(iter(self.handshaking))
            if now - peer.opened <= HANDSHAKE_DEADLINE_S:
                return
            self.stats["handshake_timeouts"] += 1
            self._close(peer, "handshake timed out", abort=True)

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
        watch_after_flush(self.sel, peer.sock, peer, "peer", done)

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

    def _close(self, peer: Peer, why: str, *, abort: bool = False) -> None:
        """Close ``peer``'s connection (``abort``: with a reset, dropping what it did not
        send yet) and forget what it held."""
        if peer.closed:
            return
        peer.closed = True
        self.peers.discard(peer)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(peer.sock)
        if abort:
            _abort(peer.sock)
        else:
            with contextlib.suppress(OSError):
                peer.sock.close()
        # what refers back to the peer goes, so that it is freed now, not by the cyclic gc
        # (a flood leaves thousands): its allocator (the connection's), and the error that
        # ended it (whose traceback holds the frames that held the peer)
        peer.conn.close()
        peer.pump.failed = None
        if why:
            log.debug("closed connection from %s: %s", peer.address, why)
        if peer in self.handshaking:
            del self.handshaking[peer]
            return  # it never proved the key: it held no ASK, no buffer, no slot
        if peer.controller and self.by_controller.get(peer.controller) is peer:
            del self.by_controller[peer.controller]
            # remembered only while it has runs here that may be orphaned (see PeerWorker._tick):
            # one that ran nothing would stay for 2 * orphan_s, and a controller per job, or a
            # key holder reconnecting in a loop, would fill the table
            if any(r.controller == peer.controller for r in (*self.running.values(), *self.queued)):
                self.gone_since[peer.controller] = time.monotonic()
        self.admission.forget(peer)
        self.pool.reclaim(peer)  # buffers of a frame that never became a task
        self._announce_due = True
        self._admit()

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
            if msg.tasks:
                self._cancel_on_lanes(peer, msg.tasks)
        elif isinstance(msg, Ping):
            self._send(peer, Pong(msg.token))
        elif isinstance(msg, (Bye, Error)):
            self._close(peer, "")
        elif isinstance(msg, Result):  # no worker takes one: its buffers go back at once
            for buf in event.buffers:
                self.pool.free(buf)

    def _on_handshake(self, peer: Peer, event: HandshakeComplete) -> None:
        self.stats["handshakes"] += 1
        if peer.conn.cipher:  # which cipher each controller's connection uses
            self.stats["cipher_" + peer.conn.cipher] += 1
        del self.handshaking[peer]
        g = event.peer
        if g.peer_id.endswith(LANE_SUFFIX):  # a lane: the controller's, replacing nothing
            if self._lane_handshake(peer, g):
                peer.refusal = self.options.access.check(g.user, g.host, peer.address)
                if peer.refusal is None and self.key is None and not same_user(peer.sock):
                    peer.refusal = "without a group key a worker serves only its own user"
            return
        if g.peer_id not in self.by_controller and len(self.by_controller) >= MAX_AUTHENTICATED:
            self.stats["controllers_over_cap"] += 1
            why = f"this worker serves at most {MAX_AUTHENTICATED} controllers at once"
            self._send(peer, Error("busy", why))
            self._close(peer, "too many controllers")
            return
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
