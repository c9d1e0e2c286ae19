"""A lane, the task process's side: a controller's connection served by the task process.

The worker daemon admits a controller's ASK that asks for a lane (on a connection of its
own, see "Lanes" in docs/peer-protocol.md), and hands that connection to an idle task
process: the socket over the Unix socket (``SCM_RIGHTS``), the connection's session (its keys,
sequence numbers and open admissions: :meth:`~.wire.Connection.session`) in a "lane" message.
The task process then reads the TASKs and writes the RESULTs itself, batch after batch, with
no hop through the daemon::

    controller ── TASK ──────────────────────> task process: run the batch
               <─ RESULT (+ ACCEPT of the next) ──┘

The lane holds one slot of the daemon's: one batch at a time, the next ASK accepted when the
batch ends (folded into its RESULT). Results are not kept until acknowledged: a lane that
breaks loses the batch it ran, which its controller places again. The lane ends when the
controller closes it, or the daemon wants the slot back (a "lane-end" message between
batches; the task process says BYE), and the task process tells the daemon with a
"lane-ended" message, then runs batches for the daemon again.

The daemon still watches the task process (its memory, its death) and counts the slot.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import time
from typing import Any

from .childmsg import send_message
from .messages import (
    Accept,
    Ask,
    Bye,
    Cancel,
    Error,
    Ping,
    Pong,
    Refuse,
    RefuseReason,
    Result,
    Task,
)
from .runs import (
    Run,
    build_result,
    cap_result,
    fill_unfinished,
    run_tasks,
    take_results,
    task_layout,
)
from .stream import Closed, ConnectionPump
from .wire import Connection, Limits, Received

__all__ = ["serve_lane"]

_POLL_MS = 1000  # the longest sleep between looks at the daemon's socket while the lane idles
_TELL_S = 0.5  # the daemon hears how many tasks a lane ran at most this often (and at its end)


class _Sink:
    """What :func:`~.runs.take_results` reads of a child: its run, and its pid."""

    __slots__ = ("pid", "run")

    def __init__(self, run: Run) -> None:
        self.run: Run | None = run
        self.pid = os.getpid()


class _Lane:
    """One lane: its connection, its slot, the parts of functions and jobs it was sent."""

    def __init__(self, child: Any, sock: socket.socket, header: dict[str, Any]) -> None:
        """``child``: the task process's state (``child._Child``: its reader of the daemon's
        socket, its runner, its leases; not imported here, which ``child`` imports)."""
        self.child = child
        self.conn = Connection.resumed(header["session"], limits=Limits(**header.get("limits", {})))
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.pump = ConnectionPump(sock, self.conn)
        assert self.conn.peer is not None
        self.caps = set(self.conn.peer.caps)
        self.controller = self.conn.peer.peer_id
        self.host = str(header.get("host", ""))
        self.max_result = int(header.get("max_result", Limits().max_body_bytes))
        self.poll_s = float(header.get("poll", 0.0))
        self.accepted: str | None = None  # the ASK accepted and not used yet (the slot's)
        self.held: collections.deque[str] = collections.deque()  # ASKs waiting for the slot
        self.parts: dict[str, tuple[Any, ...]] = {}  # function and job parts, by digest
        self.job: dict[str, Any] = {}  # of the last TASK
        self.batches = 0
        self.tasks = 0  # run, not told to the daemon yet
        self.told = time.monotonic()  # when the daemon was last told
        self.ending = ""  # why the lane ends once the batch in hand is done
        self.closed = False  # by the controller (no BYE to send it)
        self.held.append(str(header["ask"]))  # the lane's own ASK, open on the connection

    # -- the slot ----------------------------------------------------------
    def _give_slot(self, *, fold: list[str] | None = None) -> None:
        """The slot is free: to the first ASK waiting (folded into ``fold``, if given)."""
        if self.accepted is not None or not self.held or self.ending:
            return
        self.accepted = self.held.popleft()
        if fold is not None and "fold" in self.caps:
            fold.append(self.accepted)
        else:
            self.conn.send(Accept(self.accepted))

    # -- frames ------------------------------------------------------------
    def on_event(self, event: Any) -> None:
        if not isinstance(event, Received):
            return
        msg = event.message
        if isinstance(msg, Task):
            self.accepted = None
            nxt = msg.next_ask()
            if nxt is not None:
                self.held.append(nxt.task_id)
            self.run_batch(msg, event.buffers)
        elif isinstance(msg, Ask):
            if msg.lane or msg.cores != 1 or msg.mem_bytes or msg.time_s:
                self.conn.send(Refuse(msg.task_id, RefuseReason.BUSY, "a lane runs one task process's tasks "
                                      "without limits; ask on the controller's own connection"))  # fmt: skip
                return
            self.held.append(msg.task_id)
            self._give_slot()
        elif isinstance(msg, Cancel):
            if msg.task_id in self.held:
                self.held.remove(msg.task_id)
            elif self.accepted == msg.task_id:
                self.accepted = None
                self._give_slot()
        elif isinstance(msg, Ping):
            self.conn.send(Pong(msg.token))
        elif isinstance(msg, (Bye, Error)):
            self.ending, self.closed = self.ending or "closed by its controller", True
        # an ACK: nothing is kept here to forget

    def run_batch(self, msg: Task, buffers: tuple[Any, ...]) -> None:
        """Run the batch of a TASK and send its RESULT (the next ASK's ACCEPT folded in)."""
        info = msg.info
        try:
            ntask, nfn, njp, items = task_layout(info, len(buffers))
        except (KeyError, TypeError, ValueError) as exc:
            self.conn.send(Error("task", f"malformed TASK {msg.task_id!r}: {exc}"))
            self.ending = f"malformed TASK: {exc}"
            return
        digest, jdigest = str(info.get("fn") or ""), str(info.get("jpart") or "")
        if nfn:
            self.parts[digest] = tuple(bytes(b) for b in buffers[ntask : ntask + nfn])
        if njp:
            self.parts[jdigest] = tuple(bytes(b) for b in buffers[ntask + nfn :])
        for old in info.get("forget") or ():
            if isinstance(old, str) and old not in (digest, jdigest):
                self.parts.pop(old, None)
        for name, what in ((digest, "function"), (jdigest, "job part")):
            if name and name not in self.parts:
                self.conn.send(Error("task", f"TASK {msg.task_id!r} names a {what} never sent"))
                self.ending = f"TASK without its {what}"
                return
        fn_parts = self.parts.get(digest, ()) if digest else ()
        job_parts = self.parts.get(jdigest, ()) if jdigest else ()
        job = info.get("job") or {}
        self.job = job
        header = {"batch": msg.task_id, "job": job, "diary": str(info.get("diary", "always")), "items": items,
                  "fn": digest, "jpart": jdigest, "ntask": ntask, "nfn": len(fn_parts),
                  "forget": [d for d in info.get("forget") or () if isinstance(d, str)]}  # fmt: skip
        run = Run(self.batches, self.controller, msg.task_id, Ask(msg.task_id),
                  {"items": items, "job": job, "run": items})  # fmt: skip
        sink = _Sink(run)
        run.child = sink  # type: ignore[assignment]  # (its pid, in the RESULT)
        started = time.monotonic()

        def deliver(h: dict[str, Any], body: list[Any], fds: list[int]) -> None:
            take_results(sink, h, memoryview(b"".join(body)), fds)  # type: ignore[arg-type]

        parts = [*buffers[:ntask], *fn_parts, *job_parts]
        del buffers
        self.child.run_parts(header, parts, [], deliver)
        self.batches += 1
        self.tasks += len(items)
        if run_tasks(run) < len(items):  # (every task reports; but never a RESULT short of one)
            fill_unfinished(run, -1, None, "", b"", 0.0, os.getpid(), self.host)
        cap_result(run, self.max_result, self.host)
        result_info, result_buffers = build_result(run, self.host, time.monotonic() - started,
                                                   runs="runs" in self.caps)  # fmt: skip
        folded: list[str] = []
        self._give_slot(fold=folded)
        self.conn.send(Result.made(msg.task_id, result_info, tuple(folded)), result_buffers)
        self.flush()
        if time.monotonic() - self.told >= _TELL_S:  # (after the RESULT: off its path)
            send_message(self.child.sock, self.progress())

    def progress(self) -> dict[str, Any]:
        """The "lane-tasks" message: the tasks run since the last, the parts held."""
        out = {"op": "lane-tasks", "tasks": self.tasks, "parts": len(self.parts)}
        self.tasks, self.told = 0, time.monotonic()
        return out

    # -- the socket ----------------------------------------------------------
    def flush(self) -> None:
        """Send what the connection holds, waiting for the socket as long as it takes."""
        while not self.pump.flush():
            select.select([], [self.sock], [], 1.0)

    def serve(self) -> str:
        """Serve the lane until it ends; why it ended."""
        daemon = self.child.reader
        listen = select.poll()
        listen.register(self.sock, select.POLLIN)
        listen.register(daemon.sock, select.POLLIN)
        self._give_slot()
        idle_until = 0.0
        try:
            while True:
                self.flush()
                self._from_daemon()
                if self.ending:
                    if not self.closed:  # (a slot granted and unused: its controller places it again)
                        self.conn.send(Bye(self.ending[:200]))
                        self.flush()
                    return self.ending
                try:
                    events = self.pump.read()
                except Closed:
                    return "closed by its controller"
                if events:
                    for event in events:
                        self.on_event(event)
                    if self.pump.failed is not None:
                        raise self.pump.failed
                    idle_until = time.monotonic() + self.poll_s
                    continue
                if time.monotonic() < idle_until:
                    os.sched_yield()  # the next task of a stream often comes within moments
                    continue
                if self.tasks:  # idle: the daemon hears of the last tasks now
                    send_message(self.child.sock, self.progress())
                listen.poll(_POLL_MS)
        except Closed:
            return "closed by its controller"
        except Exception as exc:  # the socket failed; a protocol error of the controller's
            return f"its connection failed: {exc}"

    def _from_daemon(self) -> None:
        """What the daemon said meanwhile: give the slot back, release result memory, stop."""
        messages, open_ = self.child.reader.read_available()
        if not open_:
            self.ending = "the worker is gone"
        for header, _body, fds in messages:
            op = header.get("op")
            if op == "lane-end":
                self.ending = self.ending or str(header.get("why") or "the worker took its slot back")
            elif op == "release":
                self.child.leases.release([int(i) for i in header.get("ids", [])])
            elif op == "exit":
                self.ending = self.ending or "the worker is stopping"
            for fd in fds:
                os.close(fd)


def serve_lane(child: Any, fds: list[int], header: dict[str, Any]) -> dict[str, Any]:
    """Serve the lane of a "lane" message (its socket in ``fds``); the "lane-ended" message for
    the daemon (why, how many batches, and what the last message of a batch tells)."""
    sock = socket.socket(fileno=fds[0])
    for fd in fds[1:]:
        os.close(fd)
    lane = _Lane(child, sock, header)
    try:
        why = lane.serve()
    finally:
        lane.conn.close()
        sock.close()
    report: dict[str, Any] = {"op": "lane-ended", "why": why, "batches": lane.batches, "tasks": lane.tasks,
                              "job": child.job_id and {"id": child.job_id, **lane.job}}  # fmt: skip
    child._finish(report)
    return report
