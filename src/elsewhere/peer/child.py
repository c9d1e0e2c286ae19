"""The task process of a peer worker daemon: ``python -m elsewhere.peer.child SOCK_FD CUR_FD``.

The daemon never unpickles anything: it hands the authenticated bytes of a TASK to a task
process and gets pickled results back. A task process is started once and runs batch after
batch, so a task does not pay for a fresh interpreter. When a task crashes it, or the daemon
kills it for running past the time or memory it was admitted under, only the task process
dies; the daemon starts another::

    daemon                                    task process
    ------                                    ------------
    "run" {job, items, parts}  + memfds  -->  unpickle (fn, job_data) and the batch; enter
                                              the job once (cwd, sys.path, env, threads, seeds,
                                              ew.task(): the task runner of run/runner.py)
                                              per task: run it, keep its output
                                      <--     "results" {items, group} + memfds
                                              (every 10 ms and at the end of a batch)
    "lane" {session, ask, ...} + socket -->   serve a controller's connection (lane.py):
                                              its TASKs run, its RESULTs written, here
                                      <--     "lane-ended" {why, batches, dirty, ...}
    reads CUR (shared map) after a crash:     CUR = (task now running, since, log offset)
    which task was running                    (or SEVERAL while it loads or pickles for
                                              several tasks at once: they run again alone)

The messages are in ``childmsg.py``, the groups of results in ``childresults.py``, the
daemon's side in ``children.py``. The task process's stdout and stderr (file descriptors 1 and
2) are a memfd the daemon also holds: each task's output is the bytes written while it ran,
which the daemon can still read after a crash (a faulthandler traceback).

Tasks run on the interpreter of the peer, not the caller's: the caller's installed packages
are left out of ``sys.path``; a job's working directory that does not exist here is a scratch
folder of its own, where its ``files=`` are unpacked.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import socket
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from ..folder.store import CUR, SEVERAL
from ..run.runner import JobSetup, TaskOutcome, TaskRunner, flush_output, is_installed_path
from ..util.system import CoreWatch
from .childmsg import (
    GROUP_BYTES,
    HEAD,
    OOB_MEMFD_BYTES,
    MessageReader,
    Outcome,
    cut_parts,
    pack_message,
    send_message,
)
from .childresults import BatchResults, Leases

__all__ = [
    "CUR",
    "HEAD",
    "LOG_CAP",
    "OOB_MEMFD_BYTES",
    "MessageReader",
    "Outcome",
    "cut_parts",
    "main",
    "pack_message",
    "send_message",
]

LOG_CAP = 4 << 20
"""Most output kept per task (the end of it is kept)."""
_FLUSH_S = 0.01
_QUIET_BEFORE_FAST = 8  # tasks in a row without output before the fast path is used
_FAST_TASK_S = 0.001  # ... and only for tasks that take less than this
_FAST_MAX = 4096  # tasks in one run of the fast path at most
_RESET_LOG_AT = 16 << 20
_KEEP_IN = 8  # maps of the daemon's input memfds a task process keeps


class _Child:
    """The state of one task process: its runner, its job's files and its caches."""

    def __init__(self, sock: socket.socket, cur: mmap.mmap) -> None:
        self.sock = sock
        self.cur = cur
        self.reader = MessageReader(sock)
        self.runner = TaskRunner(socket.gethostname())
        self.base_modules = set(sys.modules)
        self._n_modules = len(sys.modules)
        self._dirty = False
        self.new_files: list[list[Any]] = []  # user modules' [file, mtime_ns, size] not yet reported
        self.job_id: str | None = None  # of the job entered
        self.common: dict[str, tuple[Any, Any]] = {}  # digest -> (fn, job_data) or (job_data, files)
        self.attached: set[tuple[str, str]] = set()  # (folder, digest) of files unpacked
        self.leases = Leases()
        self.in_maps: dict[Any, mmap.mmap] = {}  # (device, inode) of the daemon's memfds -> map
        self.warned = False
        self.fast_tasks = 0  # run on the fast path (_run_fast), not told to the daemon yet
        self._show = warnings.showwarning
        warnings.showwarning = self._showwarning

    def _showwarning(self, *args: Any, **kwargs: Any) -> None:
        self.warned = True
        self._show(*args, **kwargs)

    # -- the job's surroundings ------------------------------------------
    def enter_job(self, job: dict[str, Any]) -> None:
        """Enter the job of a batch, unless it is the one entered already."""
        job_id = str(job.get("id", ""))
        if job_id == self.job_id:
            return
        self.job_id = None  # until it is entered
        runner = self.runner
        try:
            setup = JobSetup.from_peer(job)
        except ValueError:
            self.enter_nowhere(job_id)
            raise  # every task of the batch says why
        runner.enter(setup, cur=self.cur, fallback_cwd=lambda: self.scratch(job_id), foreign_python=True)
        self.job_id = job_id

    def enter_nowhere(self, job_id: str) -> None:
        """A job that cannot be entered as it asks: its tasks run (to say why they cannot) in
        its scratch folder, with nothing of its own."""
        self.runner.enter(JobSetup(job_id=job_id), cur=self.cur, fallback_cwd=lambda: self.scratch(job_id))

    def attach_files(self, job: dict[str, Any], files: tuple[str, Any]) -> None:
        """The job's ``files=`` (digest, tar stream): unpacked into its scratch folder once,
        which goes in front of ``sys.path`` (see attached.py)."""
        dest = self.scratch(str(job.get("id", "job")))
        key = (dest, files[0])
        if key not in self.attached:
            from importlib import invalidate_caches

            from .attached import unpack_files

            unpack_files(files[1], dest)
            invalidate_caches()  # modules just written there are found
            self.attached.add(key)
        if sys.path[:1] != [dest]:
            with contextlib.suppress(ValueError):
                sys.path.remove(dest)
            sys.path.insert(0, dest)

    @staticmethod
    def scratch(job_id: str) -> str:
        import tempfile

        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)[:80] or "job"
        base = os.path.join(tempfile.gettempdir(), f"elsewhere-peer-{os.getuid()}")
        os.makedirs(base, mode=0o700, exist_ok=True)
        path = os.path.join(base, safe)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def dirty(self) -> bool:
        """Whether user modules (not the installation's) were imported by tasks.

        Checks only modules imported since the last call (a batch of tiny tasks
        must not pay for looking at every module again)."""
        if self._dirty or len(sys.modules) == self._n_modules:
            return self._dirty
        for name in set(sys.modules) - self.base_modules:
            self.base_modules.add(name)
            f = getattr(sys.modules.get(name), "__file__", None)
            if f and not is_installed_path(f) and "elsewhere" not in name:
                self._dirty = True
                try:
                    st = os.stat(f)
                    self.new_files.append([os.path.abspath(f), st.st_mtime_ns, st.st_size])
                except OSError:
                    self.new_files.append([os.path.abspath(f), -1, -1])  # never found unchanged
        self._n_modules = len(sys.modules)
        return self._dirty

    def _finish(self, header: dict[str, Any]) -> None:
        """What the last message of a batch tells the daemon besides the outcomes."""
        header["dirty"] = self.dirty()
        if self.new_files:
            header["user_files"], self.new_files = self.new_files, []
        reader = self.reader
        if reader.polls:  # how often it polled, awake, since its last batch
            header["polls"], reader.polls = reader.polls, 0
        if self.fast_tasks:  # tasks run on the fast path since its last batch
            header["fast"], self.fast_tasks = self.fast_tasks, 0

    # -- one batch -------------------------------------------------------
    def run(self, header: dict[str, Any], body: memoryview, fds: list[int]) -> None:
        """Run the batch of a "run" message; its results go to the daemon."""
        maps: list[tuple[int, Any, mmap.mmap]] = []
        # (no name here holds the parts: run_parts drops them before it looks whether the
        # daemon's maps are still in use)
        self.run_parts(header, cut_parts(header["parts"], body, fds, maps=maps, cache=self.in_maps), maps)

    def run_parts(self, header: dict[str, Any], parts: list[Any], maps: list[tuple[int, Any, mmap.mmap]],
                  deliver: Callable[[dict[str, Any], list[Any], list[int]], None] | None = None) -> None:  # fmt: skip
        """Run a batch whose buffers are ``parts`` (tasks, function, job part; ``maps``: those
        in the daemon's memfds); its results go to the daemon, or to ``deliver`` (a lane's)."""
        ntask = int(header["ntask"])
        nfn = int(header.get("nfn", len(parts) - ntask))
        task_parts, fn_parts, job_parts = parts[:ntask], parts[ntask : ntask + nfn], parts[ntask + nfn :]
        job = header.get("job") or {}
        digest = header.get("fn") or ""
        jdigest = header.get("jpart") or ""
        items: list[list[Any]] = header["items"]
        failure: BaseException | None = None
        entries: list[Any] = []
        try:
            self.enter_job(job)
            for old in header.get("forget") or ():  # the daemon bounds what is kept here
                self.common.pop(old, None)
            if items:  # a crash while loading costs the batch's one task, or none of several
                self.runner.mark(int(items[0][0]) if len(items) == 1 else SEVERAL)
            if fn_parts and digest not in self.common:
                self.common[digest] = pickle.loads(fn_parts[0], buffers=fn_parts[1:])
            if job_parts and jdigest not in self.common:  # (job data, files or None)
                self.common[jdigest] = pickle.loads(job_parts[0], buffers=job_parts[1:])
            if jdigest and self.common.get(jdigest, (None, None))[1] is not None:
                self.attach_files(job, self.common[jdigest][1])
            entries = pickle.loads(task_parts[0], buffers=task_parts[1:])
            if not isinstance(entries, list) or len(entries) < len(items):  # items: what to run
                raise ValueError("the batch does not match its items")
        except BaseException as exc:  # e.g. a module that is not installed here
            failure = exc
        del task_parts, fn_parts, job_parts, parts
        if self.runner.setup is None:
            self.enter_nowhere(str(job.get("id", "")))
        common = self.common.get(digest, (None, None))
        if jdigest:  # the job data came in a part of its own
            common = (common[0], self.common.get(jdigest, (None, None))[0])
        self.runner.use_common(lambda: common)
        out = BatchResults(self.sock, header["batch"], leases=self.leases, error=self.runner.error,
                           finish=self._finish, maps=maps, mark=self.runner.mark, deliver=deliver,
                           group_bytes=int(header.get("group_bytes") or GROUP_BYTES))  # fmt: skip
        self._run_items(out, items, entries, failure, header.get("diary", "always"))
        if maps:
            out.send(last=False)  # values that share memory with the inputs are copied out now
            del entries, failure
            released = []
            for position, key, mm in maps:
                try:
                    mm.resize(len(mm))  # a no-op that fails while a task keeps a view of it
                    released.append(position)
                except BufferError:  # kept by the task (a global?): the daemon must not reuse it
                    self.in_maps.pop(key, None)
            while len(self.in_maps) > _KEEP_IN:
                old = self.in_maps.pop(next(iter(self.in_maps)))
                with contextlib.suppress(BufferError):
                    old.close()
            out.released = released
        out.send(last=True)

    def _run_items(self, out: BatchResults, items: list[list[Any]], entries: list[Any],
                   failure: BaseException | None, diary: str) -> None:  # fmt: skip
        """Run the batch's tasks, each seeing its own warnings once; outcomes go to ``out``
        (the last group of them is left there). After ``_QUIET_BEFORE_FAST`` tasks in a row
        that took less than ``_FAST_TASK_S`` and printed nothing, runs of them go through the
        runner's loop for floods of tiny tasks (:meth:`_run_fast`), as a local worker's do."""
        run = self.runner.run
        load: Any = entries.__getitem__
        if failure is not None:  # every task says why the batch cannot run here
            exc, tb = failure, failure.__traceback__

            def load(_pos: int) -> Any:
                raise exc.with_traceback(tb)  # (its own traceback, not one grown per task)

        with warnings.catch_warnings():  # the filters and hooks a task sets are its own
            w = _TaskWarnings()
            quiet, seen, mean_s, pos, n = 0, 0, 0.0, 0, len(items)
            while pos < n:
                if quiet >= _QUIET_BEFORE_FAST and mean_s < _FAST_TASK_S and w.mutated is not None and failure is None:
                    pos, quiet, mean_s = self._run_fast(out, items, entries, pos, mean_s, w, diary)
                    if pos >= n:
                        break
                index, attempt = items[pos]
                self.warned = False
                if w.mutated is None:
                    with warnings.catch_warnings():
                        o = run(int(index), int(attempt), load, pos)
                else:
                    w.mutated()  # each task sees each of its warnings once: the registries start over
                    o = run(int(index), int(attempt), load, pos)
                    w.undo()
                out.add(o, self._log(o, diary))
                quiet = quiet + 1 if o.ok and not o.log_len else 0
                seen += 1
                mean_s += (o.busy_s - mean_s) / min(seen, 20)
                del o
                pos += 1
                if time.time() - out.since >= _FLUSH_S:
                    out.send(last=False)
        self.runner.idle()

    def _run_fast(self, out: BatchResults, items: list[list[Any]], entries: list[Any], pos: int,
                  mean_s: float, w: _TaskWarnings, diary: str) -> tuple[int, int, float]:  # fmt: skip
        """Run the tasks from ``pos`` on in the runner's loop for tiny quiet tasks, as long as
        they are first attempts of consecutive tasks of the job's function and stay quiet, in
        runs of about ``_FLUSH_S``; (the position reached, the tasks quiet in a row, their mean
        time). Their outcomes share their run's times; a task that writes output keeps it
        (flushed and looked for after each task), and the tasks after its run go one by one."""
        runner = self.runner
        fn = runner.function()
        n = len(items)
        while pos < n:
            first = int(items[pos][0])
            limit = min(n, pos + max(2, min(_FAST_MAX, int(_FLUSH_S / max(mean_s, 1e-7)))))
            end = pos
            while end < limit:
                index, attempt = items[end]
                e = entries[end]
                if index != first + end - pos or attempt or e[0] is not None or e[2]:
                    break
                end += 1
            if end - pos < 2:
                return pos, 0, mean_s  # (the next one alone: its own function, a retry...)
            run = _FastRun(self, w.between, runner.log_pos)
            self.warned = False
            w.between()
            t0 = time.time()
            failed = runner.run_quiet(fn, [e[1] for e in entries[pos:end]], False, first, first,
                                      first + end - pos, run.add, t0)  # fmt: skip
            w.undo()
            flush_output()
            t1 = time.time()
            log_end = os.lseek(1, 0, os.SEEK_END)
            values, k = run.values, len(run.values)
            logs = {}
            for at, start, stop, warned in run.printed:
                self.warned = warned
                o = TaskOutcome(first + at, 0, True, None, t0, t1, start, stop - start, 0, 0.0)
                logs[at] = self._log(o, diary, reset=False)
            fail_log = b""
            if failed is not None:
                o = TaskOutcome(first + k, 0, False, None, t0, t1, run.mark, log_end - run.mark, 0, 0.0)
                fail_log = self._log(o, diary, reset=False)
            runner.log_pos = log_end
            self._reset_log(log_end)
            if k:
                out.add_run(first, values, t0, t1, logs)
                self.fast_tasks += k
                mean_s = (t1 - t0) / k
                pos += k
            if failed is not None:
                j, err = failed
                out.add(TaskOutcome(j, 0, False, err, t0, t1, run.mark, 0, runner.job_seed + j, 0.0), fail_log)
                return pos + 1, 0, mean_s  # errors, and the tasks after one, one by one
            if run.printed:
                return pos, 0, mean_s  # output appeared: one by one again
            if time.time() - out.since >= _FLUSH_S:
                out.send(last=False)
        return pos, _QUIET_BEFORE_FAST, mean_s


    def _log(self, o: TaskOutcome, diary: str, *, reset: bool = True) -> bytes:
        """The output of the task ``o`` that its job's ``diary`` keeps (``reset``: then the
        output file is emptied if it grew large)."""
        start, end = o.log_off, o.log_off + o.log_len
        keep = end > start and (
            diary == "always" or (diary == "warning" and (self.warned or not o.ok))
            or (diary == "error" and not o.ok)
        )  # fmt: skip
        data = b""
        if keep:
            length = end - start
            if length > LOG_CAP:
                cut = length - LOG_CAP
                data = f"[elsewhere: {cut} bytes of output cut here]\n".encode() + os.pread(1, LOG_CAP, end - LOG_CAP)
            else:
                data = os.pread(1, length, start)
        if reset:
            self._reset_log(end)
        return data

    def _reset_log(self, end: int) -> None:
        """Empty the output file once it holds ``_RESET_LOG_AT`` bytes (all of it read)."""
        if end > _RESET_LOG_AT:
            os.ftruncate(1, 0)
            os.lseek(1, 0, os.SEEK_SET)
            self.runner.log_pos = 0


