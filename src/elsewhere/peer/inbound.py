"""The worker daemon's connections from controllers: accepted, verified, read, closed.

A connection is accepted while fewer than ``_MAX_PEERS`` are open (without a
group key, from this machine only); its handshake proves the group key, and the
worker's access rules (and, without a key, the user owning the other end)
decide whether its ASKs may ever be admitted. A controller has one live
connection: a new one replaces the old, and gets at once every result not yet
acknowledged. Frames are read as the selector says and handed on by type
(ASK, TASK, CANCEL to :mod:`.intake`; ACK forgets results, :mod:`.delivery`);
what is sent waits in the connection's pump, and leaves at once, or with the
others of the same moment (``_corked``, see :meth:`~.delivery.Delivery._complete`).
A protocol error closes the connection (after an ERROR frame, if one could go).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import time
from typing import Any

from ..util.errors import PeerError, ProtocolError
from .access import same_user
from .admission import Peer
from .messages import Ack, Ask, Bye, Cancel, Error, Ping, Pong, Result, Task
from .net import tune, watch_after_flush
from .stream import Closed
from .wire import Connection, HandshakeComplete, Received, Role
from .workerstate import WorkerState

__all__ = ["Inbound"]

log = logging.getLogger("elsewhere.peer.daemon")  # the daemon's log, whichever part writes

_MAX_PEERS = 256


def _is_loopback(address: str) -> bool:
    return address.startswith("127.")


class Inbound(WorkerState):
    """The connections of :class:`~.daemon.PeerWorker` (see the module doc)."""

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
            tune(sock)
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
