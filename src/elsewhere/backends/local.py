"""The local backend: detached worker processes on this machine.

Workers are kept warm between jobs in a *pool* folder per interpreter and
elsewhere version (``<home>/local/<key>/``)::

    idle/<wid>    exists while worker <wid> waits for a job
    fifo/<wid>    the worker's FIFO: a job folder path + newline hands it a job
    pool.log      what workers print outside any job

Hand-over without a lock: a client *takes* an idle worker by unlinking its
``idle/<wid>`` marker (only one unlink can succeed), then writes the job's
path into ``fifo/<wid>``. A worker that times out unlinks its own marker
before exiting; if that unlink fails, a client took it, and it waits for the
message. A worker that died leaves a FIFO with no reader: the client's
non-blocking open fails with ENXIO, and it cleans up and tries the next.

When no idle worker is left, new ones are started detached (own session,
so they survive the client), by the absolute path of this interpreter.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..folder.journal import lock_is_free, reap
from ..util import paths
from ..util.errors import ConfigError
from .base import Cluster, Property, ensure_post_constructed

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..folder.queue import Queue

_DISPATCH_GRACE_S = 15.0
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
        python: the interpreter for workers; default this one.
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
        python: str | None = None,
        storage: str | Path | None = None,
        additional_properties: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__(cores_per_task=cores_per_task, storage=storage,
                         additional_properties=additional_properties)
        if unknown:  # as the other clusters: a ConfigError naming the option, not a TypeError
            raise ConfigError(f"unknown option(s) {', '.join(f'{k}={v!r}' for k, v in unknown.items())} for the local cluster (it takes cores, cores_per_task, idle_timeout_s, python)")
        if cores is not None and (not isinstance(cores, int) or cores < 1):
            raise ConfigError(f"cores must be a positive integer or None, not {cores!r}")
        if idle_timeout_s < 0:
            raise ConfigError(f"idle_timeout_s must be >= 0, not {idle_timeout_s!r}")
        self.cores = cores
        self.idle_timeout_s = float(idle_timeout_s)
        self.python = python or sys.executable
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
        if not os.path.exists(self.python):
            raise ConfigError(f"the python for local workers does not exist: {self.python}")

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
        d = _pools.get((str(home), self.python))
        if d is not None and os.path.isdir(d / "fifo"):
            return d
        ident = f"{self.python}\0{__version__}\0{package_root()}".encode()
        key = f"{zlib.crc32(ident):08x}{zlib.adler32(ident):08x}"  # no hashlib: it loads OpenSSL
        d = home / "local" / key
        if not (d / "fifo").is_dir():
            for sub in ("idle", "fifo"):
                (d / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        _pools[(str(home), self.python)] = d
        return d

    def _take_idle(self, pool: Path, limit: int | None = None) -> list[tuple[str, int]]:
        """Take idle workers (at most ``limit``): [(wid, fifo fd)]; each is ours alone."""
        taken: list[tuple[str, int]] = []
        try:
            names = os.listdir(pool / "idle")
        except FileNotFoundError:
            return []
        for wid in names:
            if limit is not None and len(taken) >= limit:
                break
            try:
                os.unlink(pool / "idle" / wid)
            except FileNotFoundError:
                continue  # another client, or the worker itself, was first
            try:
                fd = os.open(pool / "fifo" / wid, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                # No reader: the worker died. Clean up after it.
                try:
                    os.unlink(pool / "fifo" / wid)
                except OSError:
                    pass
                continue
            taken.append((wid, fd))
        return taken

    def dispatch(self, job: JobHandle, count: int, *, max_workers: int | None = None) -> list[str]:
        """Give ``job`` up to ``count`` more workers: warm ones first, then new ones.

        ``max_workers``, if given, is written to the queue in the same update.
        """
        if count <= 0:
            return []
        pool = self.pool_dir()
        idle = self._take_idle(pool, count)
        try:
            with job.store.locked_queue() as q:
                if max_workers is not None:
                    q.set_max_workers(max_workers)
                new = _note_dispatched(q, idle[:count], count)
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
            # Taken but not needed: put back.
            os.close(fd)
            try:
                fd2 = os.open(pool / "idle" / wid, os.O_WRONLY | os.O_CREAT, 0o600)
                os.close(fd2)
            except OSError:
                pass
        if new:
            # One new process; it forks the others once it has started up.
            self._spawn(pool, new[0], job, also=new[1:])
            started += new
        return started

    def _spawn(self, pool: Path, wid: str, job: JobHandle, also: tuple[str, ...] | list[str] = ()) -> None:
        from ..hosts.spawn import spawn_python_pid

        argv = ["-c", _WORKER_MAIN, "--pool", str(pool), "--wid", wid,
                "--job", str(job.store.path), "--idle-timeout", str(self.idle_timeout_s)]
        if also:
            argv += ["--also", ",".join(also)]
        _reap()
        # posix_spawn where it can (a fork of a big client costs it milliseconds); the worker
        # leaves the client's folder itself
        _spawned.append(spawn_python_pid(argv, python=self.python, log=pool / "pool.log"))

    def shutdown(self) -> int:
        """Ask this pool's idle workers to exit now; returns how many were asked."""
        _reap()
        stopped = 0
        for _wid, fd in self._take_idle(self.pool_dir()):
            try:
                os.write(fd, b"exit\n")
                stopped += 1
            except OSError:
                pass
            os.close(fd)
        return stopped

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
        idle = self._take_idle(pool, self._max_for(not job.spec.get("stream"), n))
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
                    new = _note_dispatched(q, use, want)
        except BaseException:
            self._hand_over(pool, job, [], idle, [])
            raise
        for fifo in waiting:
            _wake(fifo)
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
        argv += [self.python, "-m", "elsewhere.worker", "--job", str(job.store.path), "--mpi"]
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
        _reap()
        if job.spec.get("communicating"):
            self._poll_communicating(job)
            return
        with job.store.locked_queue() as q:
            if not q.submitted or q.cancelled:
                return
            reap(job.store, q)
            now = time.time()
            for wid, t in q.dispatched().items():
                if now - t > _DISPATCH_GRACE_S:
                    q.forget_dispatched(wid)
            want = min(q.max_workers, q.unclaimed()) - q.live_members() - len(q.dispatched())
        if want > 0:
            self.dispatch(job, want)

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
                _kill(m)
            reap(job.store, q, dead=set(q.members))

    def cancel_task(self, job: JobHandle, index: int) -> None:
        """Stop the worker running task ``index`` (its other claimed tasks go back to the
        queue, and another worker takes them)."""
        with job.store.locked_queue() as q:
            for wid, m in q.members.items():
                if m.get("state") == "active" and job.store.read_running(wid)[0] == index:
                    _kill(m)
            reap(job.store, q)

    def delete_job(self, job: JobHandle) -> None:
        # Workers of a finished job are about to leave it for the pool: let them
        # (they notice the folder is gone). Only a job with work left is stopped.
        if not (job.snapshot().done or job.state.done):  # the last look, if recent, is enough when done
            self.cancel_job(job)


_spawned: list[int] = []  # workers this process started and has not reaped yet


def _note_dispatched(q: Queue, use: list[tuple[str, int]], count: int) -> list[str]:
    """Record in queue ``q`` that the idle workers ``use`` and ``count - len(use)`` new ones
    are on their way; returns the new ones' ids."""
    new = [f"{os.uname().nodename}-{os.getpid()}-{os.urandom(4).hex()}" for _ in range(count - len(use))]
    q.note_dispatched([w for w, _ in use] + new, time.time())
    return new


def _reap() -> None:
    """Collect the exit status of workers this process started that have ended, so
    they do not stay zombies while it lives (a notebook may run for days)."""
    for pid in list(_spawned):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid  # not ours to wait for any more (reaped elsewhere)
        if done:
            _spawned.remove(pid)


def _wake(fifo: str | None) -> None:
    """Wake a worker that waits on its FIFO (a newline is "look again")."""
    if not fifo:
        return
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def _kill(member: dict[str, Any]) -> None:
    """Kill a worker and everything it started (it leads its own session)."""
    pid = int(member.get("pid", 0))
    if pid <= 0 or lock_is_free(member.get("lock", "")):
        return  # already gone; its pid may belong to someone else by now
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
