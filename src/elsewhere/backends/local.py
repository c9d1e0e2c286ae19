"""The local backend: detached worker processes on this machine.

Workers are kept warm between jobs in a *pool* folder per interpreter and
elsewhere version (``<home>/local/<key>/``)::

    idle/<wid>    exists while worker <wid> waits for a job
    taken/<wid>   ... and there once a client took it (until it is idle again)
    fifo/<wid>    the worker's FIFO: a job folder path + newline hands it a job
    kit/, cores/  its files for the next job (run/kit.py), the core it waits on (run/idlecore.py)
    pool.log      what workers print outside any job

Hand-over without a lock: a client *takes* an idle worker by renaming its
``idle/<wid>`` marker to ``taken/<wid>`` (only one rename can succeed), then writes the job's
path into ``fifo/<wid>``; the worker renames it back when it is idle again. A worker that
times out unlinks its own marker before exiting; if that unlink fails, a client took it, and
it waits for the message. A worker that died leaves a FIFO with no reader: the client's
non-blocking open fails with ENXIO, and it cleans up and tries the next.

When no idle worker is left, new ones are started detached (own session,
so they survive the client), by the absolute path of this interpreter.

Workers on their way are noted in the job's queue (``dispatched``, with the pid of the process
started for them), so that a poll neither starts more nor waits for ever: a worker that took
its lock (``workers/<wid>.cur``) and let it go, or whose starting process has ended, before it
joined is lost at start and replaced at the next poll (about a second); one that has not joined
after _DISPATCH_GRACE_S is forgotten. After _START_LOSSES in a row, the job is halted with the
tail of ``pool.log`` as the reason, rather than starting workers for ever. (A job its client
registered but was killed before it handed it over is handed over by the core's next poll,
as for every backend: ``core/handover.py``.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder.journal import reap
from ..folder.records import claim_holds
from ..run.claims import write_off
from ..run.idlecore import mark_idle
from ..util import paths
from ..util.command import PythonCommand
from ..util.errors import ConfigError, JobError
from ..util.system import is_disk_full, no_space
from .base import Cluster, Property, ensure_post_constructed, refuse_unknown
from .localworkers import (
    kill,
    killed_by_signal,
    lost_at_start,
    note_dispatched,
    note_spawned,
    reap_children,
    take_idle,
    take_idle_or_returning,
    tell_to_exit,
    wake,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..folder.handle import JobHandle
    from ..folder.queue import Queue

_wake = wake  # the name api/streaming.py imports

_DISPATCH_GRACE_S = 15.0
_DONE_SEEN_S = 0.5  # a purge trusts a look this recent that saw the job done (ew.map's wait's)
_START_LOOK_S = 1.0  # a worker on its way this long that took its lock and let it go is lost at start
_START_LATE_S = 5.0  # ... one that never took it, once the process started for it has ended
_START_LOSSES = 10  # ... and this many in a row halt the job
#: ``python -m elsewhere.worker`` without runpy (and what it imports): a few ms less per start
_WORKER_MAIN = "import sys; from elsewhere.worker import main; sys.exit(main())  # elsewhere.worker"


def machine_cores() -> int:
    """Cores this process may use: CPU affinity, then cgroup quotas (the host probe's count)."""
    from ..hosts.probe import usable_cores

    return usable_cores()


def free_cores() -> int:
    """Cores not busy right now: usable cores minus the 1-minute load, at least 1."""
    from ..hosts.probe import free_cores

    return free_cores()


_pools: dict[tuple[str, str], Path] = {}  # (home, python) -> pool folder, once made


class LocalCluster(Cluster):
    """Worker processes on this machine, detached from the client.

    Args:
        cores: how many of this machine's cores a job may use; default its
            free cores (cores minus the current load). More than the machine
            has is allowed, with a warning.
        cores_per_task: cores each task gets; a job runs
            ``cores // cores_per_task`` tasks at once.
        idle_timeout_s: how long a worker stays warm after its last job.
        python: the interpreter for workers (default this one), or a command line that
            ends in one: "apptainer exec img.sif python3", "conda run -n env python",
            "module load python && python3", a list of words (docs/local.md).
        storage: where job folders go (default ``<home>/jobs``).
        additional_properties: the settings of :attr:`properties` (the MPI launcher).
    """

    kind = "local"
    properties = {
        "mpi_launcher": Property(str, None, "the MPI launcher command (default mpiexec)"),
        "mpi_args": Property(list, None, "extra arguments of the MPI launcher"),
    }
    capabilities = frozenset({"communicating", "stream"})

    def __init__(
        self,
        cores: int | None = None,
        *,
        cores_per_task: int = 1,
        idle_timeout_s: float = 120.0,
        python: str | Sequence[str] | None = None,
        storage: str | Path | None = None,
        additional_properties: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__(cores_per_task=cores_per_task, storage=storage,
                         additional_properties=additional_properties)
        refuse_unknown(self, unknown)  # as the other clusters: a ConfigError naming the option, not a TypeError
        if cores is not None and (not isinstance(cores, int) or isinstance(cores, bool) or cores < 1):  # fmt: skip
            raise ConfigError(f"cores must be a positive integer or None, not {cores!r}")
        if isinstance(idle_timeout_s, bool) or not isinstance(idle_timeout_s, (int, float)) or not idle_timeout_s >= 0:
            raise ConfigError(f"idle_timeout_s must be a number of seconds >= 0, not {idle_timeout_s!r}")
        self.cores = cores
        self.idle_timeout_s = float(idle_timeout_s)
        self.python = python if python is not None else sys.executable
        if isinstance(self.python, str) and os.path.isfile(self.python):
            self.command = PythonCommand.parse([self.python])  # a path as it is, spaces and all
        else:
            self.command = PythonCommand.parse(self.python)
        ensure_post_constructed(self)

    def settings(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "idle_timeout_s": self.idle_timeout_s,
            "python": self.python,
            **super().settings(),
        }

    def post_construct(self) -> None:
        have = machine_cores()
        if self.cores is not None and self.cores > have:
            warnings.warn(
                f"local cluster asked for {self.cores} cores, but this machine has {have}: "
                "tasks will share cores",
                stacklevel=3,
            )
        if self.cores_per_task > have:
            warnings.warn(
                f"cores_per_task={self.cores_per_task} is more than this machine's {have} cores",
                stacklevel=3,
            )
        import shutil

        program = self.command.program  # after setup (module load ...) it may only exist there
        found = shutil.which(program) if os.sep not in program else os.path.exists(program)
        if not found and not self.command.setup:
            what = "python" if self.command.plain else f"first word of python={self.command.text!r}"
            raise ConfigError(f"the {what} for local workers does not exist: {program}")

    def usable_cores(self) -> int:
        """The cores a job may use now."""
        return self.cores if self.cores is not None else free_cores()

    def max_workers(self, n_tasks: int) -> int:
        return max(1, min(n_tasks, max(1, self.usable_cores() // self.cores_per_task)))

    # -- the pool -------------------------------------------------------------
    def pool_dir(self) -> Path:
        """The folder of warm workers for this interpreter and elsewhere version."""
        import zlib

        from ..hosts.spawn import package_root
        from ..util.version import __version__

        home = paths.home()
        d = _pools.get((str(home), self.command.text))
        if d is not None and os.path.isdir(os.path.join(d, "taken")):
            return d
        ident = f"{self.command.text}\0{__version__}\0{package_root()}".encode()
        key = f"{zlib.crc32(ident):08x}{zlib.adler32(ident):08x}"  # no hashlib: it loads OpenSSL
        d = home / "local" / key
        if not (d / "taken").is_dir():
            for sub in ("idle", "fifo", "taken"):
                paths.private_dir(d / sub)  # and home, local, the pool: 0700 whatever the umask
        _pools[(str(home), self.command.text)] = d
        return d

    def _take_idle(self, pool: Path, limit: int | None = None, job: JobHandle | None = None) -> list[tuple[str, int]]:
        """Take idle workers (at most ``limit``, waiting a moment for busy ones that come back,
        not ``job``'s own: see ``localworkers.RETURNING_S``): [(wid, fifo fd)]; each is ours alone."""
        if limit is None:
            return take_idle(pool)

        def own() -> list[str]:  # the job's workers, joined or on their way (a snapshot)
            if job is None:
                return []
            try:
                q = job.store.queue()
            except Exception:  # (unreadable: nothing excluded, at worst a wait in vain)
                return []
            return [*q.members, *q.dispatched()]

        return take_idle_or_returning(pool, limit, exclude=own)

    def dispatch(self, job: JobHandle, count: int, *, max_workers: int | None = None) -> list[str]:
        """Give ``job`` up to ``count`` more workers: warm ones first, then new ones.

        ``max_workers``, if given, is written to the queue in the same update.
        """
        if count <= 0:
            return []
        pool = self.pool_dir()
        idle = self._take_idle(pool, count, job)
        try:
            with job.store.locked_queue() as q:
                if max_workers is not None:
                    q.set_max_workers(max_workers)
                new = note_dispatched(q, idle[:count], count)
        except BaseException:
            self._hand_over(pool, job, [], idle, [])
            raise
        return self._hand_over(pool, job, idle[:count], idle[count:], new)

    def _hand_over(self, pool: Path, job: JobHandle, use: list[tuple[str, int]], spare: list[tuple[str, int]],
                   new: list[str]) -> list[str]:
        """Send ``job`` to the idle workers ``use``, put ``spare`` back, start ``new`` ones."""
        started: list[str] = []
        msg = (str(job.store.path) + "\n").encode()
        for wid, fd in use:
            try:
                os.write(fd, msg)
                started.append(wid)
            except OSError:
                pass
            finally:
                os.close(fd)
        for wid, fd in spare:
            os.close(fd)
            with contextlib.suppress(OSError):
                mark_idle(str(pool), wid)  # taken but not needed: idle again, as it says itself
        if new:
            # One new process; it forks the others once it has started up.
            pid = self._spawn(pool, new[0], job, also=new[1:])
            started += new
            try:
                with job.store.locked_queue() as q:  # if it ends before they join, so do they
                    q.note_started(new, pid, os.uname().nodename)
            except (OSError, ValueError):
                pass  # purged meanwhile; or then the dispatch grace is all there is
        return started

    def _spawn(self, pool: Path, wid: str, job: JobHandle, also: tuple[str, ...] | list[str] = ()) -> int:
        from ..hosts.forkstart import can_fork, fork_python_pid
        from ..hosts.spawn import spawn_python_pid

        argv = ["-c", _WORKER_MAIN, "--pool", str(pool), "--wid", wid,
                "--job", str(job.store.path), "--idle-timeout", str(self.idle_timeout_s)]
        if also:
            argv += ["--also", ",".join(also)]
        reap_children()
        if can_fork(self.command):  # a small client of one thread: no new interpreter
            from ..run.worker import main

            pid = fork_python_pid(main, argv[2:], log=pool / "pool.log")
        else:
            # posix_spawn where it can (a fork of a big client costs it milliseconds); the
            # worker leaves the client's folder itself
            pid = spawn_python_pid(argv, python=self.command, log=pool / "pool.log")
        note_spawned(pid)
        return pid

    def shutdown(self) -> int:
        """Ask this pool's idle workers to exit now; returns how many were asked."""
        reap_children()
        return tell_to_exit(self._take_idle(self.pool_dir()))

    # -- plugin operations ----------------------------------------------------
    def _max_for(self, closed: bool, n: int) -> int:
        """Workers a job may have: for ``n`` tasks, or, for an open stream, the usable cores."""
        if closed:
            return self.max_workers(n)
        return max(1, self.usable_cores() // self.cores_per_task)

    def prepare(self, job: JobHandle, n_tasks: int) -> None:
        """New workers start while the inputs are written (they take tens of ms to start);
        warm ones are told once the job is submitted (woken twice, they would take the
        CPU from the client writing the inputs, and claim once for nothing)."""
        if not n_tasks:
            return
        try:
            if os.listdir(self.pool_dir() / "idle"):
                return
        except FileNotFoundError:
            pass
        most = self._max_for(not job.spec.get("stream"), n_tasks)
        self.dispatch(job, min(most, n_tasks), max_workers=most)

    def submit_independent(self, job: JobHandle) -> None:
        """Hand the job to warm workers, or start new ones, as many as its tasks can use;
        they claim the tasks from the job's queue (a retry's tasks first)."""
        n = job.n_tasks
        pool = self.pool_dir()
        # taken before the lock: one queue update says "submitted" and who comes
        idle = self._take_idle(pool, self._max_for(not job.spec.get("stream"), n), job)
        use: list[tuple[str, int]] = []
        new: list[str] = []
        try:
            with job.store.locked_queue() as q:
                q.submit(max_workers=self._max_for(q.closed, n))
                have = q.live_members() + len(q.dispatched())
                want = min(q.max_workers, max(1, q.unclaimed())) - have if n else 0
                if not n and not q.closed:
                    want = 1 - have  # an open stream (an Executor): one worker ready for its first task
                waiting = q.waiting_fifos()
                if want > 0:
                    use = idle[:want]
                    new = note_dispatched(q, use, want)
        except BaseException:
            self._hand_over(pool, job, [], idle, [])
            raise
        for fifo in waiting:
            wake(fifo)
        self._hand_over(pool, job, use, idle[len(use):], new)

    def submit_communicating(self, job: JobHandle) -> None:
        from ..hosts import mpi

        ranks = job.n_tasks
        launcher = mpi.find_launcher(self.additional_properties.get("mpi_launcher"))
        mpi.check_mpi4py()
        have = self.cores or machine_cores()
        if ranks > have:
            warnings.warn(f"{ranks} ranks on {have} cores: ranks share cores (oversubscribed)", stacklevel=3)
        with job.store.locked_queue() as q:
            q.submit(assigned=ranks, max_workers=ranks)
        argv = mpi.launcher_argv(launcher, ranks, list(self.additional_properties.get("mpi_args", [])),
                                 oversubscribe=True)
        argv += self.command.argv("-m", "elsewhere.worker", "--job", str(job.store.path), "--mpi")
        from ..hosts.spawn import python_env

        env = python_env()  # the launcher is no Python, but the ranks it starts are
        log = os.open(job.store.path / "logs" / "launcher.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            import subprocess

            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                    start_new_session=True, close_fds=True, cwd=str(job.store.path))
        finally:
            os.close(log)
        import psutil

        started = psutil.Process(proc.pid).create_time()
        self.set_job_cluster_data(job, {"launcher": argv, "pid": proc.pid, "create_time": started})

    def _launcher_alive(self, job: JobHandle) -> bool:
        data = self.get_job_cluster_data(job)
        pid = data.get("pid")
        if not pid:
            return False
        import psutil

        try:
            p = psutil.Process(pid)
            return abs(p.create_time() - data.get("create_time", 0)) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def _poll_communicating(self, job: JobHandle) -> None:
        if self._launcher_alive(job):
            return
        self.report_lost(job, {i: f"rank {i} ended without a result: the MPI job was aborted or killed "
                                  "(another rank failed? see job.log(rank) and logs/launcher.log)"
                               for i in range(job.n_tasks)})

    def poll(self, job: JobHandle) -> None:
        reap_children()
        if job.spec.get("communicating"):
            self._poll_communicating(job)
            return
        try:
            with job.store.locked_queue() as q:
                want = 0
                if q.submitted and not q.cancelled:
                    reap(job.store, q)
                    self._forget_lost_at_start(job, q)
                    want = min(q.max_workers, q.unclaimed()) - q.live_members() - len(q.dispatched())
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise JobError(f"job {job.name!r} cannot go on: {no_space(job.path)}: the workers it lost cannot "
                           "be written off; free some space, then wait again") from exc  # fmt: skip
        if want > 0:
            self.dispatch(job, want)

    def _forget_lost_at_start(self, job: JobHandle, q: Queue) -> None:
        """Forget the workers on their way that were lost at start, or are late (see the module)."""
        now = time.time()
        for wid, t in q.dispatched().items():
            if now - t > _START_LOOK_S and lost_at_start(job, q, wid, now - t > _START_LATE_S):
                by = q.started_by(wid)
                if by is not None and killed_by_signal(by[0]):
                    q.forget_dispatched(wid)  # killed from outside: replaced, not a failure to start
                elif q.lost_at_start(wid) == _START_LOSSES:
                    write_off(job.store, q, [], self._start_failure(), halt=True)
            elif now - t > _DISPATCH_GRACE_S:
                q.forget_dispatched(wid)

    def _start_failure(self) -> str:
        """Why the job is halted after workers kept ending before they joined it."""
        tail = ""
        try:
            with open(self.pool_dir() / "pool.log", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 2000))
                tail = "; ".join(f.read().decode(errors="replace").strip().splitlines()[-5:])
        except OSError:
            pass
        why = f"{_START_LOSSES} workers in a row ended before they joined the job (started with {self.command.text})"
        return why + (f"; the end of their output: {tail}" if tail else "")

    def cancel_job(self, job: JobHandle) -> None:
        if job.spec.get("communicating"):
            if self._launcher_alive(job):
                pid = self.get_job_cluster_data(job)["pid"]
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(pid, sig)
                    except ProcessLookupError:
                        break
                    deadline = time.monotonic() + 3
                    while time.monotonic() < deadline and self._launcher_alive(job):
                        time.sleep(0.05)
                    if not self._launcher_alive(job):
                        break
            return
        with job.store.locked_queue() as q:
            for m in q.cancel_job():
                kill(m)
            reap(job.store, q, dead=set(q.members))

    def cancel_task(self, job: JobHandle, index: int) -> None:
        """Stop the worker running task ``index``, or that claimed it and starts no task yet
        (it would start it: a worker does not look at the queue again before each task of
        its claim); its other claimed tasks go back to the queue, and another worker takes them."""
        with job.store.locked_queue() as q:
            for wid, m in q.members.items():
                if m.get("state") != "active":
                    continue
                running = job.store.read_running(wid)[0]
                if running == index or (running < 0 and claim_holds(m.get("claim") or [], index)):
                    kill(m)
            reap(job.store, q)

    def delete_job(self, job: JobHandle) -> None:
        # Workers of a finished job are about to leave it for the pool: let them
        # (they notice the folder is gone). Only a job with work left is stopped.
        if not (job.seen_done(_DONE_SEEN_S) or job.snapshot().done):  # a recent look that saw it done will do
            self.cancel_job(job)
