"""``python -m elsewhere.worker``: what every backend starts on the other side.

A worker joins a job folder, claims tasks in batches, runs them and appends
their outcomes to its own journal, then leaves::

    client ──writes──> job.json, payload.log, queue.json
       ^                         │
       │ notify.fifo             │ claim (flock on queue.lock)
       │                         v
    worker ──appends──> results/<w>.bin, journal/<w>.rec, logs/<w>.log

Modes:

- ``--job DIR``: join that job, run until it has nothing left, exit.
- ``--pool DIR``: a warm worker of the local backend. After a job it waits
  (idle) for the next one on its own FIFO, and exits after ``--idle-timeout``
  seconds without work. See ``clusters/local.py`` for the hand-over.
- ``--tasks SPEC`` with ``--job``: run exactly those tasks ("0:100" or
  "3,7,9") instead of claiming (array elements of batch schedulers).

Environment variables read (all optional; flags win): ``ELSEWHERE_JOB_DIR``,
``ELSEWHERE_TASKS``, ``ELSEWHERE_WORKER_ID``, and for array elements
``ELSEWHERE_SUBMISSION`` (a JSON list of chunks) with ``ELSEWHERE_ARRAY_VAR``
(the name of the scheduler's array index variable) and ``ELSEWHERE_ARRAY_BASE``:
element k runs chunk k - base. See docs/plugins.md.

It imports little: start-up time is part of every job's latency.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import select
import sys
import time

from . import records
from .context import TaskContext, set_current
from .records import Kind, Record
from .store import CUR, JobStore, reap, write_new, writev_all

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from typing import Any

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


class _Exit(Exception):
    """A client asked this idle worker to exit."""


def _rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _parse_tasks(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            a, b = part.split(":", 1)
            out.extend(range(int(a), int(b)))
        else:
            out.append(int(part))
    return out


class Worker:
    """One worker process: joins jobs, runs their tasks, writes outcomes."""

    def __init__(self, wid: str, pool: str | None = None, idle_timeout_s: float = 60.0) -> None:
        self.wid = wid
        self.pool = pool
        self.idle_timeout_s = idle_timeout_s
        self.host = os.uname().nodename
        self.pid = os.getpid()
        self.seeder: Any = None  # a seeding.TaskSeeder once a seeded job ran
        self._started_at = time.time()
        self._jobs_done = 0
        self._watched: list[str] = []  # files of loaded modules that may change under us
        self._watched_n = -1  # len(sys.modules) when _watched was made
        self._context_key: Any = None  # (cwd, sys.path, files) of the last job, and what they gave
        self._saved_fds = (os.dup(1), os.dup(2))
        self.fifo_fd = -1
        if pool:
            self.fifo_path = os.path.join(pool, "fifo", wid)
            os.mkfifo(self.fifo_path, 0o600)
            # Read-write so the FIFO never reports EOF when a writer closes.
            self.fifo_fd = os.open(self.fifo_path, os.O_RDWR | os.O_NONBLOCK)

    # -- pool life ----------------------------------------------------------
    def serve(self, first_job: str | None, tasks: list[int] | None = None) -> None:
        """Run ``first_job``, then (in pool mode) further jobs until idle too long."""
        job: str | None = first_job
        try:
            while True:
                if job:
                    if self._jobs_done and self._user_code_changed():
                        self._reexec(job)
                    self.run_job(job, tasks)
                    self._jobs_done += 1
                    tasks = None
                if not self.pool:
                    return
                try:
                    job = self._wait_for_job()
                except _Exit:
                    return
                if job is None:
                    return
        finally:
            if self.pool:
                for p in (os.path.join(self.pool, "idle", self.wid), self.fifo_path):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass

    def _wait_for_job(self) -> str | None:
        assert self.pool is not None
        marker = os.path.join(self.pool, "idle", self.wid)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        deadline = time.monotonic() + self.idle_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    os.unlink(marker)
                except FileNotFoundError:
                    # A client took us just now: its message is on its way.
                    return self._read_job(timeout_s=5.0)
                return None
            job = self._read_job(timeout_s=min(left, 5.0))
            if job:
                return job
            if not os.path.exists(marker) and not self._pending:
                # Taken, but the message has not arrived yet.
                return self._read_job(timeout_s=5.0)

    _pending = b""

    def _read_job(self, timeout_s: float) -> str | None:
        if b"\n" not in self._pending:
            r, _, _ = select.select([self.fifo_fd], [], [], timeout_s)
            if not r:
                return None
            try:
                self._pending += os.read(self.fifo_fd, 65536)
            except BlockingIOError:
                return None
        if b"\n" not in self._pending:
            return None
        line, self._pending = self._pending.split(b"\n", 1)
        if line == b"exit":
            raise _Exit
        return line.decode() or None

    def _user_code_changed(self) -> bool:
        """Whether a user module this worker has loaded, or elsewhere itself, changed on disk
        since it started."""
        if len(sys.modules) != self._watched_n:  # modules were loaded (or dropped) since
            from .serial import installed_prefixes

            system = installed_prefixes()
            self._watched_n = len(sys.modules)
            self._watched = []
            for name, mod in list(sys.modules.items()):
                f = getattr(mod, "__file__", None)
                # installed modules never change under a worker, except elsewhere itself
                # (reinstalled in place, same version: a warm worker must not run old code)
                if f and (not f.startswith(system) or name.startswith("elsewhere")):
                    self._watched.append(f)
        for f in self._watched:
            try:
                if os.stat(f).st_mtime > self._started_at:
                    return True
            except OSError:
                continue
        return False

    def _reexec(self, job: str) -> None:
        # The user's own modules changed since this warm worker imported
        # them: start afresh (same pid, so the hand-over stays valid).
        os.dup2(self._saved_fds[0], 1)
        os.dup2(self._saved_fds[1], 2)
        if self.fifo_fd >= 0:
            os.close(self.fifo_fd)
            os.unlink(self.fifo_path)
        argv = [sys.executable, "-m", "elsewhere.worker", "--job", job, "--wid", self.wid]
        if self.pool:
            argv += ["--pool", self.pool, "--idle-timeout", str(self.idle_timeout_s)]
        os.execv(sys.executable, argv)

    # -- one job --------------------------------------------------------------
    def run_job(self, job_dir: str, tasks: list[int] | None = None) -> None:
        """Join ``job_dir``, run tasks until none are left, leave."""
        try:
            self._run_job(job_dir, tasks)
        except FileNotFoundError as exc:
            # The job folder went away under us (purged): back to the pool.
            print(f"elsewhere worker {self.wid}: job {job_dir} is gone ({exc})", file=sys.stderr, flush=True)

    def _run_job(self, job_dir: str, tasks: list[int] | None) -> None:
        store = JobStore(job_dir)
        try:
            meta = store.meta()
        except FileNotFoundError:
            return  # purged before we got here
        # workers/<wid>.cur: which task runs now (a shared map), and the worker's
        # lock: held while it lives, released by the kernel however it ends.
        cur_path = store._p("workers", f"{self.wid}.cur")
        cur_fd = os.open(cur_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(cur_fd, CUR.pack(-1, 0.0, 0))
            fcntl.flock(cur_fd, fcntl.LOCK_EX)
            try:
                store.hold_queue()  # a claim is then a lock, two reads and a write
            except FileNotFoundError:
                pass  # a folder from before queue.b.json: opened per claim
            run = _JobRun(self, store, meta, tasks)
            first = run.join(cur_path) if tasks is None else _NO_CLAIM
            if first is not None:
                run.run(cur_fd, first)
        finally:
            store.release_queue()
            os.close(cur_fd)


class _JobRun:
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
            active = sum(1 for m in members.values() if m.get("state") in ("active", "waiting"))
            if active >= q.get("max_workers", 1):
                return None
            m = members[self.wid] = {
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
            rank=_MPI.get("rank"), size=_MPI.get("size"),
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
            from .payload import PayloadReader

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
        if not isinstance(indices, range) or len(indices) < 2 or self.attempts or _MPI:
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
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
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
        from . import serial

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
                if _MPI:
                    pending.append((idx, ok, attempt, log_off, lseek(1, 0, 2) - log_off, t0, now(), seed, value))
                    self._flush(sync=True)
                    print(f"elsewhere: rank {_MPI['rank']} raised {value['type']}: {value['message']}; "
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
        from . import serial

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
        from . import serial

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


def _describe_error(exc: BaseException, host: str, index: int, seed: int) -> dict[str, Any]:
    import pickle
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        data = pickle.dumps(exc, protocol=5)
        pickle.loads(data)  # exceptions with odd __init__ may pickle but not load
        pickled: bytes | None = data
    except Exception:
        pickled = None
    t = type(exc)
    name = t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = f"<{name}>"
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


class _Args:
    job: str | None
    pool: str | None
    wid: str | None
    idle_timeout: float
    tasks: str | None
    mpi: bool
    also: str


_FLAGS = ("--job", "--pool", "--wid", "--idle-timeout", "--tasks", "--also")


def _quick_args(argv: list[str]) -> _Args | None:
    """The flags the backends pass, without argparse (a worker's start-up is part of
    every cold job); None for anything else (--help, a typo), which argparse explains."""
    a = _Args()
    a.job, a.pool, a.wid = (os.environ.get("ELSEWHERE_JOB_DIR"), None, os.environ.get("ELSEWHERE_WORKER_ID"))
    a.idle_timeout, a.tasks, a.mpi, a.also = 60.0, os.environ.get("ELSEWHERE_TASKS"), False, ""
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--mpi":
            a.mpi = True
            i += 1
            continue
        if flag not in _FLAGS or i + 1 >= len(argv):
            return None
        value = argv[i + 1]
        if flag == "--idle-timeout":
            try:
                a.idle_timeout = float(value)
            except ValueError:
                return None
        else:
            setattr(a, flag[2:], value)
        i += 2
    return a


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m elsewhere.worker``."""
    args: Any = _quick_args(sys.argv[1:] if argv is None else argv)
    if args is None:
        args = _parse_args(argv)
    return _main(args)


