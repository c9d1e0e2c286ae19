"""What the worker daemon offers, and says of itself: slots, memory, time, counters.

The offer is the slots and memory not held by running, queued or admitted
batches (:meth:`~Offer._free`), the memory capped by what the machine has free
now, and the time left before ``maxtime`` (at most ``timavail`` a task).
Announcements carry it, with the worker's state (idle, busy, or zombie while
it drains) and the task it runs; the loop announces at once when that is news
(coalesced; see ``announce.is_news``), and when a new controller appears
(:meth:`~Offer._watch_controllers`, so that it finds this worker in milliseconds). The
counters go to the stats file (``--stats-file``) every second and at exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from ..util.paths import private_file
from .announce import PeerState
from .workerstate import WorkerState

__all__ = ["Offer"]


class Offer(WorkerState):
    """What :class:`~.daemon.PeerWorker` offers and announces (see the module doc)."""

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
        for run in self.running.values() if not self.options.encrypt or self.key is None else ():
            # (a worker that encrypts says nothing of a job in the clear)
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

    def _write_stats(self) -> None:
        path = self.options.stats_file
        if not path:
            return
        data: dict[str, Any] = dict(self.stats)
        if self.listener is not None:
            data["datagrams_dropped"] = self.listener.dropped
            data["datagrams_received"] = self.listener.received
        data["unacked"] = sum(len(done) for done in self.unacked.values())  # results kept
        data["function_parts"] = (sum(len(p.fns) for p in self.peers)  # kept for controllers (and by lanes)
                                  + sum(int(r.info.get("parts", 0)) for r in self.running.values()))  # fmt: skip
        data["handshaking"] = len(self.handshaking)  # connections not authenticated (yet)
        data["controllers"] = len(self.peers) - len(self.handshaking)
        data["pid"] = os.getpid()
        data["peer_id"] = self.peer_id
        data["port"] = self.address[1]
        data["children"] = [c.pid for c in self.children]
        data["running"] = len(self.running)
        # each controller's recent use here (for `elsewhere web`'s fair-share plot)
        data["fair_share"] = {c: {"use_s": round(use, 3), "user": getattr(self.by_controller.get(c), "user", ""),
                                  "host": getattr(self.by_controller.get(c), "host", "")}
                              for c, use in self.fair.snapshot(time.monotonic()).items()}  # fmt: skip
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(private_file(tmp), "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
