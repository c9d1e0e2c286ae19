"""One worker inside one job: join, claim, run, record, leave (see ``worker.py``).

Tasks run one by one through the worker's :class:`~.runner.TaskRunner`, each with its own
outcome and byte range of output, until enough in a row took microseconds and printed
nothing; the rest of a claim then runs on the fast path, one loop per payload chunk
(:meth:`~.runner.TaskRunner.run_quiet`) and one range record per 10 ms. Outcomes are
written in task order, grouped per 10 ms, and fsynced at least every 50 ms and before the
worker waits or leaves (``results.py``). Claims and their sizes: ``claims.py``.

However the loop ends, the worker accounts for its claim before it goes (:meth:`JobRun.run`):
done, it leaves; interrupted (KeyboardInterrupt, SystemExit) or out of memory or descriptors,
it writes itself off as lost (its running task lost or retried, the rest of its claim back to
the queue, for another worker); failed because of the job's files (a full disk, an I/O error,
a damaged job folder), it fails what it did not finish with its reason ("no space left on
<folder> (<n> bytes free)") and halts the job, since every worker would fail the same way, so
that a wait ends and ``job.retry()`` runs it all again once the cause is gone. A write that
fails is cut back to where it began, whichever thread made it (``ResultWriter``, results.py): a
full disk gets back the space the torn write took, and the journal stays whole.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
import time

from ..folder.store import CUR, write_new
from .claims import WAIT, Claims
from .kit import open_new
from .results import ResultWriter
from .runner import JobSetup, TaskOutcome, flush_output

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from typing import Any, Protocol

    from ..folder.store import JobStore
    from .kit import FileKit
    from .runner import TaskRunner

    class JobWorker(Protocol):
        """What a job run uses of its worker process (``worker.Worker``)."""

        wid: str
        host: str
        pid: int
        fifo_path: str  # its wake-up FIFO, "" if none
        runner: TaskRunner
        mpi: dict[str, int]  # rank and size, in a communicating job
        stdio: tuple[int, int]  # copies of its own stdout and stderr
        kit: FileKit | None  # its files made ahead for a job (a pool worker's)

        task_failed: bool  # a task it ran ended with an error (not run again)
        known: tuple[int, float, bool] | None  # its last job's function (common_check), s a task, quiet
        alone: bool  # given the tasks of a worker that died: each outcome written alone
        watcher: int  # the pid of the process that watches it (run/supervise.py), or 0

        def wait_for_work(self, timeout_s: float | None = None) -> None: ...

__all__ = ["JobRun"]

_FLUSH_S = 0.01  # group outcomes that finish within 10 ms into one write
_QUIET_BEFORE_FAST = 8  # tasks in a row without output before the fast path is used
_FAST_TASK_S = 0.001  # ... and only for tasks that take less than this
_PY_VERSION = sys.version.split()[0]
_NO_CLAIM = object()  # claim at the top of the loop
_OWN_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


class JobRun:
    """The state of one worker inside one job: ``tasks`` given to it, or None to claim them."""

    out: ResultWriter  # its results and journal, once opened (see run)

    def __init__(self, worker: JobWorker, store: JobStore, meta: dict[str, Any], tasks: list[int] | None) -> None:
        self.w = worker
        self.store = store
        self.setup = JobSetup.from_meta(meta)
        self.fixed = tasks
        self.runner = worker.runner
        self.claims = Claims(store, worker.wid, meta.get("client"))
        self.mpi = bool(worker.mpi)
        self.payload: Any = None
        self.mean_s = 0.0  # seconds a task takes, lately
        self.longest_s = 0.0  # ... and the longest so far (a claiming element's walltime)
        self.n_done = 0
        self.quiet = 0  # tasks in a row that printed nothing
        # retries=ew.Retry(on=...): errors run again (not the ranks of a communicating job)
        self.rerun_spec = meta.get("retry") if not worker.mpi else None
        self.deferred: list[tuple[float, int, int]] = []  # given tasks to run again: (due, task, attempt)
        self.after = list(meta.get("after") or ())  # the jobs it waits for (after=)
        self.tell_at_end = meta.get("notify") == "end"  # its client waits for the end alone (ew.map)
        self.stream = bool(meta.get("stream"))  # an open job (an Executor's): its payload grows

    def join(self, lock_path: str) -> Any:
        """Become a member of the job and claim its first tasks, in one queue update.

        Returns the claim, or None when the job needs no more workers. Who this worker is
        (host, pid, python) is in its member entry.
        """
        w = self.w
        guess_s = 0.0
        known = w.known
        if known is not None and not self.mpi and not self.stream:
            from ..folder.payload import common_check

            if common_check(self.store._p("payload.log")) == known[0]:
                guess_s = known[1]  # the function of its last job: as fast, most likely
                if known[2]:  # ... and as quiet: on the fast path from its first task (as it ended)
                    self.quiet, self.mean_s = _QUIET_BEFORE_FAST, guess_s
        return self.claims.join(pid=w.pid, host=w.host, lock=lock_path, fifo=w.fifo_path, mean_s=self.mean_s,
                                n_done=self.n_done, guess_s=guess_s)  # fmt: skip

    def run(self, cur_fd: int, first: Any = _NO_CLAIM) -> None:
        """Run the job's tasks: those given, or ``first`` (the claim made at ``join``), then
        claims until none are left. ``cur_fd``: the worker's ``workers/<w>.cur``."""
        failure: BaseException | None = None
        cur: mmap.mmap | None = None
        try:
            cur = mmap.mmap(cur_fd, CUR.size)
            self._open()
            files = self.store._p("files")
            has_files = os.path.isdir(files)
            self.runner.enter(self.setup, cur=cur, fallback_cwd=lambda: files if has_files else self.store.dir,
                              front=[files] if has_files else (), common=self._load_common)  # fmt: skip
            self._loop(first)
        except BaseException as exc:
            failure = exc
        failure = self._close(cur, failure)
        self._account(failure)
        check = self.payload.common_check() if self.payload is not None else None
        if check is not None and self.n_done and self.mean_s > 0:
            self.w.known = (check, self.mean_s, self.quiet >= _QUIET_BEFORE_FAST)  # for a next job of it
        if failure is not None:
            raise failure

    def _open(self) -> None:
        """The worker's files in the job: who it is (a worker given its tasks), its results and
        journal, its log as its stdout and stderr."""
        store, wid, w = self.store, self.w.wid, self.w
        if self.fixed is not None:
            info = {"host": w.host, "pid": w.pid, "python": sys.executable, "version": _PY_VERSION,
                    "started": time.time()}  # fmt: skip
            if os.environ.get("ELSEWHERE_SUBMISSION"):
                # An array element of a batch scheduler: the scheduler says when and why it
                # ended (FolderHandle.vanished leaves it to the backend's poll).
                info["element"] = True
            if self.w.watcher:  # its watcher accounts for its tasks should it die (run/supervise.py)
                info["watcher"] = self.w.watcher
            # Written once, by this worker alone: no temporary file (a reader that
            # finds it half written takes it as unknown: JobStore.worker_info).
            write_new(store._p("workers", f"{wid}.json"), info)
        self.out = ResultWriter(store, wid, self.runner.error, tell_at_end=self.tell_at_end, charge=self.runner.charge,
                                kit=w.kit)  # fmt: skip
        self.claims.on_empty = self.out.tell_client  # (its results were written before it claims)
        if not self.out.j_end:
            # An empty first frame: the journal's first block is taken now, while there is room,
            # so that on a full disk this worker can still write there why it stopped.
            self.out.append_frame([])
        log_fd = open_new(w.kit, "log", store.log_path(wid))
        flush_output()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)

    def _close(self, cur: mmap.mmap | None, failure: BaseException | None) -> BaseException | None:
        """Write what is pending (not after a full disk), put the process back as it was;
        the first failure, of the loop's or of these steps'."""
        w, out = self.w, getattr(self, "out", None)
        steps = [
            flush_output,
            self.runner.leave,
            lambda: os.dup2(w.stdio[0], 1),
            lambda: os.dup2(w.stdio[1], 2),
        ]
        if out is not None:
            steps.append(out.close)
            if not _disk_full(failure):
                # The job of an ew.map, which its caller purges once it has read the values, is
                # not synced at its end (during it, within SYNC_S as ever): nothing of it is kept,
                # and the fsyncs kept the worker from the next map half a millisecond and more
                end = self.tell_at_end and failure is None
                steps[:0] = [(lambda: out.flush(sync=False)) if end else out.flush, out.tell_client]
        if cur is not None:
            steps.append(cur.close)
        if self.payload is not None:
            steps.append(self.payload.close)
        for step in steps:
            try:
                step()
            except BaseException as exc:
                if failure is None:
                    failure = exc
        return failure

    def _account(self, failure: BaseException | None) -> None:
        """Leave the job, accounting for every task claimed (see the module)."""
        claims = self.claims
        try:
            if failure is None:
                if self.fixed is None:
                    claims.leave()
            elif not isinstance(failure, Exception) or own_trouble(failure):
                if self.fixed is None:
                    claims.lose()
            elif not isinstance(failure, FileNotFoundError) or os.path.isdir(self.store.dir):
                claims.fail(failure_reason(failure, self.store.dir, self.w), self.fixed)
        except FileNotFoundError:
            pass  # purged meanwhile: nothing to account for
        except Exception as exc:
            # (a disk still full): the claim stays, for whoever reaps this worker
            why = f"{type(exc).__name__}: {exc}"
            _say(f"elsewhere worker {self.w.wid}: could not leave job {self.store.dir}: {why}")

    def _loop(self, claim: Any) -> None:
        if self.after and self._gated():  # given its tasks, or claiming them (a packed element)
            return
        if self.fixed is not None:
            given = self.claims.fixed_attempts(self.fixed)
            self.claims.again = self.w.alone  # (the tasks of a worker that died: see run/supervise.py)
            self._run_batch(given)
            self._run_deferred()
            return
        while True:
            if claim is _NO_CLAIM and self._out_of_time():
                return  # an array element near its walltime: the rest is for other elements
            if claim is _NO_CLAIM:
                claim = self.claims.claim(self.mean_s, self.n_done)
            if claim is None:
                self.out.tell_client()  # (before the fsyncs of the end: see _close)
                return
            if claim is WAIT:
                self.out.flush()
                self.out.tell_client()
                if self.payload is not None:
                    self.payload.forget()  # nothing of the calls run is held while waiting
                wake_at = self.claims.wake_at
                if wake_at is None:
                    self.w.wait_for_work()
                else:  # a task held for a rerun: claim again when it is due (or when woken)
                    self.w.wait_for_work(min(1.0, max(0.01, wake_at - time.time())))
                claim = _NO_CLAIM
                continue
            self._run_batch(claim)
            # Durable within SYNC_S of being written, and before the worker waits or leaves.
            self.out.flush(sync=self.out.sync_due(time.time()))
            if self.claims.drained:  # the queue's last tasks: a client waiting for the end hears
                self.out.tell_client()  # of them now, not after a claim that finds nothing left
            claim = _NO_CLAIM

    def _out_of_time(self) -> bool:
        """Whether a claiming array element's walltime (``worker.deadline``) ends before
        another task of the longest kind it ran, twice over, and a second, would."""
        deadline = getattr(self.w, "deadline", None)
        return deadline is not None and time.time() + 2 * self.longest_s + 1.0 > deadline

    # -- the job's inputs ----------------------------------------------------------------
    def _load_payload(self) -> Any:
        if self.payload is None:
            from ..folder.payload import PayloadReader

            self.payload = PayloadReader(self.store._p("payload.log"))
        return self.payload

    def _load_common(self) -> tuple[Any, Any]:
        return self._load_payload().common()

    # -- running ----------------------------------------------------------------------------
    def _run_batch(self, indices: Any) -> None:
        """Run a claim: the fast path for floods of quiet, tiny tasks, else one by one.

        Tasks run one by one until enough in a row have printed nothing and taken
        microseconds; the rest of the claim then runs on the fast path.
        """
        if not isinstance(indices, range) or len(indices) < 2 or self.claims.attempts or self.mpi:
            self._run_each(indices)
            return
        i, stop = indices.start, indices.stop
        while i < stop:
            if self.quiet >= _QUIET_BEFORE_FAST and 0 < self.mean_s < _FAST_TASK_S:
                self._run_fast(range(i, stop))
                return
            step = max(1, _QUIET_BEFORE_FAST - self.quiet)
            self._run_each(range(i, min(stop, i + step)))
            i += step

    def _run_each(self, indices: Any) -> None:
        """Run tasks one after another, each its own outcome."""
        run = self.runner.run
        load = self._load_payload().task
        attempts = self.claims.attempts
        alone = self.claims.again  # tasks run again: each written alone (see ResultWriter._charge)
        out = self.out
        pending = out.pending
        for idx in indices:
            if pending or out.unsynced:  # outcomes wait for this task's, or results for an fsync:
                # written (synced) meanwhile should it take long
                out.begin_task()
                o = run(idx, attempts.get(idx, 0) if attempts else 0, load, idx)
                out.end_task()
            else:
                o = run(idx, attempts.get(idx, 0) if attempts else 0, load, idx)
            if not o.ok and not self.mpi:
                self._failed(o)  # (before it is pending: it is written flagged if run again)
            pending.append(o)
            if self.mpi and not o.ok:
                self._abort(o)
            self.quiet = 0 if o.log_len else self.quiet + 1
            n = self.n_done = self.n_done + 1
            self.mean_s += (o.busy_s - self.mean_s) / (n if n < 20 else 20)
            if o.busy_s > self.longest_s:
                self.longest_s = o.busy_s
            if alone or o.t_end - out.last_flush > _FLUSH_S:
                out.flush(sync=out.sync_due(o.t_end))
        self.runner.idle()

    def _run_fast(self, indices: range) -> None:
        """Tasks that took microseconds and printed nothing: a chunk of the payload in one loop,
        one range record per run of successes (see records.py), one log check per range."""
        runner, out = self.runner, self.out
        payload = self._load_payload()
        fn = None
        i, stop = indices.start, indices.stop
        # One range record for as many chunks of the payload as run within _FLUSH_S.
        values: list[Any] = []
        start = i
        t0 = time.time()
        log_off = runner.log_pos
        while i < stop:
            run = payload.args_run(i)
            if run is None:  # tasks with their own function or keywords: one by one
                self._emit_range(start, values, t0, log_off)
                self._run_each(range(i, stop))
                return
            if fn is None:
                fn = runner.function()
            first, args, single = run
            end = min(stop, first + len(args))
            failed = runner.run_quiet(fn, args, single, first, i, end, values.append, t0)
            if failed is not None:
                j, err = failed
                self._emit_range(start, values, t0, log_off)
                log_end = os.lseek(1, 0, os.SEEK_END)
                o = TaskOutcome(j, 0, False, err, t0, time.time(), runner.log_pos, log_end - runner.log_pos,
                                runner.job_seed + j, 0.0)  # fmt: skip
                self._failed(o)
                out.pending.append(o)
                runner.log_pos = log_end
                self.quiet = 0
                i = j + 1
            else:
                i = end
                if time.time() - t0 < _FLUSH_S and i < stop:
                    continue  # the next chunk joins the same range
                self._emit_range(start, values, t0, log_off)
            values = []
            start = i
            t0 = time.time()
            log_off = runner.log_pos
        runner.idle()

    def _emit_range(self, start: int, values: list[Any], t0: float, log_off: int) -> None:
        """Record tasks ``start .. start+len(values)-1``, which all succeeded, as one range."""
        n = len(values)
        if not n:
            return
        flush_output()
        t1 = time.time()
        log_end = os.lseek(1, 0, os.SEEK_END)
        if log_end != log_off:
            self.quiet = 0  # output appeared: back to one by one, to attribute it per task
        self.runner.log_pos = log_end
        self.n_done += n
        if n >= 64:
            self.mean_s = (t1 - t0) / n  # a long run measures well: trust it (claims adapt at once)
        else:
            self.mean_s += ((t1 - t0) / n - self.mean_s) / 2
        self.out.write_range(start, values, t0, t1, log_off, log_end - log_off, self.runner.job_seed + start)

    def _gated(self) -> bool:
        """Whether a job it waits for (``after=``) failed or was cancelled, as its folder says
        here, where its scheduler starts it once they ended, however they ended (Grid Engine's
        ``-hold_jid``: its cluster data says "check_after"): then this job is cancelled, with
        the reason, and nothing runs. A job whose folder is not seen from here (another
        machine's) is not looked at."""
        from ..folder.handle import JobHandle
        from ..folder.store import JobStore

        try:
            if not self.store.cluster_data().get("check_after"):
                return False  # its scheduler (or the library) waited for them to finish OK
        except (OSError, ValueError):
            return False
        for entry in self.after:
            path = entry.get("path") if isinstance(entry, dict) else None
            if not path or not os.path.exists(os.path.join(path, "job.json")):
                continue
            try:
                state = JobHandle(JobStore(path)).snapshot().job_state().value
            except Exception:  # unreadable here: the library's look says more
                continue
            if state in ("failed", "cancelled"):
                what = "failed" if state == "failed" else "was cancelled"
                with self.store.locked_queue() as q:
                    q.cancel_job(f"job {entry.get('name')!r}, which it waits for, {what}")
                self.store.notify()
                return True
        return False

    def _failed(self, o: TaskOutcome) -> None:
        """Task ``o.index`` raised: run it again if the job's ``retries=ew.Retry(on=...)`` says
        so (its record is then flagged: not the task's outcome), claimed from the queue once
        its wait is over (a task given to this worker: run again by it, after its others)."""
        spec = self.rerun_spec
        if spec is not None:
            from ..util.retry import rerun_delay

            delay = rerun_delay(spec, o.value, o.attempt)
            if delay is not None:
                self.out.rerun.add((o.index, o.attempt))
                if self.fixed is None:
                    self.claims.rerun_later(o.index, o.attempt + 1, delay)
                else:
                    self.deferred.append((time.time() + delay, o.index, o.attempt + 1))
                return
        self.w.task_failed = True

    def _run_deferred(self) -> None:
        """Run again, in the order they are due, the given tasks whose error is run again
        (waiting for each while nothing else is left to do; a rerun that fails again may
        come back)."""
        deferred = self.deferred
        while deferred:
            deferred.sort()
            due, index, attempt = deferred.pop(0)
            self.out.flush()
            wait = due - time.time()
            if wait > 0:
                if self.payload is not None:
                    self.payload.forget()
                time.sleep(wait)
            if index in self.store.queue().cancelled_tasks:
                continue
            self.claims.attempts[index] = attempt
            self._run_each([index])

    def _abort(self, o: TaskOutcome) -> None:
        """A rank failed: its outcome made durable, then every rank stopped now, rather than
        left waiting in a collective."""
        self.out.flush(sync=True)
        print(f"elsewhere: rank {self.w.mpi['rank']} raised {o.value['type']}: {o.value['message']}; "
              "aborting every rank", file=sys.stderr, flush=True)  # fmt: skip
        try:
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(1)
        except Exception:
            os._exit(1)


def own_trouble(exc: BaseException) -> bool:
    """A failure of this process alone (out of memory, of descriptors), not of the job: the
    worker goes as if it had vanished, and another takes over its claim."""
    return isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno in _OWN_ERRNOS)


def _disk_full(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    from ..util.system import is_disk_full  # (only now: a worker imports little)

    return is_disk_full(exc)


def failure_reason(exc: BaseException, folder: str, w: Any) -> str:
    """Why a worker failed, as its tasks' TaskError will say: a full disk names the folder
    and its free bytes; anything else, the worker and the error."""
    from ..util.system import is_disk_full, no_space

    if is_disk_full(exc):
        return no_space(folder)
    return f"the worker running it (pid {w.pid} on {w.host}) failed: {type(exc).__name__}: {exc}"


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except Exception:
        pass  # its log is on the full disk too
