"""What the controller tells: why tasks wait, what runs, what it did.

The *note* says why tasks wait when they do (no peer seen yet, and the command
that starts one; members refused for their clocks; no worker able to take the
tasks, each with its reason). ``job.check()`` shows it, a progress bar shows it
under the bar, an Executor logs it once it has stood a while (its
:class:`~elsewhere.util.progress.NoteTeller`). For a process other than the
controller's, the tasks on workers and the note are written to the job folder's
``peer-running.json`` once a second when they changed (:meth:`~Notes._show`).
:meth:`~Notes.running`, :meth:`~Notes.is_running` and :meth:`~Notes.counters`
answer any thread.
"""

from __future__ import annotations

import json
import logging
import os

from ..util.paths import write_private
from .controlstate import ControllerState

__all__ = ["RUNNING_FILE", "Notes"]

log = logging.getLogger("elsewhere.peer.controller")  # the controller's log, whichever part writes

RUNNING_FILE = "peer-running.json"
"""In the job folder: the tasks on workers now and the controller's note (see ``_show``)."""


class Notes(ControllerState):
    """What :class:`~.controller.Controller` tells others (see the module doc)."""

    def _update_note(self) -> None:
        """Say why tasks wait, if they do (after the workers were looked at)."""
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
        unknown = sorted(src for src, (_n, _why, authentic) in self.listener.refusals().items() if not authentic)
        if unknown:  # someone announces, under a key this controller does not hold
            return (f"waiting for peers: announcements from {', '.join(unknown[:5])} that no key here "
                    f"authenticates (another key for group {group!r}? copy the group's key file there, "
                    f"or here, with `elsewhere peer keygen`)")[:1000]  # fmt: skip
        return (f"waiting for peers: none seen yet in group {group!r} on discovery port {port}; start "
                f"one with `{cmd} --group {group}` where its key is")

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
            write_private(tmp, json.dumps({**shown, "pid": os.getpid()}))
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("cannot write %s: %s", path, exc)

    def counters(self) -> dict[str, int]:
        """What this controller did so far: asks (``asks_folded``: standing ASKs sent inside
        a TASK; ``accepts_folded``: ACCEPTs that came inside a RESULT), refusals by reason,
        batches, duplicates,
        bytes on the wire both ways (``bytes_sent``, ``bytes_received``) and the payload
        bytes they carried (``payload_bytes`` of tasks, ``result_bytes`` of results);
        ``caller_reads``: reads of a connection made by a thread waiting for a result
        (``Controller.wait_for``)."""
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

    def on_the_way(self) -> list[int]:
        """Tasks whose results came here and are on their way to the job folder (handed to
        the recorder, not yet durable): a walk over two sets of runs, not over every task."""
        with self.lock:
            return self.final.difference(self.written)

    def is_running(self, index: int) -> bool:
        """Whether task ``index`` is on a worker now (sent, no result yet)."""
        return index in self.running_view  # one lookup: atomic, no copy
