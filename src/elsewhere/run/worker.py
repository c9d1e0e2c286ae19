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
- ``--pool DIR``: a warm worker of the local backend. After a job it waits (idle) for the
  next one on its own FIFO (on a core of its own: ``idlecore.py``, its files for the next
  job made: ``kit.py``), and exits after ``--idle-timeout`` seconds without work. See
  ``backends/local.py`` for the hand-over.
- ``--tasks SPEC`` with ``--job``: run exactly those tasks ("0:100" or
  "3,7,9") instead of claiming (array elements of batch schedulers).

Environment variables read (all optional; flags win): ``ELSEWHERE_JOB_DIR``, ``ELSEWHERE_TASKS``,
``ELSEWHERE_WORKER_ID``, and for array elements ``ELSEWHERE_SUBMISSION`` (a JSON list of chunks)
with ``ELSEWHERE_ARRAY_VAR`` (the name of the scheduler's array index variable) and
``ELSEWHERE_ARRAY_BASE``: element k runs chunk k - base; an empty chunk means: claim tasks from
the job's queue (a packed submission; ``ELSEWHERE_WALLTIME_S``, the element's walltime, makes it
stop claiming while a task still fits). See docs/plugins.md.

It imports little: start-up time is part of every job's latency.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import sys
import time

from ..folder import records
from ..folder.store import CUR, JobStore
from .idlecore import IdleCore, mark_idle
from .jobrun import JobRun
from .kit import FileKit, open_new
from .runner import TaskRunner

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from typing import Any


class _Exit(Exception):
    """A client asked this idle worker to exit."""


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

    def __init__(self, wid: str, pool: str | None = None, idle_timeout_s: float = 60.0,
                 mpi: dict[str, int] | None = None) -> None:
        self.wid = wid
        self.mpi = mpi or {}  # rank and size in a communicating job
        self.pool = pool
        self.idle_timeout_s = idle_timeout_s
        self.host = os.uname().nodename
        self.pid = os.getpid()
        # runs the tasks: thread limits and seeds live as long as the process
        self.runner = TaskRunner(self.host, rank=self.mpi.get("rank"), size=self.mpi.get("size"))
        self._started_at = time.time()
        self._jobs_done = 0
        self.task_failed = False  # a task it ran ended with an error: an array element exits 1
        self.known: tuple[int, float, bool] | None = None  # its last job's function, time a task, quiet (JobRun.join)
        self.deadline: float | None = None  # a claiming array element's walltime ends then
        self.alone = False  # given tasks of a worker that died: each outcome written alone (supervise.py)
        self.watcher = 0  # the pid of the process watching this one, if one is (supervise.py)
        self._watched: list[str] = []  # files of loaded modules that may change under us
        self._watched_n = -1  # len(sys.modules) when _watched was made
        self.stdio = (os.dup(1), os.dup(2))  # its own stdout and stderr, while 1 and 2 are a job's log
        self.fifo_path = ""
        self.fifo_fd = -1
        self.idle_core = IdleCore(pool) if pool else None  # its core and policy while idle
        self.kit = FileKit(pool, wid) if pool else None  # its files for the next job (run/kit.py)
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
                    if self.idle_core is not None:
                        self.idle_core.leave()  # (before anything of the job, a re-exec too)
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
            if self.kit is not None:
                self.kit.discard()
            if self.pool:
                for p in (*(os.path.join(self.pool, d, self.wid) for d in ("idle", "taken")), self.fifo_path):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass

    def _wait_for_job(self) -> str | None:
        assert self.pool is not None
        marker = mark_idle(self.pool, self.wid)
        if self.idle_core is not None:
            self.idle_core.enter()
        if self.kit is not None:
            self.kit.fill()  # (a job handed over meanwhile waits in the FIFO: a moment)
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
            from ..folder.serial import installed_prefixes

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

    def wait_for_work(self, timeout_s: float | None = None) -> None:
        """Inside a job that may still get tasks: wait for a wake-up on the FIFO (a second at most),
        or a moment without one; with ``timeout_s`` (a task held for a rerun is due then), that
        long at most, with or without a FIFO. A job path that arrives meanwhile is kept."""
        fd = self.fifo_fd
        if fd < 0:
            time.sleep(0.05 if timeout_s is None else timeout_s)
            return
        r, _, _ = select.select([fd], [], [], 1.0 if timeout_s is None else timeout_s)
        if r:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                data = b""
            keep = [x for x in data.split(b"\n") if x and x != b"!"]
            if keep:
                self._pending += b"\n".join(keep) + b"\n"

    def _reexec(self, job: str) -> None:
        # The user's modules changed since this warm worker imported them: afresh, same pid
        os.dup2(self.stdio[0], 1)
        os.dup2(self.stdio[1], 2)
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
        cur_fd = -1
        try:
            meta = store.meta()
            # workers/<wid>.cur: which task runs now (a shared map), and the worker's lock:
            # held while it lives, released by the kernel however it ends (taken at once: a
            # client that finds the file with its lock free takes the worker for gone).
            cur_path = store._p("workers", f"{self.wid}.cur")
            cur_fd = open_new(self.kit, "cur", cur_path)
            fcntl.flock(cur_fd, fcntl.LOCK_EX)
            os.pwrite(cur_fd, CUR.pack(-1, 0.0, 0), 0)  # (not cut to nothing first: see write_new)
            os.ftruncate(cur_fd, CUR.size)
            try:
                store.hold_queue()  # a claim is then a lock, two reads and a write
            except FileNotFoundError:
                if not os.path.isdir(job_dir):
                    raise
                # a folder from before queue.b.json: opened per claim
            run = JobRun(self, store, meta, tasks)
            first = run.join(cur_path) if tasks is None else None
        except Exception as exc:
            if cur_fd >= 0:
                os.close(cur_fd)
            store.release_queue()
            if isinstance(exc, FileNotFoundError) and not os.path.isdir(job_dir):
                return  # purged before we got here
            # a damaged job.json, a full disk: the job cannot run here, nor elsewhere
            self._fail_unjoined(store, exc, tasks)
            raise
        try:  # from here on, the job run accounts for its tasks however it ends
            if tasks is not None:
                run.run(cur_fd)
            elif first is not None:
                run.run(cur_fd, first)
        finally:
            store.release_queue()
            os.close(cur_fd)

    def _fail_unjoined(self, store: JobStore, exc: Exception, tasks: list[int] | None) -> None:
        """Before joining, the job cannot be read: its tasks fail with the reason (see
        ``Claims.fail``), rather than workers being started for it again and again."""
        from .claims import Claims
        from .jobrun import failure_reason, own_trouble

        if own_trouble(exc):
            return  # this process's alone (memory, descriptors): another worker will do
        try:
            Claims(store, self.wid).fail(failure_reason(exc, store.dir, self), tasks)
        except Exception:
            pass  # the queue cannot be read either: the client says so when it looks


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
            a.mpi, i = True, i + 1
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
        mpi = {"rank": rank, "size": size}
        tasks: list[int] | None = [rank]
        wid = f"rank{rank}-{wid}"
    else:
        mpi = {}
        tasks = _parse_tasks(args.tasks) if args.tasks else _tasks_from_array_env()
    # an array element given no tasks (a packed submission) claims them from the job's queue
    claims = tasks == [] and not args.tasks
    if claims:
        tasks = None
    if (tasks is not None or claims) and args.wid is None and os.environ.get("ELSEWHERE_ARRAY_VAR"):
        index = os.environ.get(os.environ["ELSEWHERE_ARRAY_VAR"], "0")
        if claims:  # c<submission>.<index>-: the batch backend finds its element by it
            sub = os.path.basename(os.environ.get("ELSEWHERE_SUBMISSION", "0.json")).rsplit(".", 1)[0]
            wid = f"c{sub}.{index}-{wid}"
        else:
            wid = f"a{index}-{wid}"
    if not args.job and not args.pool:
        print("python -m elsewhere.worker: nothing to do: give --job DIR and/or --pool DIR", file=sys.stderr)
        return 2
    if tasks is not None or claims:
        _print_header(args.job, tasks)
    if tasks and not mpi and not args.pool and args.job and hasattr(os, "fork"):
        # given its tasks: in a watched child, so that a task that kills it costs itself alone
        from .supervise import supervise

        watcher = os.getpid()
        return supervise(args.job, wid, tasks, lambda name, given, alone: _run(
            args, name, given, mpi, claims=False, alone=alone, watcher=watcher))  # fmt: skip
    return _run(args, wid, tasks, mpi, claims=claims)


