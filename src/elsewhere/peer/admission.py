"""Who asks this worker for what: the connections from controllers, and their ASKs.

A :class:`Peer` is one connection from a controller, with what the access rules
said of it. An ASK that passes the worker's checks is held (:class:`Held`) until
a slot and the memory it asks for are free; :class:`Admission` keeps the held
ASKs and the admissions given until their TASK comes, chooses which held ASK is
accepted next (fairest controller first, see :mod:`.fairshare`), and says what
the admissions hold. The daemon, :class:`~.daemon.PeerWorker`, checks the ASKs,
answers them and times them out.
"""

from __future__ import annotations

import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any

from .fairshare import FairShare, Waiting
from .messages import Ask
from .runs import Run
from .stream import ConnectionPump
from .wire import Connection

__all__ = ["Admission", "Held", "Peer"]

_STALE_RESERVATION_S = 0.05
"""An admission not used within this time stops holding its slot (see :meth:`Admission.in_use`)."""


class Peer:
    """One connection from a controller."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address
        self.opened = time.monotonic()
        self.controller = ""  # its peer id, once the handshake is done
        self.user = ""
        self.host = ""
        self.refusal: str | None = None
        self.fns: dict[str, tuple[Any, ...]] = {}  # digest -> raw buffers of (fn, job_data)
        self.closed = False
        self.events = selectors.EVENT_READ  # what the selector watches for now
        self.lane = False  # a lane connection (see lanes.py): one ASK, then a task process's
        self.lane_asked = False

    def connect(self, conn: Connection) -> None:
        """Attach the protocol state (made once the peer exists: it owns what it receives)."""
        self.conn = conn
        self.pump = ConnectionPump(self.sock, conn)


@dataclass
class Held:
    """An ASK that waits for a slot (``passed_over``: another controller's was chosen first)."""

    peer: Peer
    ask: Ask
    arrival: float
    passed_over: bool = False


class Admission:
    """The ASKs a worker holds, and the admissions it gave, on all its connections.

    ``held``: ASKs that passed the worker's checks and wait for a slot, in the order
    they came. ``reserved``: accepted ASKs whose TASK has not come yet, by (id of the
    connection, task id). Which held ASK is accepted next is the fair-share choice
    among those that fit (:meth:`choose`); the daemon answers and times them out.
    """

    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self.held: list[Held] = []
        self.reserved: dict[tuple[int, str], Run] = {}  # (id(peer), task_id) -> accepted run

    def hold(self, peer: Peer, ask: Ask, now: float) -> None:
        """Keep ``ask`` of ``peer`` until a slot is free for it."""
        self.held.append(Held(peer, ask, now))

    def waiting(self, peer: Peer) -> int:
        """How many ASKs of ``peer`` are held."""
        return sum(1 for h in self.held if h.peer is peer)

    def choose(self, free_slots: int, free_mem: int, now: float) -> Held | None:
        """Take the held ASK to accept next among those that fit in ``free_slots`` and
        ``free_mem``: fairest controller first (the others' ASKs are passed over)."""
        fits = [h for h in self.held if h.ask.cores <= free_slots and h.ask.mem_bytes <= free_mem]
        if not fits:
            return None
        if len(fits) == 1:
            chosen = fits[0]
        else:
            chosen = fits[self.fair.pick([Waiting(h.peer.controller, h.arrival) for h in fits], now)]
        self.held.remove(chosen)
        for h in self.held:
            if h.peer.controller != chosen.peer.controller:
                h.passed_over = True
        return chosen

    def reserve(self, peer: Peer, task_id: str, run: Run) -> None:
        """``peer``'s ASK for ``task_id`` was accepted: ``run`` waits for its TASK."""
        self.reserved[(id(peer), task_id)] = run

    def take(self, peer: Peer, task_id: str) -> Run | None:
        """The run reserved for ``peer``'s TASK ``task_id``, no longer reserved (None if none)."""
        return self.reserved.pop((id(peer), task_id), None)

    def withdraw(self, peer: Peer, task_id: str) -> bool:
        """``peer`` cancelled ``task_id``: its held ASK goes, and its reservation; True if
        there was a reservation."""
        self.held = [h for h in self.held if not (h.peer is peer and h.ask.task_id == task_id)]
        return self.reserved.pop((id(peer), task_id), None) is not None

    def take_held(self, older_than: float | None = None, now: float = 0.0) -> list[Held]:
        """Take out the held ASKs (those that waited longer than ``older_than`` seconds, if
        given), for the daemon to refuse: taken before any refusal is sent, as a refusal that
        cannot be sent closes its connection, which drops that connection's ASKs here."""
        if older_than is None:
            taken, self.held = self.held, []
        else:
            taken = [h for h in self.held if now - h.arrival > older_than]
            self.held = [h for h in self.held if now - h.arrival <= older_than]
        return taken

    def drop_unused(self, now: float, older_than: float) -> bool:
        """Drop the admissions whose TASK has not come within ``older_than`` seconds;
        True if there were any."""
        stale = [key for key, run in self.reserved.items() if now - run.accepted > older_than]
        for key in stale:
            del self.reserved[key]
        return bool(stale)

    def forget(self, peer: Peer) -> None:
        """``peer``'s connection closed: its held ASKs and its reservations go."""
        self.held = [h for h in self.held if h.peer is not peer]
        for key in [k for k in self.reserved if k[0] == id(peer)]:
            del self.reserved[key]

    def in_use(self, now: float) -> tuple[int, int]:
        """The slots (cores) and memory bytes the reservations hold."""
        # An admission not used at once (a controller asked ahead) stops holding its slot:
        # if its TASK comes later it waits for a free slot like any other.
        used_slots = committed = 0
        for r in self.reserved.values():
            if now - r.accepted < _STALE_RESERVATION_S:
                used_slots += r.ask.cores
                committed += r.ask.mem_bytes
        return used_slots, committed
