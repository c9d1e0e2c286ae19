"""The one plugin interface every backend implements: :class:`Cluster` (its docstring has
the table of operations; docs/plugins.md is the guide), :class:`Property` (a declared
additional property) and :data:`CAPABILITIES`.
"""

from __future__ import annotations

import abc
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..util.errors import ConfigError

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..folder.snapshot import Snapshot

#: The capabilities a backend may declare (``Cluster.capabilities``).
CAPABILITIES = frozenset({
    "communicating",  # submit_communicating starts MPI ranks together
    "retry_resources",  # job.retry(mem=..., walltime=...) reaches submit_independent as job.resources
    "fetch_files",  # job.get(files=True) brings back the files tasks wrote where they ran
    "stream",  # an open job that grows while it runs (ew.Executor): see submit_independent
})


@dataclass(frozen=True)
class Property:
    """One of a backend's ``additional_properties`` (MATLAB's ``AdditionalProperties``): its
    type (or types), its default, and what it means (shown in errors and in the docs)."""

    type: type | tuple[type, ...]
    default: Any = None
    doc: str = ""

    def check(self, name: str, value: Any, owner: str) -> Any:
        """``value`` if it has the property's type; ConfigError naming it otherwise."""
        if value is None or (isinstance(value, self.type) and not (isinstance(value, bool) and self.type is int)):
            return value
        want = " or ".join(t.__name__ for t in (self.type if isinstance(self.type, tuple) else (self.type,)))
        raise ConfigError(f"additional property {name!r} of the {owner} cluster must be {want}, not "
                          f"{value!r} ({type(value).__name__}){': ' + self.doc if self.doc else ''}")  # fmt: skip


