"""One worker inside one job: join, claim, run, record, leave (see ``worker.py``).

Claims are guided: the first is one task (its time is unknown), then about
20 ms of work, a share of what is left that shrinks towards the end, never less
than ~2 ms of work. Tasks run one by one (each with its own outcome and log
range) until enough in a row took microseconds and printed nothing; the rest of
a claim then runs on the fast path, one loop per payload chunk and one range
record per 10 ms. Outcomes are written in task order, grouped per 10 ms, and
fsynced at least every 50 ms and before the worker waits or leaves.
"""

from __future__ import annotations

import mmap
import os
import select
import sys
import time

from ..folder import records
from ..folder.journal import reap
from ..folder.records import Kind, Record
from ..folder.store import CUR, JobStore, write_new, writev_all
from .context import TaskContext, set_current

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from typing import Any

    from .worker import Worker

_FLUSH_S = 0.01  # group outcomes that finish within 10 ms into one write
_SYNC_S = 0.05  # ... and fsync at least this often (and before waiting for work or leaving)
_QUIET_BEFORE_FAST = 8  # tasks in a row without output before the fast path is used
_FAST_TASK_S = 0.001  # ... and only for tasks that take less than this
_TARGET_BATCH_S = 0.02  # a claim should hold about 20 ms of work
_MIN_BATCH_S = 0.002  # ... and no less than this, even at the end of a job
_MAX_BATCH = 32768
_WAIT = object()
_NO_CLAIM = object()  # no claim made yet (claim at the top of the loop); given tasks: no queue at all
_PY_VERSION = sys.version.split()[0]


