"""The task runner: how every worker, MPI rank and peer task process runs a task.

A process that runs tasks has one :class:`TaskRunner`. It enters a job once
(:meth:`~TaskRunner.enter`, with the job's :class:`JobSetup`), runs its tasks one by one
(:meth:`~TaskRunner.run`, which returns a :class:`TaskOutcome`) or, for a flood of tiny tasks
that print nothing, a chunk in one loop (:meth:`~TaskRunner.run_quiet`, its loops in
``flood.py``: a worker's in C, the map saying SEVERAL meanwhile), and leaves it
(:meth:`~TaskRunner.leave`), the process as it was before::

    runner = TaskRunner(host)                                # once per process
    runner.enter(setup, cur=cur_map, fallback_cwd=..., common=load_common)
    outcome = runner.run(index, attempt, payload.task, index)
    runner.leave()

Entering a job, in this order:

- thread limits: BLAS, OpenMP and numexpr run the job's cores per task (``threads.py``),
  set before the job's ``env=``, which may set them itself;
- the job's ``env=`` over the process's environment;
- the working directory: the caller's, where it exists here, else ``fallback_cwd()``;
- ``sys.path``: the job's own folders (``front``: its attached files), then the caller's
  folders that exist here, then the process's own. A process of another installation (a
  peer's, ``foreign_python``) leaves out the caller's installed packages, which are not
  its interpreter's;
- seeds: ``random`` and NumPy seeded per task from the job seed (``seeding.py``), or left
  alone for a job without one;
- ``ew.task()``: a :class:`~.context.TaskContext`, its index, seed and attempt set per task.

Running a task: the shared map ``cur`` says which task runs, since when and where its output
starts (``CUR`` of ``folder/store.py``: a worker's ``workers/<w>.cur``, a peer task
process's map that its daemon reads), the context and the seed are set, the task's entry is
loaded, the function called, an exception turned into the task's error record
(``errors.py``), and what it printed flushed to file descriptor 1, where its byte range is
read.

Kept free of heavy imports: the worker imports it at start-up.
"""

from __future__ import annotations

import os
import sys
import time
from collections import namedtuple

from ..folder.store import CUR, SEVERAL
from .context import TaskContext, _current
from .flood import run_flood
from .threads import ThreadLimits

TYPE_CHECKING = False  # typing is not imported at run time: workers start faster without it
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from ..folder.errorrecord import ErrorRecord
    from .seeding import TaskSeeder

__all__ = ["JobSetup", "TaskOutcome", "TaskRunner", "flush_output"]

_time = time.time
_lseek = os.lseek
_pack_cur = CUR.pack_into
_new_tuple = tuple.__new__
_INSTALLED = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python3")


def _nothing() -> None:
    pass