class Cluster(abc.ABC):
    """Where tasks run. Subclass it to add a backend: the Python form of MATLAB's generic
    scheduler plugin scripts. Every operation receives an :class:`~elsewhere.JobHandle`
    (what a backend sees of a job), never the user's Job.

    =========================  ==================================================================
    operation                  called when
    =========================  ==================================================================
    ``post_construct()``       once, when a user's cluster is first used (not on a rebuild to
                               read a job): check commands and settings, set up
    ``prepare(job, n)``        before the inputs are written: start slow things early (optional)
    ``submit_independent(job)``  ``job.submit()``: start ``job.tasks``; again on ``job.retry()``
                               and on a rerun of lost tasks, with exactly the tasks to rerun
    ``submit_communicating(job)``  ``ew.submit_communicating``: start N ranks together
    ``native_after(job)``      a job made with ``after=``: whether ``submit_*`` makes it wait
                               for ``job.after`` itself (a scheduler's dependency; optional)
    ``job_state(job, snap)``   ``check()``, ``wait()``, ``Task.state``: a pure query that may
                               make the folder's view fresher (pending reasons, a note)
    ``poll(job)``              periodically while a client looks at the job: find tasks that
                               ended without a result and ``report_lost`` them, mirror results
    ``cancel_job(job)``        ``job.cancel()``, after the job is marked cancelled in its folder
    ``cancel_task(job, i)``    ``job.tasks[i].cancel()``, after the task is marked cancelled
    ``delete_job(job)``        ``job.purge()``, before the folder is removed
    =========================  ==================================================================

    What the library does, whatever the backend: a task shows ``running`` while a worker
    runs it (``python -m elsewhere.worker`` records it in the job folder), cancels and
    retries are written to the job folder first, and a worker on this machine that dies
    mid-task is reported lost. A backend keeps what it must find again (scheduler ids, hosts,
    pids) with :meth:`set_job_cluster_data` / :meth:`get_job_cluster_data`, stored in the job
    folder, so a job recovered in a new process still knows it. It declares its
    ``additional_properties`` (:attr:`properties`) and its :attr:`capabilities`. A cluster
    is rebuilt in another process from :meth:`describe`.

    Args:
        cores_per_task: cores each task gets (``ew.task().cores``); a node
            with C cores runs ``C // cores_per_task`` tasks at once.
        storage: where job folders go; default ``<home>/jobs``.
        additional_properties: the backend's free settings, checked against its
            declared :attr:`properties` (an unknown name or a wrong type is a ConfigError
            that lists the known ones); defaults fill what is not given.
    """

    #: The registry key of the backend ("local", "slurm", ...).
    kind: ClassVar[str] = ""

    #: The ``additional_properties`` this backend reads: ``{name: Property(type, default, doc)}``.
    #: None: any name is accepted (a batch scheduler's templates may read anything).
    properties: ClassVar[Mapping[str, Property] | None] = {}

    #: What this backend can do beyond the common operations (see ``CAPABILITIES``); an
    #: operation it lacks raises a ConfigError that says so.
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        *,
        cores_per_task: int = 1,
        storage: str | Path | None = None,
        additional_properties: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(cores_per_task, int) or isinstance(cores_per_task, bool) or cores_per_task < 1:
            raise ConfigError(f"cores_per_task must be a positive integer, not {cores_per_task!r}")
        self.cores_per_task = cores_per_task
        if storage is not None and not isinstance(storage, (str, os.PathLike)):
            raise ConfigError(f"storage must be a folder (a str or a path), not {storage!r}")
        self.storage = Path(storage).expanduser().absolute() if storage else None
        self.additional_properties: dict[str, Any] = self._check_properties(additional_properties or {})

    def _check_properties(self, given: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(given, Mapping):
            raise ConfigError(f"additional_properties must be a dict, not {given!r}")
        declared = self.properties
        if declared is None:
            return dict(given)
        owner = self.kind or type(self).__name__
        unknown = sorted(set(given) - set(declared))
        if unknown:
            known = ", ".join(f"{n} ({p.doc})" if p.doc else n for n, p in sorted(declared.items())) or "none"
            raise ConfigError(f"unknown additional property {unknown[0]!r} for the {owner} cluster; "
                              f"it reads: {known} (a backend declares what it reads in its "
                              "`properties`)")  # fmt: skip
        out = {n: p.default for n, p in declared.items() if p.default is not None}
        out.update({n: declared[n].check(n, v, owner) for n, v in given.items()})
        return out

    # -- description --------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The constructor arguments that rebuild this cluster (JSON-able)."""
        return {
            "cores_per_task": self.cores_per_task,
            "storage": str(self.storage) if self.storage else None,
            "additional_properties": self.additional_properties,
        }

    def describe(self) -> dict[str, Any]:
        """``{"kind": ..., "class": "module:Class", **settings}``: enough to rebuild it elsewhere."""
        cls = type(self)
        return {"kind": self.kind, "class": f"{cls.__module__}:{cls.__qualname__}", **self.settings()}

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Cluster:
        """Rebuild from :meth:`settings`."""
        return cls(**settings)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items() if v not in (None, {}, [], ()))
        return f"{type(self).__name__}({args})"

    # -- the plugin operations ---------------------------------------------
    #: post_construct has run for this object (see :func:`ensure_post_constructed`)
    _post_constructed = False

    def post_construct(self) -> None:
        """Check that the cluster can work (commands present, settings valid) and set up what
        it needs. The library calls it once, when a user's cluster is first used
        (``ew.submit(..., on=cluster)``, ``ew.Executor(on=cluster)``, a profile), and never
        when a cluster is only rebuilt from a job folder to read the job's results or state.
        Raise :class:`~elsewhere.ConfigError` (or :class:`~elsewhere.CommandNotFound`) with
        what is wrong and how to fix it."""

    def max_workers(self, n_tasks: int) -> int:
        """How many workers a job of ``n_tasks`` may have at once; for an open stream job
        (``ew.Executor``) ``n_tasks`` is 0. Workers that claim tasks from the job's queue
        beyond this number find nothing to do and leave."""
        return max(1, n_tasks)

    def prepare(self, job: JobHandle, n_tasks: int) -> None:
        """Called before the inputs are written: start what takes time (workers), if
        anything. An error here is ignored (``submit_independent`` reports it)."""

    @abc.abstractmethod
    def submit_independent(self, job: JobHandle) -> None:
        """Start the tasks ``job.tasks``; return at once (they run detached).

        On ``job.submit()`` these are all the job's tasks; on ``job.retry()`` and on a
        rerun of lost tasks (``retries=``, :meth:`report_lost`), exactly the tasks to run
        again (``job.attempt(i)`` tells which attempt is due). An open stream job
        (``job.stream``, an ``ew.Executor``; only with the capability "stream") comes with
        no tasks: start up to ``max_workers(0)`` workers without ``--tasks``, which claim
        tasks from the job's queue as they are added and leave when it closes. A worker started with
        ``python -m elsewhere.worker --job DIR --tasks 3,5-7`` runs the given tasks and
        records their outcomes and running state in the job folder; the library derives
        every task's state from there. Raise an :class:`~elsewhere.ElsewhereError` subclass
        (e.g. :class:`~elsewhere.SchedulerError`) if nothing could be started: the job is
        then removed, nothing half-submitted is left.
        """

    def submit_communicating(self, job: JobHandle) -> None:
        """Start ``job``'s ``job.n_tasks`` ranks together (an MPI job), each running
        ``python -m elsewhere.worker --job DIR --mpi`` under an MPI launcher. Only for
        backends with the capability "communicating"."""
        raise ConfigError(f"the {self.kind or type(self).__name__} cluster cannot run communicating jobs")

    def native_after(self, job: JobHandle) -> bool:
        """Whether this backend makes ``job`` wait for the jobs ``job.after`` itself (they
        were made with ``after=`` and have not finished): a batch scheduler's dependency
        (SLURM's ``--dependency=afterok:ID``). If True, the library submits ``job`` at once,
        and ``submit_independent`` (or ``submit_communicating``) must see that its tasks start
        only once every job of ``job.after`` finished OK; the library still cancels it when
        one of them fails. The default, False: the library holds the job (it is submitted
        once they finished), which works on every backend."""
        return False

    def job_state(self, job: JobHandle, snapshot: Snapshot) -> Snapshot:
        """A fresher view than ``snapshot`` (read from the job folder), if the backend knows
        one: return it, or a copy with ``reasons`` (``{task: "pending: Resources"}``),
        ``note`` or ``running`` filled in. A pure query: do not change the job here (report
        lost tasks from :meth:`poll`). The default returns ``snapshot``."""
        return snapshot

    def poll(self, job: JobHandle) -> None:
        """Periodic care while a client looks at the job (``check``, ``wait``): find tasks
        that ended without a result and :meth:`report_lost` them, start replacements,
        mirror results back. The default does nothing."""

    def cancel_job(self, job: JobHandle) -> None:
        """Stop everything of ``job``. The library has marked it cancelled in the job folder
        already (nothing new starts); stop what runs."""

    def cancel_task(self, job: JobHandle, index: int) -> None:
        """Stop task ``index``; the others go on. The library has marked it cancelled in the
        job folder already (no worker claims it from then on; a result, if one comes, is
        kept); stop it if it runs, or if a worker has claimed it already (a worker does not
        look at the queue again before each task of its claim). The default does nothing more.
        (An Executor's call that a worker of this machine runs, claimed from the queue, the
        library stops itself after this: a plugin's processes cannot tell which runs it.)"""

    def delete_job(self, job: JobHandle) -> None:
        """Remove what the backend keeps of ``job`` outside its folder (copies on other
        machines, scheduler records); stop what still runs. The library removes the folder
        and the registry entry afterwards. The default does nothing."""

    def report_lost(self, job: JobHandle, reasons: dict[int, str]) -> Snapshot:
        """Tasks that ended without a result (``{task: why}``): their scheduler job ended,
        their process is gone. Call it from ``poll`` or ``job_state``.

        While the job's ``retries`` last, each such task runs again: the library calls
        :meth:`submit_independent` with ``job.tasks`` set to exactly those tasks. After
        that, the task fails as "lost" and ``why`` becomes its TaskError's message. A task
        that has a result meanwhile is left alone. Returns the tasks' states after the
        report (current: the next ``snapshot()`` sees it too). Workers started by a plugin
        on this machine that die while they run a task are found and reported by the
        library itself.
        """
        return job.report_lost(reasons)

    def takes_resources(self) -> bool:
        """Whether ``job.retry(**resources)`` may give this backend resources (``mem=``,
        ``walltime=``), which reach ``submit_independent`` as ``job.resources``: the
        capability "retry_resources"."""
        return "retry_resources" in self.capabilities

    # -- cluster data -----------------------------------------------------------
    def set_job_cluster_data(self, job: JobHandle, data: dict[str, Any]) -> None:
        """Store what this backend must find again (scheduler ids, hosts, pids)."""
        job.store.set_cluster_data(data)

    def get_job_cluster_data(self, job: JobHandle) -> dict[str, Any]:
        """What :meth:`set_job_cluster_data` stored; ``{}`` if nothing."""
        return job.store.cluster_data()

    # -- environment of the job ---------------------------------------------------
    def shares_filesystem(self) -> bool:
        """True when workers see the client's files at the same paths."""
        return True

    def sends_files(self) -> bool:
        """True when a job's ``files=`` reach its tasks wherever they run."""
        return True