def _parse_args(argv: list[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(prog="python -m elsewhere.worker", description=__doc__.split("\n")[0])
    p.add_argument("--job", default=os.environ.get("ELSEWHERE_JOB_DIR"))
    p.add_argument("--pool")
    p.add_argument("--wid", default=os.environ.get("ELSEWHERE_WORKER_ID"))
    p.add_argument("--idle-timeout", type=float, default=60.0)
    p.add_argument("--tasks", default=os.environ.get("ELSEWHERE_TASKS"))
    p.add_argument("--mpi", action="store_true", help="one rank of a communicating job: run task <rank>")
    p.add_argument("--also", default="", help="more worker ids (comma-separated): start a worker for each "
                   "by forking this one once it has started up (with --pool)")
    return p.parse_args(argv)


def _main(args: Any) -> int:
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=False)
    wid = args.wid or f"{os.uname().nodename}-{os.getpid()}-{os.urandom(3).hex()}"
    if args.pool:
        os.chdir("/")  # a pool worker outlives its client: hold none of its folders (each job sets its own)
    if args.also and args.pool:
        wid = _fork_workers(wid, [w for w in args.also.split(",") if w])
    if args.mpi:
        rank, size = mpi_rank_size()
        _MPI["rank"], _MPI["size"] = rank, size
        tasks: list[int] | None = [rank]
        wid = f"rank{rank}-{wid}"
    else:
        tasks = _parse_tasks(args.tasks) if args.tasks else _tasks_from_array_env()
    if tasks is not None and args.wid is None and os.environ.get("ELSEWHERE_ARRAY_VAR"):
        wid = f"a{os.environ.get(os.environ['ELSEWHERE_ARRAY_VAR'], '0')}-{wid}"
    if not args.job and not args.pool:
        print("python -m elsewhere.worker: nothing to do: give --job DIR and/or --pool DIR", file=sys.stderr)
        return 2
    if tasks is not None:
        _print_header(args.job, tasks)
    try:
        Worker(wid, args.pool, args.idle_timeout).serve(args.job, tasks)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            print(f"elsewhere worker {wid}: disk full: {exc}", file=sys.stderr)
            return 75
        raise
    return 0


def _fork_workers(wid: str, others: list[str]) -> str:
    """Start a worker for each of ``others`` by forking this process; the id this process goes on as.

    A forked worker skips the interpreter's start and the imports (a fresh
    one costs tens of milliseconds of CPU). Each leads its own session, like
    a worker started by the client, and is orphaned at once (a double fork),
    so that no process has to reap it.
    """
    for other in others:
        pid = os.fork()
        if pid == 0:
            try:
                if os.fork() != 0:
                    os._exit(0)
                os.setsid()
            except BaseException:
                os._exit(1)
            return other
        os.waitpid(pid, 0)
    return wid


#: rank and size of this process in a communicating job (set once in main)
_MPI: dict[str, int] = {}

_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "MPI_RANK")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MPI_SIZE")


