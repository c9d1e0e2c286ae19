"""The worker daemon's children: which runs a batch, and what becomes of them.

Batches run in child processes (``python -m elsewhere.peer.child``, see
:mod:`.children`) that are reused from task to task. A queued batch goes to an
idle child that may run it (:meth:`~Dispatch._may_run`: a clean one, or one that
imported only this job's modules, or those of a job of the same context whose
files are unchanged), the child with the job's modules first; when none may,
children are started, a few at a time, and idle ones that imported another
job's modules retired to make room. One clean child is kept warm.

A child sends back groups of results (the last ends its run, :mod:`.delivery`
sends the RESULT); a child that dies, sends garbage, or is killed (its task ran
past its admitted time or memory, its batch was cancelled or handed back) is
replaced, and its batch's unfinished tasks get their fate.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import time
from typing import Any

from ..folder.store import SEVERAL
from ..hosts.probe import usable_cores
from .childmsg import Outcome
from .children import ChildProcess, describe_exit, read_capture, tree_rss
from .net import watch_after_flush
from .runs import Run, build_run_message, fill_unfinished, take_results
from .workerstate import WorkerState

__all__ = ["Dispatch", "subtree_rss"]

log = logging.getLogger("elsewhere.peer.daemon")  # the daemon's log, whichever part writes

_MEM_CHECK_S = 0.25
_MAX_STARTING = max(1, usable_cores() // 2)
"""Children started at once to replace others (each start keeps a core busy a while)."""
_CHILD_FNS = 16  # function and job parts a child keeps unpickled (the daemon says which go)


def take_user_files(child: ChildProcess, header: dict[str, Any]) -> None:
    """The user modules a task process reports it imported (``user_files``), kept with it."""
    files = header.get("user_files")
    if isinstance(files, list):
        for f in files:
            with contextlib.suppress(TypeError, ValueError, IndexError):
                child.user_files.append((str(f[0]), int(f[1]), int(f[2])))


def subtree_rss(pids: list[int]) -> dict[int, int]:
    """The resident memory, in bytes, of each of ``pids`` with all its descendants (0 for a
    process that is gone), found down each tree through ``/proc/PID/task/TID/children``: a
    few reads a task process, where :func:`~.children.tree_rss` reads a file of every
    process of the machine (a millisecond or more for each check, four times a second while
    a task runs). That pass is the fallback where the kernel keeps no ``children`` files."""
    page = os.sysconf("SC_PAGE_SIZE")
    out = {}
    for root in pids:
        total, stack, seen = 0, [root], set()
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                with open(f"/proc/{pid}/statm", "rb") as f:
                    resident = int(f.read().split()[1]) * page
                threads = os.listdir(f"/proc/{pid}/task")
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            total += resident
            for tid in threads:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                        stack.extend(int(x) for x in f.read().split())
                except FileNotFoundError:
                    if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                        continue  # the thread ended meanwhile
                    return tree_rss(pids)  # a kernel without the children files
                except (OSError, ValueError):
                    continue
        out[root] = total
    return out


class Dispatch(WorkerState):
    """How :class:`~.daemon.PeerWorker` runs batches on its children (see the module doc)."""

    def _dispatch(self) -> None:
        """Start queued runs on idle children; start children as needed."""
        while self.queued:
            run = self.queued[0]
            busy = sum(r.ask.cores for r in self.running.values())
            if busy and busy + run.ask.cores > self.options.slots:
                # over-admitted (an unused admission lost its slot): wait for one; a slot a
                # lane holds comes back after the lane's batch (its controller's lane first)
                self._lane_for(run)
                return
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

    def _flush_child(self, child: ChildProcess) -> None:
        try:
            done = child.flush()
        except OSError:
            done = True  # it died: its socket will say so
        watch_after_flush(self.sel, child.sock, child, "child", done)

    def _on_child(self, child: ChildProcess) -> None:
        self._flush_child(child)
        try:
            messages, open_ = child.reader.read_available()
            for header, body, fds in messages:
                op = header.get("op")
                if op == "ready":
                    child.ready = True
                    child.base_rss = int(header.get("rss", 0))
                    if self.lanes_waiting:
                        self._start_waiting_lanes()
                elif op == "results":
                    self._on_results(child, header, body, fds)
                elif op == "lane-tasks":
                    self._lane_tasks(child, header)
                elif op == "lane-ended":
                    self._lane_ended(child, header)
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
        take_user_files(child, header)
        with contextlib.suppress(TypeError, ValueError):
            self.stats["child_busy_polls"] += int(header.get("polls", 0))
            self.stats["child_fast_tasks"] += int(header.get("fast", 0))
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
        if run is not None and run.info.get("lane"):
            self.stats["child_deaths"] += 1
            self._lane_died(run)
        elif run is not None:
            self.stats["child_deaths"] += 1
            self._free_buffers(run, None)  # its maps died with it
            run.leases = [(c, i) for c, i in run.leases if c is not child]
            culprit, why = run.kill if run.kill is not None else (
                Outcome.LOST, f"its process {describe_exit(code)}")  # fmt: skip
            tail = b""
            if culprit is not Outcome.REQUEUE:
                tail = read_capture(child.capture_fd, log_off)
            if idx == SEVERAL:
                idx = self._several(run, culprit)
            fill_unfinished(run, idx, culprit, why, tail, since, child.pid, self.options.host)
            self._complete(run)
        with contextlib.suppress(OSError):
            os.close(child.capture_fd)
        if not self.stopping and not self.hand_back and not child.retiring:
            self._spawn_child()  # (a retired child's successor was started with its retirement)
        self._dispatch()

    def _several(self, run: Run, culprit: Outcome) -> int:
        """The task a child's death costs when it died working for several of ``run``'s tasks
        at once (loading their inputs, pickling their values): none, and they run again each
        alone (``alone`` in the RESULT), where a death costs the task that did it; to a
        controller that cannot send them alone (it did not say ``alone``), the first, as
        before (they would otherwise run together, and kill a child, for ever)."""
        unfinished = [int(i) for i, _ in run.info.get("items", []) if int(i) not in run.outcomes]
        if culprit is Outcome.REQUEUE or not unfinished:
            return -1
        peer = self.by_controller.get(run.controller)
        if peer is not None and peer.conn.peer is not None and "alone" in peer.conn.peer.caps:
            run.alone = unfinished
            return -1
        return unfinished[0]

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
        rss = subtree_rss([c.pid for _, c, _ in measure])
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