def ensure_post_constructed(cluster: Cluster) -> Cluster:
    """Run ``cluster.post_construct()`` unless it ran already for this object; the cluster."""
    if not cluster._post_constructed:
        cluster.post_construct()
        cluster._post_constructed = True
    return cluster


def option_words(name: str, value: Any) -> list[str]:
    """``value`` of option ``name`` as a list of words; a ConfigError unless it is a list or a
    tuple of strings (a lone string is refused: its letters are no words)."""
    if isinstance(value, (list, tuple)) and all(isinstance(w, str) for w in value):
        return list(value)
    raise ConfigError(f"{name} must be a list of words (strings), not {value!r}")


def option_typed(name: str, value: Any, types: type | tuple[type, ...], what: str) -> Any:
    """``value`` of option ``name`` if it is None or of ``types`` (True is no int here); else
    a ConfigError that says it must be ``what``."""
    kinds = types if isinstance(types, tuple) else (types,)
    if value is None or (isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))):
        return value
    raise ConfigError(f"{name} must be {what}, not {value!r}")


def option_path(name: str, value: Any) -> str | None:
    """``value`` of option ``name``, a file's path (str or os.PathLike) or None, as an absolute
    path with ``~`` expanded; else a ConfigError."""
    value = option_typed(name, value, (str, os.PathLike), "a file's path")
    return str(Path(value).expanduser().absolute()) if value is not None else None