class JobSetup:
    """What a job asks of the process that runs its tasks: made once per job, from its
    ``job.json`` (:meth:`from_meta`) or from a peer's "run" message (:meth:`from_peer`).

    Attributes:
        name, job_id: the job's name and id (for ``ew.task()``).
        cores: the cores each task has (``cores_per_task``), at least 1.
        seed: the job seed, or None for a job whose tasks are not seeded.
        cwd: the caller's working directory (None: not recorded).
        sys_path: the caller's ``sys.path`` folders, in order.
        env: the job's ``env=``, names and values as text.
    """

    __slots__ = ("cores", "cwd", "env", "job_id", "name", "seed", "sys_path")

    def __init__(self, *, name: str = "", job_id: str = "", cores: Any = 1, seed: Any = None,
                 cwd: Any = None, sys_path: Any = (), env: Any = None) -> None:  # fmt: skip
        try:
            n = int(cores)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or isinstance(cores, bool):
            raise ValueError(f"job {name!r}: cores per task must be a count of at least 1, not {cores!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"job {name!r}: the seed must be a whole number or None, not {seed!r}")
        if env is not None and not hasattr(env, "items"):
            raise ValueError(f"job {name!r}: env must map names to values, not {env!r}")
        if isinstance(sys_path, (str, bytes)) or not hasattr(sys_path, "__iter__"):
            raise ValueError(f"job {name!r}: sys_path must be a list of folders, not {sys_path!r}")
        self.name = str(name)
        self.job_id = str(job_id)
        self.cores = n
        self.seed = seed
        self.cwd = cwd if isinstance(cwd, str) and cwd else None
        self.sys_path = tuple(p for p in sys_path if isinstance(p, str))
        self.env = {str(k): str(v) for k, v in (env or {}).items()}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> JobSetup:
        """The setup of a job as its ``job.json`` records it."""
        return cls(name=meta.get("name", ""), job_id=meta.get("id", ""), cores=meta.get("cores_per_task", 1),
                   seed=meta.get("seed"), cwd=meta.get("cwd"), sys_path=meta.get("sys_path") or (),
                   env=meta.get("env"))  # fmt: skip

    @classmethod
    def from_peer(cls, job: Mapping[str, Any]) -> JobSetup:
        """The setup of a job as a peer controller sends it (``job`` of a "run" message)."""
        return cls(name=job.get("name", ""), job_id=job.get("id", ""), cores=job.get("cores", 1),
                   seed=job.get("seed"), cwd=job.get("cwd"), sys_path=job.get("sys_path") or (),
                   env=job.get("env"))  # fmt: skip

    def __repr__(self) -> str:
        return f"JobSetup(name={self.name!r}, cores={self.cores}, seed={self.seed}, cwd={self.cwd!r})"


class TaskOutcome(namedtuple("TaskOutcome", "index attempt ok value t_start t_end log_off log_len seed busy_s")):
    """How one run of one task ended.

    Fields: ``index``, ``attempt``; ``ok`` (False: it raised); ``value``, its return value,
    or, when not ``ok``, its error record's stored form (a dict, see ``errors.py``);
    ``t_start`` and ``t_end`` (unix times: from before its inputs were loaded to after its
    output was flushed); ``log_off`` and ``log_len``, the byte range of its output on file
    descriptor 1; ``seed``; ``busy_s``, the seconds its function ran (what claim sizes go by).
    """

    __slots__ = ()
    index: int
    attempt: int
    ok: bool
    value: Any
    t_start: float
    t_end: float
    log_off: int
    log_len: int
    seed: int
    busy_s: float


class TaskRunner:
    """Runs tasks in this process, one job at a time (see the module)."""

    def __init__(self, host: str, *, rank: int | None = None, size: int | None = None) -> None:
        self.host = host
        self.rank = rank  # of a communicating (MPI) job's rank, for ew.task()
        self.size = size
        self.threads = ThreadLimits()  # per process: what the loaded libraries were told
        self.seeder: TaskSeeder | None = None  # made for the first seeded job, kept after
        self.setup: JobSetup | None = None  # the job entered, if any
        self.ctx = TaskContext(index=-1, job="", job_id="", cores=1, seed=0, job_seed=0, host=host)
        self.job_seed = 0
        self.log_pos = 0  # where the next task's output starts on file descriptor 1
        self._seeds: TaskSeeder | None = None  # the seeder while a seeded job is entered
        self._common: Callable[[], tuple[Any, Any]] | None = None
        self._loaded: tuple[Any, Any] | None = None
        self._cur: Any = None
        self._cur_index: Any = None  # the map's first field as a memoryview: one store per task
        self._token: Any = None
        self._saved: tuple[str, list[str], dict[str, str | None]] | None = None

    # -- a job ----------------------------------------------------------------------------
    def enter(self, setup: JobSetup, *, cur: Any, fallback_cwd: Callable[[], str], front: Sequence[str] = (),
              common: Callable[[], tuple[Any, Any]] | None = None, foreign_python: bool = False) -> None:  # fmt: skip
        """Enter a job (leaving the one entered before, if any).

        ``cur``: the writable shared map of ``CUR`` size where the running task is told;
        ``fallback_cwd``: the working directory where the caller's does not exist here;
        ``front``: folders before all others on ``sys.path``; ``common``: loads the job's
        ``(function, job_data)``, at most once (see :meth:`use_common`);
        ``foreign_python``: this interpreter is not the caller's installation.
        """
        if self.setup is not None:
            self.leave()
        self.threads.enter(setup.cores, setup.env)  # before the env= it may make way for
        environ = os.environ
        saved_env = {k: environ.get(k) for k in setup.env}
        environ.update(setup.env)
        try:
            saved_cwd = os.getcwd()
        except OSError:  # the folder it was in is gone
            saved_cwd = "/"
        cwd = setup.cwd if setup.cwd and os.path.isdir(setup.cwd) else None
        try:
            os.chdir(cwd or fallback_cwd())
        except OSError:
            try:
                os.chdir(fallback_cwd())
            except OSError:
                pass
        saved_path = list(sys.path)
        sys.path[:] = build_sys_path(front, setup.sys_path, saved_path, foreign_python=foreign_python)
        self._saved = (saved_cwd, saved_path, saved_env)
        self.setup = setup
        self._arm_seeds(setup.seed)
        self.use_common(common)
        ctx = self.ctx = TaskContext(
            index=-1, job=setup.name, job_id=setup.job_id, cores=setup.cores, seed=0, job_seed=self.job_seed,
            host=self.host, rank=self.rank, size=self.size, _job_data=self.job_data,
        )  # fmt: skip
        self._token = _current.set(ctx)
        self._cur = cur
        self._cur_index = memoryview(cur).cast("q")
        self.log_pos = _lseek(1, 0, os.SEEK_END)

    def _arm_seeds(self, seed: int | None) -> None:
        self.job_seed = int(seed or 0)
        seeder = self.seeder
        if seed is None:
            self._seeds = None
            if seeder is not None and seeder.armed:
                seeder.disarm()
            return
        if seeder is None:
            from .seeding import TaskSeeder

            seeder = self.seeder = TaskSeeder()
        else:
            seeder.rearm()
        self._seeds = seeder

    def use_common(self, common: Callable[[], tuple[Any, Any]] | None) -> None:
        """Load the function and ``job_data`` shared by the tasks from now on with
        ``common`` (when a task first needs them)."""
        self._common = common
        self._loaded = None

    def _load_common(self) -> tuple[Any, Any]:
        loaded = self._loaded
        if loaded is None:
            loaded = self._loaded = self._common() if self._common is not None else (None, None)
        return loaded

    def job_data(self) -> Any:
        """The job's ``job_data`` (``ew.task().job_data``)."""
        return self._load_common()[1]

    def leave(self) -> None:
        """Leave the job entered: working directory, ``sys.path`` and environment as they were."""
        if self.setup is None:
            return
        self.setup = None
        token, self._token = self._token, None
        if token is not None:
            try:
                _current.reset(token)
            except (ValueError, RuntimeError):  # made in another context: forget it here instead
                _current.set(None)
        if self._cur_index is not None:
            self._cur_index.release()
        self._cur = self._cur_index = None
        self._common = self._loaded = None
        saved, self._saved = self._saved, None
        if saved is None:
            return
        cwd, path, env = saved
        try:
            os.chdir(cwd)
        except OSError:
            pass
        sys.path[:] = path
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    # -- tasks ------------------------------------------------------------------------------
    def run(self, index: int, attempt: int, load: Callable[[Any], tuple[Any, Any, Any]], key: Any) -> TaskOutcome:
        """Run task ``index``: its entry is ``load(key)``, ``(function or None for the job's,
        args, kwargs)``; an exception in loading it is the task's too."""
        job_seed = self.job_seed
        seed = job_seed + index
        log_off = self.log_pos
        t0 = _time()
        _pack_cur(self._cur, 0, index, t0, log_off)
        ctx = self.ctx
        ctx.index = index
        ctx.seed = seed
        ctx.attempt = attempt
        tf = t0
        try:
            seeder = self._seeds
            if seeder is not None:
                if seeder.fired:
                    seeder.rearm()
                seeder.begin(job_seed, index)
            fn, args, kwargs = load(key)
            if fn is None:
                loaded = self._loaded
                fn = loaded[0] if loaded is not None else self._load_common()[0]
            tf = _time()  # the function's own time, for claim sizes: not the loading of its inputs
            value = fn(*args, **kwargs)
            ok = True
        except BaseException as exc:
            ok = False
            value = self.error(exc, index).to_value()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass  # a task may have closed or replaced them
        t1 = _time()
        log_end = _lseek(1, 0, 2)
        self.log_pos = log_end
        # made as a tuple is (namedtuple's own __new__ would cost this loop a tenth of its time)
        return _new_tuple(TaskOutcome, (index, attempt, ok, value, t0, t1, log_off, log_end - log_off, seed, t1 - tf))

    def run_quiet(self, fn: Callable[..., Any], args: Sequence[Any], single: bool, first: int, start: int,
                  end: int, append: Callable[[Any], Any], t0: float) -> tuple[int, dict[str, Any]] | None:  # fmt: skip
        """Run tasks ``start .. end-1`` of a flood of tiny tasks that print nothing, in one loop:
        task ``j`` calls ``fn(args[j - first])`` (``single``) or ``fn(*args[j - first])``,
        and its value goes to ``append``. None when all ran; else ``(j, error)`` for the task
        ``j`` that raised (the tasks after it did not run). Its tasks have no output of their
        own: the map says the chunk runs since ``t0``, its output from here (see ``flood.py``)."""
        return run_flood(self, fn, args, single, first, start, end, append, t0)

    def mark(self, index: int) -> None:
        """The process works for task ``index`` now, outside its call: loading its inputs,
        or pickling its value. A process that dies meanwhile costs that task (its daemon
        reads the map), not a batch run again for ever. :data:`SEVERAL`: for several tasks
        at once (their inputs loaded, or their values pickled, together): a death then
        costs none of them, and they run again each alone, where it costs the one that
        did it (see ``peer/dispatch.py``). Below that: none."""
        if self._cur is not None:
            if index >= 0 or index == SEVERAL:
                _pack_cur(self._cur, 0, index, _time(), self.log_pos)
            else:
                self.idle()

    def idle(self) -> None:
        """No task runs now (the map says so)."""
        _pack_cur(self._cur, 0, -1, 0.0, 0)

    def charge(self, index: int) -> Callable[[], None]:
        """Task ``index`` (-1: none; :data:`SEVERAL`: none, the values of several pickled
        together) is charged should the process die now, while values are pickled after their
        tasks ran: the map names it, as if it ran, until the call returned is called, which
        puts the map back as it was. A value whose pickling kills its worker (too large for its
        memory, a crash in a library) then fails its own task as lost, not another's, nor goes
        back to the queue, unrun for all the reaper knows, to kill the next."""
        cur = self._cur
        if cur is None:
            return _nothing
        was = cur[:CUR.size]
        if index < 0 and index != SEVERAL:
            _pack_cur(cur, 0, -1, 0.0, 0)
        else:
            _pack_cur(cur, 0, index, _time(), self.log_pos)

        def back() -> None:
            cur[:CUR.size] = was

        return back

    def function(self) -> Any:
        """The function the job's tasks share (loaded at the first call)."""
        return self._load_common()[0]

    def error(self, exc: BaseException, index: int) -> ErrorRecord:
        """The error record of task ``index`` of the job entered, which raised ``exc``."""
        from ..folder.errorrecord import ErrorRecord

        return ErrorRecord.of_exception(exc, self.host, index, self.job_seed + index)


def build_sys_path(front: Sequence[str], job_path: Sequence[str], own: Sequence[str], *,
                   foreign_python: bool = False) -> list[str]:  # fmt: skip
    """A task's ``sys.path``: ``front``, then the folders of the job's (the caller's) that exist
    here (``""``, the working directory, included), then the process's ``own`` ones not named
    yet; with ``foreign_python``, the caller's installed packages are left out (an interpreter
    other than the caller's has its own)."""
    out = list(dict.fromkeys(front))
    seen = set(out)
    for p in job_path:
        if p in seen or not (p == "" or os.path.isdir(p)):
            continue
        if foreign_python and (p == "" or is_installed_path(p)):
            continue
        out.append(p)
        seen.add(p)
    out.extend(p for p in own if p not in seen)
    return out


def is_installed_path(path: str) -> bool:
    """Whether ``path`` belongs to an interpreter's installation, not to the user's code."""
    return path.endswith(".zip") or any(s in path for s in _INSTALLED)


def flush_output() -> None:
    """Push what a task printed to file descriptor 1 (before its byte range is read)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass  # a task may have closed or replaced them