class _FastRun:
    """The outcomes of one run of the fast path, task by task: :meth:`add` is the runner's
    ``append``, called after each task with its value."""

    __slots__ = ("between", "child", "mark", "printed", "values")

    def __init__(self, child: _Child, between: Callable[[], None], log_pos: int) -> None:
        self.child = child
        self.between = between
        self.mark = log_pos  # where the next task's output starts
        self.values: list[Any] = []
        self.printed: list[tuple[int, int, int, bool]] = []  # (k, start, end, warned) of tasks with output

    def add(self, value: Any) -> None:
        self.values.append(value)
        flush_output()
        end = os.lseek(1, 0, os.SEEK_END)
        if end != self.mark:  # this task wrote output: its own, as on the one-by-one path
            self.printed.append((len(self.values) - 1, self.mark, end, self.child.warned))
            self.mark = end
        self.child.warned = False
        self.between()  # for the next task (as the one-by-one path does around each)


class _TaskWarnings:
    """What each task of a batch sees of warnings, inside one ``catch_warnings`` for the
    batch: shown once per task ("default", the registries started over before each task:
    ``mutated``, None where CPython has no such call, and then a ``catch_warnings`` per
    task), and the filters and hook a task sets undone after it."""

    def __init__(self) -> None:
        self.mutated = getattr(warnings, "_filters_mutated", None)  # (CPython before 3.14)
        warnings.simplefilter("default")
        self.filters, self.kept, self.show = warnings.filters, warnings.filters[:], warnings.showwarning

    def undo(self) -> None:
        """After a task: its filters and hook go."""
        if warnings.filters is not self.filters or self.filters != self.kept:
            self.filters = warnings.filters = self.kept[:]
        if warnings.showwarning is not self.show:
            warnings.showwarning = self.show

    def between(self) -> None:
        """Between two tasks of a run on the fast path (the first included)."""
        self.undo()
        self.mutated()  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m elsewhere.peer.child SOCK_FD CUR_FD``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m elsewhere.peer.child SOCK_FD CUR_FD (started by the peer daemon)",
              file=sys.stderr)  # fmt: skip
        return 2
    import faulthandler
    import signal

    from ..run.results import peak_rss

    faulthandler.enable(file=sys.stderr, all_threads=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which drains
    sock = socket.socket(fileno=int(args[0]))
    cur_fd = int(args[1])
    cur = mmap.mmap(cur_fd, CUR.size)
    os.close(cur_fd)
    child = _Child(sock, cur)
    child.reader.cores = CoreWatch()
    send_message(sock, {"op": "ready", "pid": os.getpid(), "rss": peak_rss()})
    poll_until = 0.0
    while True:
        msg = child.reader.read_one(poll_until)
        if msg is None:
            return 0
        header, body, fds = msg
        op = header.get("op")
        if op == "run":
            child.run(header, body, fds)
            # The next batch of a stream of short ones (an Executor's next task) often comes
            # within moments: polling meanwhile saves a wake-up on its path (the daemon's
            # --busy-poll; 0: sleep at once).
            poll_until = time.monotonic() + float(header.get("poll", 0.0))
        elif op == "lane":  # a controller's connection, served here until it ends (lane.py)
            from .lane import serve_lane

            send_message(sock, serve_lane(child, fds, header))
            poll_until = 0.0
        elif op == "release":
            child.leases.release([int(i) for i in header.get("ids", [])])
        elif op == "exit":
            return 0
        else:
            for fd in fds:
                os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