def _run(args: Any, wid: str, tasks: list[int] | None, mpi: dict[str, int], *, claims: bool,
         alone: bool = False, watcher: int = 0) -> int:  # fmt: skip
    """Be worker ``wid``: of ``args.job`` (``tasks`` given, or claimed) and of ``args.pool``;
    the process's exit code. ``alone``: each outcome written alone (tasks of a worker that
    died); ``watcher``: the process that started this one to watch it (supervise.py)."""
    try:
        worker = Worker(wid, args.pool, args.idle_timeout, mpi=mpi)
        worker.alone, worker.watcher = alone, watcher
        if claims and os.environ.get("ELSEWHERE_WALLTIME_S"):
            worker.deadline = time.time() + float(os.environ["ELSEWHERE_WALLTIME_S"])
        worker.serve(args.job, tasks)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                print(f"elsewhere worker {wid}: disk full: {exc}", file=sys.stderr, flush=True)
            except OSError:
                pass  # its log is on the full disk too (the job says why, see jobrun.py)
            return 75
        raise
    if (tasks is not None or claims) and not mpi and worker.task_failed:
        # an array element whose task failed ends failed, as the scheduler sees it: a job
        # made to wait for this one (after=, SLURM's afterok) does not start
        return 1
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


def _print_header(job: str, tasks: list[int] | None) -> None:
    """The first lines of an array element's log: enough to diagnose a failed start
    (``tasks`` None: the element claims its tasks from the job's queue)."""
    from ..util.version import __version__

    ids = {k: v for k, v in os.environ.items() if k in (
        "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "JOB_ID", "SGE_TASK_ID",
        "PBS_JOBID", "PBS_ARRAYID", "PBS_ARRAY_INDEX", "LSB_JOBID", "LSB_JOBINDEX", "FLUX_JOB_ID")}
    if tasks is None:
        shown = "claimed from the job's queue"
    else:
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
