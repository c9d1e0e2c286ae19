"""The loops of a flood of tiny tasks that print nothing (``TaskRunner.run_quiet``).

A worker that has seen a job's tasks take microseconds runs a chunk of them in one loop,
and what that loop costs per task is what a flood of no-ops costs. Three loops, the first
that applies:

- **In C** (a worker's loop, whose values go to a list, while no seeded module is loaded):
  ``values.extend(map(fn, chunk))``, no Python code of elsewhere's own per task. The
  worker's map (``workers/<w>.cur``) says :data:`~elsewhere.folder.store.SEVERAL` meanwhile:
  a process that dies inside it costs none of the chunk's tasks (the reaper puts them all
  back, ``folder/journal.reap``), and the worker that takes them runs each alone, where one
  that kills its process again is named and charged (what values pickled together do too).
  ``ew.task()`` and the seeder read the running task's index from the count of values
  (``list.extend`` appends each as it comes, and keeps those made before a task that
  raised). A task that loads ``random`` or NumPy cuts the chunk short after itself (the
  seeder calls ``stop_loop``, which shortens the list the loop iterates): the tasks after
  it are seeded one by one.
- **In Python, the index in the map** (a peer task process, whose values go to a function
  that looks for output after each task): each task's index is written to the map alone
  (``ew.task()`` and the seeder read it there); a task that loads a seeded module ends it
  the same way.
- **One by one, seeded** (once ``random`` or NumPy is loaded): the map, the context and the
  seed set before each task.

Kept free of heavy imports: the worker imports it at start-up.
"""

from __future__ import annotations

from itertools import starmap

from ..folder.store import CUR, SEVERAL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, Protocol

    from ..folder.errorrecord import ErrorRecord
    from .context import TaskContext
    from .seeding import TaskSeeder

    class TaskRunner(Protocol):  # what of runner.TaskRunner the loops use (it imports them)
        ctx: TaskContext
        job_seed: int
        log_pos: int
        _seeds: TaskSeeder | None
        _cur: Any
        _cur_index: Any

        def error(self, exc: BaseException, index: int) -> ErrorRecord: ...

__all__ = ["run_flood"]

_pack_cur = CUR.pack_into


def run_flood(runner: TaskRunner, fn: Callable[..., Any], args: Sequence[Any], single: bool, first: int,
              start: int, end: int, append: Callable[[Any], Any], t0: float) -> tuple[int, dict[str, Any]] | None:  # fmt: skip
    """``runner.run_quiet``: tasks ``start .. end-1``, task ``j`` on ``args[j - first]``
    (``single``: its only argument, else its argument tuple), their values to ``append``.
    None when all ran; else ``(j, error)`` for the task ``j`` that raised."""
    ctx = runner.ctx
    js = runner.job_seed
    seeder = runner._seeds
    ctx.attempt = 0
    j = start
    if seeder is not None:
        seeder.job_seed = js
    values = getattr(append, "__self__", None)
    if (seeder is None or seeder.nothing_loaded) and type(values) is list:
        done = _in_c(runner, fn, args[start - first:end - first], single, start, values, t0)
        if done is None or isinstance(done, tuple):
            return done
        j = done
    elif seeder is None or seeder.nothing_loaded:
        cur_index = runner._cur_index
        _pack_cur(runner._cur, 0, start, t0, runner.log_pos)
        ctx._live = cur_index
        if seeder is not None:
            seeder._live = cur_index
        try:
            j = _in_python(fn, args[start - first:end - first], single, start, cur_index, append, seeder)
        except BaseException as exc:
            j = cur_index[0]  # the task that raised
            return j, runner.error(exc, j).to_value()
        finally:
            ctx._live = None
            _after(runner, cur_index[0])
        if j == end:
            return None
    return _seeded(runner, fn, args, single, first, j, end, append)


def _in_c(runner: TaskRunner, fn: Callable[..., Any], block: Any, single: bool, start: int, values: list[Any],
          t0: float) -> int | tuple[int, dict[str, Any]] | None:  # fmt: skip
    """The loop in C over ``block`` (task ``start`` first; a list of our own: see the module):
    None when all ran, ``(j, error)`` for a task that raised, else the task to run next
    (seeded: the one before it loaded a seeded module)."""
    if type(block) is not list:
        block = list(block)
    end = start + len(block)
    ctx, seeder = runner.ctx, runner._seeds
    n0 = len(values)
    ctx._live = live = _Running(values, start - n0)
    _pack_cur(runner._cur, 0, SEVERAL, t0, runner.log_pos)
    if seeder is not None:
        seeder._live = live

        def stop_loop() -> None:
            del block[len(values) - n0 + 1:]  # after the running task, the list iterator stops

        seeder.stop_loop = stop_loop
    raised = True
    try:
        values.extend(map(fn, block) if single else starmap(fn, block))
        raised = False
    except BaseException as exc:
        j = start + len(values) - n0
        return j, runner.error(exc, j).to_value()
    finally:
        ctx._live = None
        if seeder is not None:
            seeder.stop_loop = None
        _after(runner, start + len(values) - n0 - (not raised))  # the last task that ran
    j = start + len(values) - n0
    return None if j == end else j


def _after(runner: TaskRunner, k: int) -> None:
    """After a loop: ``ew.task()`` and the seeder say task ``k``, the last that ran."""
    ctx, seeder = runner.ctx, runner._seeds
    ctx.index = k
    ctx.seed = runner.job_seed + k
    if seeder is not None:
        seeder._live = None
        seeder._index = k


def _seeded(runner: TaskRunner, fn: Callable[..., Any], args: Sequence[Any], single: bool, first: int,
            start: int, end: int, append: Callable[[Any], Any]) -> tuple[int, dict[str, Any]] | None:  # fmt: skip
    """Tasks ``start .. end-1`` one by one, each seeded (a task loaded ``random`` or NumPy)."""
    seeder = runner._seeds
    assert seeder is not None
    ctx, cur_index, js = runner.ctx, runner._cur_index, runner.job_seed
    begin = seeder.begin
    j = start
    try:
        for j in range(start, end):
            cur_index[0] = j
            ctx.index = j
            ctx.seed = js + j
            if seeder.fired:
                seeder.rearm()
            begin(js, j)
            append(fn(args[j - first]) if single else fn(*args[j - first]))
    except BaseException as exc:
        return j, runner.error(exc, j).to_value()
    return None


class _Running:
    """``[0]``: the index of the task that runs now in the loop in C, which appends each
    task's value to ``values``: ``base`` + how many it holds."""

    __slots__ = ("base", "values")

    def __init__(self, values: list[Any], base: int) -> None:
        self.values = values
        self.base = base

    def __getitem__(self, _: int) -> int:
        return self.base + len(self.values)


class _NoSeeder:
    nothing_loaded = True


_NO_SEEDER = _NoSeeder()


def _in_python(fn: Callable[..., Any], args: Sequence[Any], single: bool, j: int, cur_index: Any,
               append: Callable[[Any], Any], watch: Any) -> int:
    """Call ``fn`` on each of ``args`` (task ``j`` first), each task's index in the map; until a
    task loads a module that ``watch`` (the job's seeder, or None) seeds. Returns the task
    that runs next. Keep it this short: it is what a peer's flood of no-ops costs per task."""
    if watch is None:
        watch = _NO_SEEDER
    if single:
        for a in args:
            if not watch.nothing_loaded:
                break
            cur_index[0] = j
            append(fn(a))
            j += 1
    else:
        for a in args:
            if not watch.nothing_loaded:
                break
            cur_index[0] = j
            append(fn(*a))
            j += 1
    return j