def mpi_rank_size() -> tuple[int, int]:
    """This process's rank and the number of ranks, from the launcher's environment."""
    rank = next((int(os.environ[v]) for v in _RANK_VARS if v in os.environ), None)
    size = next((int(os.environ[v]) for v in _SIZE_VARS if v in os.environ), None)
    if rank is None or size is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        return comm.Get_rank(), comm.Get_size()
    return rank, size


def _abort_mpi() -> None:
    """A rank failed: stop every rank now, rather than leave them in a collective."""
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    except Exception:
        os._exit(1)


def _print_header(job: str, tasks: list[int]) -> None:
    """The first lines of an array element's log: enough to diagnose a failed start."""
    from . import __version__

    ids = {k: v for k, v in os.environ.items() if k in (
        "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "JOB_ID", "SGE_TASK_ID",
        "PBS_JOBID", "PBS_ARRAYID", "PBS_ARRAY_INDEX", "LSB_JOBID", "LSB_JOBINDEX", "FLUX_JOB_ID")}
    shown = f"{tasks[0]}..{tasks[-1]}" if len(tasks) > 3 else ",".join(map(str, tasks))
    print(
        f"elsewhere worker: host {os.uname().nodename}, python {sys.version.split()[0]} ({sys.executable}), "
        f"elsewhere {__version__}, cwd {os.getcwd()}, job {job}, tasks {shown}, "
        + " ".join(f"{k}={v}" for k, v in sorted(ids.items())),
        file=sys.stderr, flush=True,
    )


def _tasks_from_array_env() -> list[int] | None:
    var = os.environ.get("ELSEWHERE_ARRAY_VAR")
    sub = os.environ.get("ELSEWHERE_SUBMISSION")
    if not var or var not in os.environ or not sub:
        return None
    k = int(os.environ[var]) - int(os.environ.get("ELSEWHERE_ARRAY_BASE", "0"))
    import json

    with open(sub) as f:
        chunks = json.load(f)
    if not 0 <= k < len(chunks):
        raise SystemExit(f"elsewhere worker: array index {k} is outside {sub} ({len(chunks)} elements)")
    return list(records.iter_ranges(chunks[k]))


if __name__ == "__main__":
    sys.exit(main())