class JobRun:
    """The state of one worker inside one job."""

    def __init__(self, worker: Worker, store: JobStore, meta: dict[str, Any], tasks: list[int] | None) -> None:
        self.w = worker
        self.store = store
        self.meta = meta
        self.fixed = tasks
        self.wid = worker.wid
        self.seeding = meta.get("seed") is not None
        self.job_seed = int(meta.get("seed") or 0)
        self.cores = int(meta.get("cores_per_task", 1))
        self.retries = int(meta.get("retries", 0))
        self.payload: Any = None
        self.common: tuple[Any, Any] | None = None
        self.pending: list[tuple[Any, ...]] = []
        self.last_flush = self.last_sync = time.time()
        self.unsynced = False
        self.log_pos = 0
        self.mean_s = 0.0
        self.n_done = 0
        self.attempts: dict[int, int] = {}
        self.quiet = 0  # tasks in a row that printed nothing
        self.left = False  # recorded as left in the queue

    # -- set-up and tear-down ---------------------------------------------
    def join(self, lock_path: str) -> Any:
        """Become a member of the job and claim its first tasks, in one queue update.

        Returns the claim (as ``_claim``), or None when the job needs no more workers.
        Who this worker is (host, pid, python) is in its member entry.
        """
        w = self.w
        with self.store.locked_queue() as q:
            q.setdefault("dispatched", {}).pop(self.wid, None)  # arrived, whatever happens next
            if q.get("cancelled"):
                return None
            members = q["members"]
            active = sum(1 for x in members.values() if x.get("state") in ("active", "waiting"))
            if active >= q.get("max_workers", 1):
                return None
            m: dict[str, Any] = {
                "pid": w.pid,
                "host": w.host,
                "python": sys.executable,
                "version": _PY_VERSION,
                "lock": lock_path,
                "fifo": getattr(w, "fifo_path", ""),
                "claim": [],
                "state": "active",
                "joined": time.time(),
            }
            members[self.wid] = m
            return self._claim_in(q, m, *self._batch_size())

    def run(self, cur_fd: int, first: Any = None) -> None:
        """Run the job's tasks: ``first`` (a claim made at ``join``), then claims until none are
        left; ``_NO_CLAIM`` for a worker given its tasks (no queue membership)."""
        store, wid = self.store, self.wid
        if first is _NO_CLAIM:
            info = {"host": self.w.host, "pid": self.w.pid, "python": sys.executable,
                    "version": _PY_VERSION, "started": time.time()}
            # Written once, by this worker alone: no temporary file (a reader that
            # finds it half written takes it as unknown: JobStore.worker_info).
            write_new(store._p("workers", f"{wid}.json"), info)
        self.first = first
        self.cur = mmap.mmap(cur_fd, CUR.size)
        self.cur_index = memoryview(self.cur).cast("q")  # [0]: the task running now
        w = self.w
        if self.seeding:
            if w.seeder is None:
                from .seeding import TaskSeeder

                w.seeder = TaskSeeder()
            else:
                w.seeder.rearm()
        elif w.seeder is not None:
            w.seeder.disarm()
        self.res_fd = os.open(store.results_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.res_end = os.fstat(self.res_fd).st_size
        self.jfd = os.open(store.journal_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        log_fd = os.open(store.log_path(wid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        restore = self._enter_context()
        self.log_pos = os.lseek(1, 0, os.SEEK_END)
        self.ctx = TaskContext(
            index=-1, job=self.meta.get("name", ""), job_id=self.meta.get("id", ""),
            cores=self.cores, seed=0, job_seed=self.job_seed, host=self.w.host, _job_data=self._job_data,
            rank=self.w.mpi.get("rank"), size=self.w.mpi.get("size"),
        )
        token = set_current(self.ctx)
        try:
            self._loop()
        finally:
            _reset(token)
            try:
                self._flush()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                restore()
                os.dup2(self.w._saved_fds[0], 1)
                os.dup2(self.w._saved_fds[1], 2)
                for fd in (self.res_fd, self.jfd):
                    os.close(fd)
                self.cur_index.release()
                self.cur.close()
                if self.payload is not None:
                    self.payload.close()
                self._leave()

    def _enter_context(self) -> Any:
        meta = self.meta
        old_cwd = os.getcwd()
        old_path = list(sys.path)
        self.w.threads.enter(self.cores, meta.get("env"))  # before the env= it may make way for
        old_env = {k: os.environ.get(k) for k in meta.get("env", {})}
        files = self.store._p("files")
        cwd = meta.get("cwd")
        if not cwd or not os.path.isdir(cwd):
            cwd = files if os.path.isdir(files) else self.store.dir
        try:
            os.chdir(cwd)
        except OSError:
            pass
        front = [files] if os.path.isdir(files) else []
        for p in meta.get("sys_path", []):
            if p == "" or (os.path.isdir(p) and p not in front):
                front.append(p)
        sys.path[:] = front + [p for p in old_path if p not in front]
        for k, v in meta.get("env", {}).items():
            os.environ[k] = str(v)

        def restore() -> None:
            try:
                os.chdir(old_cwd)
            except OSError:
                pass
            sys.path[:] = old_path
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        return restore

    def _leave(self) -> None:
        if self.fixed is not None:
            return
        if self.left:
            self.store.notify()  # the claim that found nothing left recorded it
            return
        try:
            with self.store.locked_queue() as q:
                m = q["members"].get(self.wid)
                if m is not None and m.get("state") != "dead":
                    m["state"] = "left"
                    m["claim"] = []
        except FileNotFoundError:
            return  # purged: nothing to leave
        self.store.notify()

    # -- claiming -------------------------------------------------------------
    def _batch_size(self) -> tuple[int, int]:
        """(how many tasks to claim at most, at least): ~20 ms and ~2 ms of work."""
        if self.n_done == 0 or self.mean_s <= 0:
            return 1, 1
        want = max(1, min(_MAX_BATCH, int(_TARGET_BATCH_S / self.mean_s)))
        return want, max(1, min(want, int(_MIN_BATCH_S / self.mean_s)))

    def _claim(self, size: tuple[int, int]) -> Any:
        try:
            return self._claim_locked(*size)
        except FileNotFoundError:
            return None  # the job was withdrawn (its submission failed) or purged

    def _claim_locked(self, want: int, least: int = 1) -> Any:
        with self.store.locked_queue() as q:
            m = q["members"].get(self.wid)
            if m is None or m.get("state") == "dead" or q.get("cancelled"):
                return None
            return self._claim_in(q, m, want, least)

    def _claim_in(self, q: dict[str, Any], m: dict[str, Any], want: int, least: int) -> Any:
        """Claim tasks in queue state ``q`` (locked) for member ``m``."""
        store = self.store
        if not q.get("submitted"):
            # Started early, while the client still writes the inputs.
            if time.time() - m.get("joined", 0) > 60:
                m["state"] = "left"
                return None
            m["state"] = "waiting"
            return _WAIT
        skip = set(q.get("cancelled_tasks", ()))
        for _ in range(2):
            if q["retry"]:
                take = [i for i in q["retry"][:want] if i not in skip]
                del q["retry"][:want]
                if not take:
                    continue
                self.attempts = {i: q["attempts"].get(str(i), 0) for i in take}
                m["claim"] = [-1, *take]
                m["state"] = "active"
                return take
            remaining = q["n"] - q["next"]
            if remaining > 0:
                active = sum(1 for x in q["members"].values() if x.get("state") in ("active", "waiting"))
                # Guided: a share of what is left, shrinking towards the end, but
                # never less than ~2 ms of work (a claim costs a lock and a
                # rewrite of queue.json). When what is left is a few ms of work
                # per worker, it is split evenly at once.
                active = max(1, active)
                share = -(-remaining // active)
                if remaining * self.mean_s > _TARGET_BATCH_S * active / 2 or self.n_done == 0:
                    share = -(-share // 2)
                k = min(remaining, max(least, min(want, share)))
                a = q["next"]
                q["next"] = a + k
                m["state"] = "active"
                if skip and any(i in skip for i in range(a, a + k)):
                    kept = [i for i in range(a, a + k) if i not in skip]
                    m["claim"] = [-1, *kept]
                    return kept
                m["claim"] = [a, a + k]
                return range(a, a + k)
            m["claim"] = []
            if not reap(store, q):
                break
        if q.get("closed"):
            m["state"] = "left"
            m["claim"] = []
            self.left = True
            return None
        m["state"] = "waiting"
        return _WAIT

    def _loop(self) -> None:
        if self.fixed is not None:
            q = self.store.queue()
            self.attempts = {i: int(q.get("attempts", {}).get(str(i), 0)) for i in self.fixed}
            skip = set(q.get("cancelled_tasks", ()))
            self._run_batch([i for i in self.fixed if i not in skip])
            return
        claim = self.first
        while True:
            if claim is _NO_CLAIM:
                claim = self._claim(self._batch_size())
            if claim is None:
                return
            if claim is _WAIT:
                self._flush()
                self._wait_for_work()
                claim = _NO_CLAIM
                continue
            self._run_batch(claim)
            # Durable at least every _SYNC_S, and before the worker waits or leaves.
            self._flush(sync=time.time() - self.last_sync > _SYNC_S)
            claim = _NO_CLAIM

    def _wait_for_work(self) -> None:
        fd = self.w.fifo_fd
        if fd < 0:
            time.sleep(0.05)
            return
        r, _, _ = select.select([fd], [], [], 1.0)
        if r:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                data = b""
            # A job path arriving now is for later; keep it for the pool loop.
            lines = data.split(b"\n")
            keep = [x for x in lines if x and x != b"!"]
            if keep:
                self.w._pending += b"\n".join(keep) + b"\n"

    # -- running ----------------------------------------------------------------
    def _load_payload(self) -> Any:
        if self.payload is None:
            from ..folder.payload import PayloadReader

            self.payload = PayloadReader(self.store._p("payload.log"))
        return self.payload

    def _common(self) -> tuple[Any, Any]:
        if self.common is None:
            self.common = self._load_payload().common()
        return self.common

    def _job_data(self) -> Any:
        return self._common()[1]

    def _run_batch(self, indices: Any) -> None:
        """Run a claim: the fast path for floods of quiet, tiny tasks, else one by one.

        Tasks run one by one until enough in a row have printed nothing and taken
        microseconds; the rest of the claim then runs on the fast path.
        """
        if not isinstance(indices, range) or len(indices) < 2 or self.attempts or self.w.mpi:
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

    def _run_fast(self, indices: range) -> None:
        """Tasks that took microseconds and printed nothing: run a chunk in one loop,
        one range record per run of successes (see records.py), one log check per batch."""

        seeder = self.w.seeder if self.seeding else None
        payload = self._load_payload()
        fn = None
        ctx = self.ctx
        cur, cur_index = self.cur, self.cur_index
        js = self.job_seed
        i, stop = indices.start, indices.stop
        # One range record for as many chunks of the payload as run within _FLUSH_S.
        values: list[Any] = []
        append = values.append
        start = i
        t0 = time.time()
        log_off = self.log_pos
        while i < stop:
            run = payload.args_run(i)
            if run is None:  # tasks with their own function or keywords: one by one
                self._emit_range(start, values, t0, log_off)
                self._run_each(range(i, stop))
                return
            if fn is None:
                fn = self._common()[0]
            first, args, single = run
            end = min(stop, first + len(args))
            CUR.pack_into(cur, 0, i, t0, log_off)
            j = i
            try:
                # without seeds, two copies of one loop: the per-task work is a handful of bytecodes
                if seeder is None and single:
                    for j in range(i, end):
                        cur_index[0] = j
                        ctx.index = j
                        ctx.seed = js + j
                        append(fn(args[j - first]))
                elif seeder is None:
                    for j in range(i, end):
                        cur_index[0] = j
                        ctx.index = j
                        ctx.seed = js + j
                        append(fn(*args[j - first]))
                else:
                    begin = seeder.begin
                    seeder.job_seed = js
                    for j in range(i, end):
                        cur_index[0] = j
                        ctx.index = j
                        ctx.seed = js + j
                        if seeder.nothing_loaded:
                            seeder._index = j  # seeds a module the task loads (see seeding.py)
                        else:
                            if seeder.fired:
                                seeder.rearm()
                            begin(js, j)
                        append(fn(args[j - first]) if single else fn(*args[j - first]))
            except BaseException as exc:
                self._emit_range(start, values, t0, log_off)
                err = _describe_error(exc, self.w.host, j, js + j)
                log_end = os.lseek(1, 0, 2)
                self.pending.append((j, False, 0, self.log_pos, log_end - self.log_pos,
                                     t0, time.time(), js + j, err))
                self.log_pos = log_end
                self.quiet = 0
                i = j + 1
            else:
                i = end
                if time.time() - t0 < _FLUSH_S and i < stop:
                    continue  # the next chunk joins the same range
                self._emit_range(start, values, t0, log_off)
            values = []
            append = values.append
            start = i
            t0 = time.time()
            log_off = self.log_pos
        CUR.pack_into(cur, 0, -1, 0.0, 0)

    def _emit_range(self, start: int, values: list[Any], t0: float, log_off: int) -> None:
        """Write a range record for tasks start .. start+len(values)-1 (all succeeded)."""
        n = len(values)
        if not n:
            return
        flush_output()
        t1 = time.time()
        log_end = os.lseek(1, 0, 2)
        if log_end != log_off:
            self.quiet = 0  # output appeared: back to one by one, to attribute it per task
        self.log_pos = log_end
        self.n_done += n
        if n >= 64:
            self.mean_s = (t1 - t0) / n  # a long run measures well: trust it (claims adapt at once)
        else:
            self.mean_s += ((t1 - t0) / n - self.mean_s) / 2
        from ..folder import serial

        self._flush(sync=False)  # keep the journal in task order
        try:
            data, bufs = serial.dumps_plain(values)
        except Exception:
            # Some value cannot be pickled: record them one by one instead.
            for k, v in enumerate(values):
                self.pending.append((start + k, True, 0, log_off, 0, t0, t1, self.job_seed + start + k, v))
            return
        parts = records.pack_body(data, bufs)
        size = records.body_size(parts)
        off = self.res_end
        writev_all(self.res_fd, parts)
        self.res_end += size
        rec = Record(int(Kind.OK), 0, 0, start, 0, n, off, size, log_off, log_end - log_off, t0, t1,
                     _rss_bytes(), self.job_seed + start)
        os.write(self.jfd, records.pack_frame([rec]))
        self.unsynced = True
        self.last_flush = t1
        self.store.notify()

    def _run_each(self, indices: Any) -> None:
        """Run tasks one after another; the hot loop of every worker."""

        seeder = self.w.seeder if self.seeding else None
        payload = self._load_payload()
        ctx = self.ctx
        cur = self.cur
        pack_into = CUR.pack_into
        job_seed = self.job_seed
        attempts = self.attempts
        pending = self.pending
        now = time.time
        lseek = os.lseek
        stdout, stderr = sys.stdout, sys.stderr
        log_off = self.log_pos
        last_flush = self.last_flush
        last_sync = self.last_sync
        host = self.w.host
        mpi = self.w.mpi
        for idx in indices:
            seed = job_seed + idx
            attempt = attempts.get(idx, 0) if attempts else 0
            t0 = now()
            pack_into(cur, 0, idx, t0, log_off)
            ctx.index = idx
            ctx.seed = seed
            ctx.attempt = attempt
            ok = True
            tf = t0
            try:
                if seeder is not None:
                    if seeder.fired:
                        seeder.rearm()
                    seeder.begin(job_seed, idx)
                fn, args, kwargs = payload.task(idx)
                if fn is None:
                    fn = self._common()[0]
                tf = now()  # the task's own time, for claim sizes: not the loading of the payload
                value: Any = fn(*args, **kwargs)
            except BaseException as exc:
                ok = False
                value = _describe_error(exc, host, idx, seed)
                if mpi:
                    pending.append((idx, ok, attempt, log_off, lseek(1, 0, 2) - log_off, t0, now(), seed, value))
                    self._flush(sync=True)
                    print(f"elsewhere: rank {mpi['rank']} raised {value['type']}: {value['message']}; "
                          "aborting every rank", file=sys.stderr, flush=True)
                    _abort_mpi()
            try:
                stdout.flush()
                stderr.flush()
            except Exception:
                pass
            t1 = now()
            log_end = lseek(1, 0, 2)
            pending.append((idx, ok, attempt, log_off, log_end - log_off, t0, t1, seed, value))
            self.quiet = self.quiet + 1 if log_end == log_off else 0
            log_off = log_end
            n = self.n_done = self.n_done + 1
            self.mean_s += ((t1 - tf) - self.mean_s) / (n if n < 20 else 20)
            if t1 - last_flush > _FLUSH_S:
                sync = t1 - last_sync > _SYNC_S
                self.log_pos = log_off
                self._flush(sync=sync)
                last_flush = t1
                if sync:
                    last_sync = t1
        pack_into(cur, 0, -1, 0.0, 0)
        self.log_pos = log_off

    def _flush(self, sync: bool = True) -> None:
        """Write pending outcomes: bodies, then their journal frame; fsync if ``sync``."""
        if not self.pending:
            if sync and self.unsynced:
                os.fsync(self.res_fd)
                os.fsync(self.jfd)
                self.unsynced = False
                self.last_sync = time.time()
            return
        from ..folder import serial

        pending = self.pending
        values = [p[8] for p in pending]
        try:
            data, bufs = serial.dumps_plain(values)
        except Exception:
            data, bufs = self._dump_one_by_one()
        parts = records.pack_body(data, bufs)
        size = records.body_size(parts)
        off = self.res_end
        writev_all(self.res_fd, parts)
        self.res_end += size
        rss = _rss_bytes()
        ok_kind, err_kind = int(Kind.OK), int(Kind.ERROR)
        recs = [
            Record(ok_kind if p[1] else err_kind, 0, p[2], p[0], i, 1, off, size, p[3], p[4], p[5], p[6], rss, p[7])
            for i, p in enumerate(pending)
        ]
        if sync:
            os.fsync(self.res_fd)
        os.write(self.jfd, records.pack_frame(recs))
        if sync:
            os.fsync(self.jfd)
        self.unsynced = not sync
        pending.clear()
        self.last_flush = time.time()
        if sync:
            self.last_sync = self.last_flush
        self.store.notify()

    def _dump_one_by_one(self) -> tuple[bytes, list[memoryview]]:
        from ..folder import serial

        fixed = []
        for j, p in enumerate(self.pending):
            try:
                serial.dumps_plain(p[8])
                fixed.append(p[8])
            except Exception as exc:
                err = _describe_error(exc, self.w.host, p[0], p[7])
                err["message"] = f"the result of task {p[0]} cannot be serialised: {err['message']}"
                fixed.append(err)
                self.pending[j] = (p[0], False, *p[2:8], err)
        return serial.dumps_plain(fixed)


def _reset(token: Any) -> None:
    from .context import _current

    _current.reset(token)


def flush_output() -> None:
    """Push what a task printed to the log (before its log offsets are read)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass  # a task may have closed or replaced them


def _describe_error(exc: BaseException, host: str, index: int, seed: int) -> dict[str, Any]:
    import pickle
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    pickled: bytes | None = None
    try:
        data = pickle.dumps(exc, protocol=5)
    except Exception:
        # a class of the caller's script or of a module sent by value: it goes back by
        # value too, and the caller's cloudpickle maps it to the caller's own class
        try:
            from ..folder.serial import dumps_inband

            data = dumps_inband(exc)
        except Exception:
            data = b""
    if data:
        try:
            pickle.loads(data)  # exceptions with odd __init__ may pickle but not load
            pickled = data
        except Exception:
            pass
    t = type(exc)
    name = t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = f"<{name}>"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        message += (f" (a module a task imports must be importable on {host}: installed there, in a "
                    "folder of the job's sys.path that it shares, or sent with files=[...])")  # fmt: skip
    return {
        "__elsewhere_error__": 1,
        "type": name,
        "message": message,
        "traceback": tb,
        "host": host,
        "pid": os.getpid(),
        "index": index,
        "seed": seed,
        "exception": pickled,
    }

def _rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def _abort_mpi() -> None:
    """A rank failed: stop every rank now, rather than leave them in a collective."""
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    except Exception:
        os._exit(1)
