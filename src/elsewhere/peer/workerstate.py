"""What the worker daemon holds: its offer, its connections, its runs and children.

:class:`WorkerState` is the state that the parts of the
:class:`~.daemon.PeerWorker` share (each part is a mixin of it, in a module of
its own: see :mod:`.daemon`), all made by its constructor from the
:class:`~.options.WorkerOptions`:

- who it is and what it offers: ``options``, ``key`` (``keywatch``: its files,
  read again when a rotation changes them), ``peer_id``, ``identity``, ``mem_total``;
- its connections: ``peers`` (all), ``handshaking`` (those still in their
  handshake, oldest first), ``by_controller`` (the live connection of each
  controller), ``gone_since`` (when one that left still had runs here);
- the work: ``admission`` (held ASKs, and admissions until their TASK),
  ``fair`` (use per controller), ``queued`` (TASKs waiting for a child),
  ``running`` (runs on children), ``children``, ``pool`` (the shared memory
  received buffers live in), ``unacked`` (results kept until their ACK);
- the selector loop's: ``sel``, ``waker``, ``_corked`` and ``_folding`` (frames
  and ACCEPTs that leave together with a RESULT), ``_poll_until``;
- its life: ``started``, ``last_busy``, ``tasks_done``, ``draining``,
  ``hand_back``, ``stopping``; and ``stats``, its counters.
"""

from __future__ import annotations

import collections
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from ..util.system import CoreWatch, require_proc
from .admission import Admission, Peer
from .announce import new_peer_id
from .children import ChildProcess
from .discovery import Announcer, Listener
from .fairshare import FairShare
from .handshake import EphemeralKeys
from .keywatch import KeyWatch
from .messages import Ask, Greeting, Identity, RefuseReason, Task
from .net import Waker
from .options import WorkerOptions, machine_memory
from .runs import Done, Run
from .stream import SharedBuffers

if TYPE_CHECKING:
    from .childmsg import Outcome

__all__ = ["WorkerState"]


class WorkerState:
    """The state of the worker daemon (see the module doc)."""

    if TYPE_CHECKING:  # what the parts call of each other (each defined in its own module)

        # .daemon
        def _drain(self, why: str) -> None: ...

        # .inbound
        def _send(self, peer: Peer, message: Any, buffers: Any = ()) -> None: ...
        def _flush(self, peer: Peer) -> None: ...
        def _close(self, peer: Peer, why: str, *, abort: bool = False) -> None: ...

        # .intake
        def _on_ask(self, peer: Peer, ask: Ask) -> None: ...
        def _on_task(self, peer: Peer, msg: Task, buffers: tuple[Any, ...]) -> None: ...
        def _on_cancel(self, peer: Peer, task_id: str) -> None: ...
        def _refuse(self, peer: Peer, ask: Ask, reason: RefuseReason, detail: str) -> None: ...
        def _admit(self) -> None: ...

        # .dispatch
        def _dispatch(self) -> None: ...
        def _flush_child(self, child: ChildProcess) -> None: ...
        def _spawn_child(self) -> ChildProcess: ...
        def _kill_run(self, run: Run, outcome: Outcome | None, why: str) -> None: ...

        # .delivery
        def _complete(self, run: Run) -> None: ...
        def _max_result(self, peer: Peer | None) -> int: ...
        def _finish_unstarted(self, run: Run) -> None: ...
        def _free_buffers(self, run: Run, released: list[int] | None) -> None: ...
        def _forget_done(self, done: Done) -> None: ...

        # .lanes
        def _lane_handshake(self, peer: Peer, g: Greeting) -> bool: ...
        def _lane_refusal(self, peer: Peer, ask: Ask) -> str: ...
        def _start_lane(self, peer: Peer, ask: Ask, run: Run) -> None: ...
        def _start_waiting_lanes(self) -> None: ...
        def _lane_ended(self, child: ChildProcess, header: dict[str, Any]) -> None: ...
        def _lane_tasks(self, child: ChildProcess, header: dict[str, Any]) -> None: ...
        def _lane_died(self, run: Run) -> None: ...
        def _cancel_on_lanes(self, peer: Peer, tasks: tuple[int, ...]) -> None: ...
        def _take_lanes_back(self) -> None: ...
        def _end_lanes(self, why: str) -> None: ...
        def _lane_for(self, run: Run) -> None: ...

        # .offer
        def _free(self, now: float) -> tuple[int, int]: ...
        def _mem_total(self) -> int: ...
        def _time_offer(self, now: float) -> float: ...

    def __init__(self, options: WorkerOptions) -> None:
        require_proc("a peer worker")  # it reads /proc: say so here, not deep inside later
        self.options = options
        self.key = options.key
        self.keywatch = KeyWatch(options.group_keys())  # the key files, read again when they change
        self.ephemeral = EphemeralKeys(reuse_s=10.0)  # the handshakes' X25519 shares, kept 10 s
        self.peer_id = new_peer_id()
        self.identity = Identity(self.peer_id, options.user[:256], options.host[:256])
        self.fair = FairShare(options.half_life_s, enabled=options.fair_share)
        self.pool = SharedBuffers()
        total = machine_memory()  # once: reading it costs ~100 us, and it does not change
        self.mem_total = min(total, options.memavail) if options.memavail is not None else total
        self.sel = selectors.DefaultSelector()
        self.peers: set[Peer] = set()
        self.handshaking: dict[Peer, None] = {}  # in their handshake, oldest first
        self.by_controller: dict[str, Peer] = {}
        self._corked: set[Peer] | None = None  # peers whose frames wait to leave together
        self._folding: tuple[Peer, list[str]] | None = None  # ACCEPTs for the RESULT being made
        self.admission = Admission(self.fair)  # held ASKs, and admissions until their TASK
        self.queued: collections.deque[Run] = collections.deque()  # TASK received, no child free
        self.running: dict[int, Run] = {}  # seq -> run on a child
        self.children: list[ChildProcess] = []
        self.unacked: dict[str, dict[str, Done]] = {}
        self.lanes_waiting: list[tuple[Peer, Ask, Run]] = []  # admitted lanes waiting for a task process
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
        self._cores = CoreWatch()  # it polls only while a core is free
        self._last_tick = 0.0
        self._last_stats = 0.0
        self._last_mem_check = 0.0
        self._signals = 0
        self.waker = Waker()  # signals and request_stop() wake the loop
        self._capture_fds: list[int] = []
        self.listen_sock: socket.socket | None = None
        self.announcers: list[Announcer] = []  # one per group served
        self.listener: Listener | None = None  # one for every group served
        self._watch_thread: threading.Thread | None = None
        self.address: tuple[str, int] = ("", 0)
        self._ready = threading.Event()
