"""The public functions: map, submit, create_job, recover, jobs (the cluster constructors,
local, ssh, peers, slurm, batch and cluster, are in ``clusters.py``)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from ..backends.base import Cluster
from ..core.dependencies import resolve as resolve_after
from ..core.submit import making
from ..folder import housekeeping
from ..folder.lifecycle import busy, create_store, new_job_meta
from ..folder.registry import Registry
from ..folder.store import JobStore
from ..util import paths
from ..util.errors import ConfigError, JobNotFound, TaskError
from ..util.retry import Retry
from ..util.units import parse_duration
from .clusters import batch, cluster, local, peers, slurm, ssh
from .clusters import resolve as _resolve
from .job import Job, raise_first_failure, write_and_submit

if TYPE_CHECKING:  # the options as type checkers see them (not imported at run time)
    import sys

    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

    from .options import JobOptions

T = TypeVar("T")


def _is_dataframe(x: Any) -> bool:
    t = type(x)
    return t.__name__ == "DataFrame" and t.__module__.startswith("pandas")


def tasks_from_inputs(iterables: tuple[Iterable[Any], ...]) -> tuple[list[Any], str]:
    """One entry per task, and their form: ``"single"`` (one iterable: its
    elements, each a task's only argument), ``"args"`` (zipped iterables:
    argument tuples) or ``"entries"`` (a DataFrame: one ``(None, (),
    row_as_kwargs)`` triple per row).
    """
    if not iterables:
        raise ConfigError("give at least one iterable of inputs (one task per element)")
    if len(iterables) == 1 and _is_dataframe(iterables[0]):
        df: Any = iterables[0]
        return [(None, (), {str(k): v for k, v in row.items()}) for row in df.to_dict("records")], "entries"
    for i, it in enumerate(iterables):
        if isinstance(it, (str, bytes)) or not hasattr(it, "__iter__"):
            raise ConfigError(
                f"input {i} is not an iterable of task inputs (got {type(it).__name__}); "
                "wrap a single value in a list"
            )
    if len(iterables) == 1:
        return list(iterables[0]), "single"
    lengths = [len(it) for it in iterables if isinstance(it, Sized)]
    if len(lengths) == len(iterables) and len(set(lengths)) > 1:  # a task lost to a typo
        raise ConfigError(
            f"the inputs have different lengths ({', '.join(map(str, lengths))}): one task per "
            "element of each; to keep an argument the same in every task, repeat it "
            "(itertools.repeat, which zips to the others' length) or bind it with functools.partial"
        )
    return list(zip(*iterables)), "args"


def _default_name(fn: Any) -> str:
    base = getattr(fn, "__name__", "job")
    if not base.isidentifier():
        base = "job"
    return f"{base}-{os.urandom(3).hex()}"


def create_job(
    on: Cluster | str | None = None,
    *,
    name: str | None = None,
    tag: str = "",
    seed: int | None = None,
    retries: int | Retry = 0,
    after: Job[Any] | str | Iterable[Job[Any] | str] | None = None,
    files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None,
    job_data: Any = None,
    env: dict[str, str] | None = None,
    storage: str | os.PathLike[str] | None = None,
    _fn: Any = None,
    _stream: bool = False,
    _n_tasks: int = 0,
    _submitting: bool = False,
    _waited: bool = False,
    _purged: bool = False,
) -> Job[Any]:
    """A new, empty job (MATLAB's createJob): add tasks, then ``submit()``.

    Args:
        on: the cluster (default ``ew.local()``) or a profile name.
        name: unique among running jobs; default the function name plus a random suffix.
        tag: free text kept with the job.
        seed: task i runs with ``random`` and NumPy seeded from seed + i; default
            a random seed (recorded). Seeding costs only what a job uses (``random``
            once loaded, NumPy on a task's first draw). ``False`` turns per-task
            seeding off.
        retries: how many times a task whose worker vanished is run again; or an
            :class:`~elsewhere.Retry` that also runs again tasks that raised an exception of
            given types, after a growing delay: ``ew.Retry(times=3, on=(OSError,
            TimeoutError), delay_s=1, backoff=2.0, max_delay_s=60)``.
        after: jobs (Job objects, or their names or ids) that must finish OK before this
            one runs: its tasks start once every task of theirs finished; if one of them
            fails or is cancelled, this job is cancelled, with a reason naming it.
            Cancelling a job cancels the jobs that wait for it. Batch schedulers wait
            natively where they can (SLURM ``--dependency=afterok``, SGE ``-hold_jid``, PBS
            ``-W depend=afterok``, LSF ``-w "done(ID)"``, Flux ``--dependency=afterok``);
            elsewhere the library holds the job until then.
        files: files and folders (one path, or a list of them) copied into the job (they
            sit in the task's working directory when the caller's is not there, and are on
            ``sys.path``).
        job_data: sent once per worker; tasks read it as ``ew.task().job_data``.
        env: environment variables set while the tasks run.
        storage: folder for the job folder (default: the cluster's, else ``<home>/jobs``).
    """
    cl = _resolve(on)
    if name is not None and (not isinstance(name, str) or not name.strip()
                             or any(ord(c) < 32 for c in name) or len(name) > 200):
        raise ConfigError(f"a job name must be a non-empty line of text (at most 200 characters), not {name!r}")
    retry = Retry.of(retries)  # a ConfigError for anything else
    waits_for = resolve_after(after)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big") >> 1  # 31 random bits
    elif seed is False:
        seed = None  # no per-task seeding: for floods of tiny tasks that use no randomness
    elif not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, None (random) or False (off), not {seed!r}")
    files = _file_list(files)
    if storage is not None and not isinstance(storage, (str, os.PathLike)):
        raise ConfigError(f"storage= must be the path of a folder (a str or a pathlib.Path), not {storage!r}")
    root = Path(storage).expanduser().absolute() if storage else (cl.storage or paths.default_storage())
    job_id = time.strftime("%Y%m%d-%H%M%S-") + os.urandom(4).hex()
    meta = new_job_meta(name=name or _default_name(_fn), job_id=job_id, cluster=cl.describe(),
                        cores_per_task=cl.cores_per_task, seed=seed, tag=tag,
                        retries=retry.lost_reruns, env=env, stream=_stream, retry=retry.spec(),
                        after=waits_for)  # fmt: skip
    if _submitting:  # ew.submit: written once, whole (the payload follows at once)
        meta["n_tasks"] = _n_tasks
        meta["submitted"] = time.time()
    if _waited:  # ew.map: its caller waits for the end (a peer controller then runs there)
        meta["waited"] = True
        if _purged:  # ... and purges the job then: its workers wake it once each, at their end
            meta["notify"] = "end"
    if not cl.shares_filesystem():
        # Paths of this machine mean nothing over there (even where they happen
        # to exist): tasks run in the job's files folder, code travels by value.
        meta["cwd"] = None
        meta["sys_path"] = []
    with making(root / job_id, meta["name"]):  # a failure (a full disk) leaves no folder behind
        store = create_store(root, meta, retries=retry.lost_reruns, stream=_stream, n_tasks=_n_tasks)
        if files:
            _copy_files(store, files)
    if files and not cl.sends_files():
        import warnings

        warnings.warn(
            f"{type(cl).__name__} does not send files= to its workers: tasks find them only on "
            "machines where the caller's directory exists (the same machine, or a shared file "
            "system); pass their contents as arguments or job_data to reach other machines",
            UserWarning, stacklevel=3,
        )  # fmt: skip
    return Job(store, cl, meta, job_data=job_data, queue_n=_n_tasks)


def _file_list(files: Any) -> list[str | os.PathLike[str]]:
    """``files=`` as a list of paths: one path is a list of it (not of its characters)."""
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        return [files]
    listed = list(files) if isinstance(files, Iterable) and not isinstance(files, (bytes, dict)) else [files]
    if not all(isinstance(f, (str, os.PathLike)) for f in listed):
        raise ConfigError(f"files= must be a path or a list of paths (str or pathlib.Path), not {files!r}")
    return listed


def _copy_files(store: JobStore, files: Iterable[str | os.PathLike[str]]) -> None:
    import shutil

    dest = store.path / "files"
    dest.mkdir(mode=0o700, exist_ok=True)
    for f in files:
        src = Path(f).expanduser()
        if not src.exists():
            shutil.rmtree(store.path, ignore_errors=True)
            raise ConfigError(f"files=: {str(f)!r} does not exist (looked in {Path.cwd()})")
        target = dest / src.name
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            shutil.copy2(src, target)


def submit(
    fn: Callable[..., T],
    *iterables: Iterable[Any],
    on: Cluster | str | None = None,
    name: str | None = None,
    _waited: bool = False,
    _purged: bool = False,
    **options: Unpack[JobOptions],
) -> Job[T]:
    """Run ``fn`` once per element of the zipped ``iterables``; return the Job at once.

    Inputs of different lengths are refused when all have a length (a task lost to a
    typo); an unsized one (a generator, ``itertools.repeat``) zips to the others.

    A single pandas DataFrame gives one task per row, its columns as keyword
    arguments. Options are those of :func:`create_job` (seed, retries, after, tag,
    files, job_data, env, storage). The tasks run detached: they go on if
    this process ends, and ``ew.recover(name)`` finds the job again.
    """
    if not callable(fn):
        raise ConfigError(f"submit needs a callable first, not {fn!r}")
    unknown = sorted(set(options) - _option_names())
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r}; the options are {', '.join(sorted(_option_names()))}. "
            "Arguments of the function go in the iterables, one per task (keyword arguments "
            "as the columns of a DataFrame), or are bound with functools.partial"
        )
    with busy():  # thousands of argument tuples: no collector; housekeeping waits
        tasks, form = tasks_from_inputs(iterables)
        if not tasks:  # a job without tasks would wait for ever
            raise _NoTasks("nothing to run: the inputs are empty (ew.map returns [] for them)")
        _warn_repeated(fn, tasks, form, stacklevel=4 if _waited else 3)
        job = create_job(on, name=name, _fn=fn, _n_tasks=len(tasks), _submitting=True, _waited=_waited,
                         _purged=_purged, **options)  # fmt: skip
        # ew.map's job, its name made unique: listed once it has run a second (its purge
        # forgets the registration of a shorter one: no registry work at all)
        write_and_submit(job, fn, tasks, form, register_late=_purged and name is None)
    return job


_REPEATED_MIN_BYTES = 1 << 20  # an argument every task shares, worth a word when it is this large
_REPEATED_WASTE_BYTES = 64 << 20  # ... and its copies after the first add up to this


def _nbytes(obj: Any) -> int:
    """What ``obj`` weighs in a payload: its pickle and its out-of-band buffers (0 if it
    cannot be pickled here: cloudpickle will say more when the payload is written)."""
    nbytes = getattr(obj, "nbytes", None)  # NumPy arrays, memoryviews: no pickling to know
    if isinstance(nbytes, int) and not isinstance(obj, type):
        return nbytes
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj)
    import pickle

    bufs: list[Any] = []
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    except Exception:
        return 0
    return len(data) + sum(memoryview(b).nbytes for b in bufs)


def _warn_repeated(fn: Any, tasks: list[Any], form: str, *, stacklevel: int) -> None:
    """Warn when one large object is an argument of every task: the payload holds it once
    per task (``[a] * n``, ``itertools.repeat(a)``), where ``functools.partial`` or
    ``job_data`` would store it once and send it once per worker."""
    n = len(tasks)
    if n < 2 or form not in ("single", "args"):
        return
    first = tasks[0]
    if form == "single":
        shared = [(0, first)] if all(t is first for t in tasks) else []
    else:
        shared = [(p, v) for p, v in enumerate(first) if all(t[p] is v for t in tasks)]
    for p, value in shared:
        size = _nbytes(value)
        if size < _REPEATED_MIN_BYTES or size * (n - 1) < _REPEATED_WASTE_BYTES:
            continue
        import warnings

        from ..util.units import format_size

        what = "the input of every task" if form == "single" else f"argument {p + 1} of every task"
        warnings.warn(
            f"{what} is the same {format_size(size)} object: the job stores it, and sends it, once "
            f"per task ({n} times, {format_size(size * n)}); bind it to the function with "
            f"functools.partial({getattr(fn, '__name__', 'fn')}, ...), or pass it as job_data= "
            "(ew.task().job_data in the task), and it is stored once and sent once per worker",
            UserWarning, stacklevel=stacklevel,
        )  # fmt: skip
        return


class _NoTasks(ConfigError):
    """submit was given no tasks."""


@functools.cache
def _option_names() -> frozenset[str]:
    """The options that :func:`submit` and :func:`map` pass on to :func:`create_job`."""
    import inspect

    names = inspect.signature(create_job).parameters
    return frozenset(n for n in names if n not in ("on", "name") and not n.startswith("_"))


@overload
def map(
    fn: Callable[..., T],
    *iterables: Iterable[Any],
    on: Cluster | str | None = None,
    errors: Literal["raise"] = "raise",
    timeout: float | str | None = None,
    progress: bool | None = None,
    keep: bool = False,
    combine: Literal[False] = False,
    name: str | None = None,
    **options: Unpack[JobOptions],
) -> list[T]: ...
@overload
def map(
    fn: Callable[..., T],
    *iterables: Iterable[Any],
    on: Cluster | str | None = None,
    errors: Literal["return"],
    timeout: float | str | None = None,
    progress: bool | None = None,
    keep: bool = False,
    combine: Literal[False] = False,
    name: str | None = None,
    **options: Unpack[JobOptions],
) -> list[T | TaskError]: ...
@overload
def map(
    fn: Callable[..., Any],
    *iterables: Iterable[Any],
    on: Cluster | str | None = None,
    errors: Literal["raise", "return"] = "raise",
    timeout: float | str | None = None,
    progress: bool | None = None,
    keep: bool = False,
    combine: bool = False,
    name: str | None = None,
    **options: Unpack[JobOptions],
) -> Any: ...  # combine=True: lists concatenated, DataFrames row-bound
def map(
    fn: Callable[..., Any],
    *iterables: Iterable[Any],
    on: Cluster | str | None = None,
    errors: Literal["raise", "return"] = "raise",
    timeout: float | str | None = None,
    progress: bool | None = None,
    keep: bool = False,
    combine: bool = False,
    **options: Any,  # name= and the options of create_job (the overloads above list them)
) -> Any:
    """Like the built-in ``map``, but tasks run on a cluster; returns a list.

    ``submit`` + ``wait`` + results + ``purge`` in one call (dMod2's
    ``wait = TRUE``); on local workers the job is purged once the values are
    returned (in the background, at the process's exit at the latest).
    ``errors="raise"`` (default) raises the first task's error (a TaskError, and
    an instance of the original type where it can be rebuilt);
    ``errors="return"`` puts TaskError values in the list.
    ``timeout``: seconds or a duration ("10min") to wait before raising
    :class:`elsewhere.TimeoutError` (the job is cancelled and purged, unless kept).
    ``keep=True`` keeps the job (name it to recover it); ``combine=True``
    combines results like ``job.get()`` (lists concatenated, DataFrames
    row-bound).
    """
    from .job import combine as combine_values

    if errors not in ("raise", "return"):
        raise ConfigError(f'errors must be "raise" or "return", not {errors!r}')
    timeout_s = parse_duration(timeout, what="timeout")  # before a job is made of bad input
    try:
        job = submit(fn, *iterables, on=on, _waited=True, _purged=not keep, **options)
    except _NoTasks:
        return []  # as the built-in map: nothing in, nothing out
    ok = False
    try:
        job.wait(timeout=timeout_s, progress=progress)
        values = job.results()
        ok = True
    finally:
        if keep:
            Registry().set_state(job.id, job.state.value)
        elif ok and job.cluster.kind == "local":
            # A local job read whole: purged once the values are returned (in the background,
            # at exit at the latest; ew.jobs() here waits for it), which takes a tenth of a
            # warm map of tiny tasks off its time
            housekeeping.soon(functools.partial(_purge_quietly, job))
        else:
            if not ok:
                try:
                    job.cancel()
                except Exception:
                    pass
            job.purge()
    if errors == "raise":
        raise_first_failure(job, values)
    return combine_values(values) if combine else values


def _purge_quietly(job: Job[Any]) -> None:
    try:
        job.purge()
    except Exception as exc:  # (purged by another process meanwhile: JobGone)
        import logging

        logging.getLogger(__name__).debug("purging job %r after ew.map: %s", job.name, exc)


def _open(path: Path) -> Job[Any]:
    from ..core.submit import open_job

    cluster, handle = open_job(path)
    return Job(handle.store, cluster, dict(handle.spec))


def recover(name_or_id: str) -> Job[Any]:
    """The job of that name (the newest one) or id, from the registry."""
    rows = Registry().find(name_or_id)
    for row in rows:
        path = Path(row["path"])
        if (path / "job.json").exists():
            return _open(path)
    if rows:
        raise JobNotFound(f"job {name_or_id!r} is registered but its folder is gone ({rows[0]['path']})")
    raise JobNotFound(f"no job named {name_or_id!r} (see ew.jobs() or `elsewhere jobs`)")


def jobs(*, refresh: bool = True) -> list[dict[str, Any]]:
    """The registry: one dict per job (name, id, state, counts, cluster, created, path);
    a list that shows as a table in Jupyter."""
    from .notebook import JobTable

    housekeeping.drain()  # the jobs of this process's ew.map calls, purged once they returned
    out = JobTable()
    reg = Registry()
    for row in reg.all():
        entry = {
            "name": row["name"], "id": row["id"], "state": row["state"], "cluster": row["cluster"],
            "created": row["created"], "n_tasks": row["n_tasks"], "path": row["path"], "counts": {},
        }
        path = Path(row["path"])
        if refresh and (path / "job.json").exists():
            try:
                from ..core import control
                from ..core.submit import open_job

                cluster, handle = open_job(path)
                snap = control.snapshot(cluster, handle)
                counts = snap.counts()
                st = snap.job_state()
                entry["counts"] = {s.value: n for s, n in counts.items() if n}
                entry["n_tasks"] = snap.n
                if st.value != row["state"]:
                    reg.set_state(row["id"], st.value, snap.n)
                entry["state"] = st.value
            except Exception as exc:  # a damaged folder must not hide the others
                if not path.exists():
                    continue  # purged while listed
                entry["state"] = f"unreadable: {exc}"
        elif not (path / "job.json").exists():
            if not path.exists() and path.parent.is_dir():
                continue  # purged while listed
            entry["state"] = "missing"
        out.append(entry)
    return out


__all__ = ["batch", "cluster", "create_job", "jobs", "local", "map", "peers", "recover", "slurm", "ssh", "submit"]