def option_file(name: str, value: Any) -> str | None:
    """``value`` of option ``name``, a file's path (str or os.PathLike) or None, as a str (as
    given: relative or with ``~``); else a ConfigError."""
    value = option_typed(name, value, (str, os.PathLike), "a file's path")
    return os.fspath(value) if value is not None else None


def option_text(name: str, value: Any) -> str | None:
    """``value`` of option ``name``, which must be a string or None; else a ConfigError."""
    return option_typed(name, value, str, "a string")


def option_seconds(name: str, value: Any) -> float:
    """``value`` of option ``name`` as seconds (a finite number of 0 or more); else a
    ConfigError."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and math.isfinite(value) and value >= 0:
        return float(value)
    raise ConfigError(f"{name} must be a number of seconds (0 or more), not {value!r}")


def refuse_unknown(cluster: Cluster, unknown: Mapping[str, Any]) -> None:
    """A ConfigError naming the settings ``cluster`` was given but does not take, and listing
    those it does (read from its ``__init__``), instead of Python's TypeError; nothing if none."""
    if not unknown:
        return
    import inspect

    takes: list[str] = []
    # a subclass's __init__(**settings) passes them on to its bases': theirs count too
    for cls in type(cluster).__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        takes += [p.name for p in params if p.name != "self" and p.name not in takes
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
        if not any(p.kind is p.VAR_KEYWORD for p in params) or cls is Cluster:
            break
    import difflib

    given = ", ".join(f"{k}={v!r}" for k, v in unknown.items())
    near = [m for k in unknown for m in difflib.get_close_matches(str(k), takes, n=1)]
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    owner = cluster.kind or type(cluster).__name__
    raise ConfigError(f"unknown option {given} for the {owner} cluster{hint}: it takes "
                      f"{', '.join(takes)}")  # fmt: skip
