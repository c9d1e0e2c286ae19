"""Reading what a job's tasks gave: values, errors, lost and cancelled tasks, and their output.

One reader for every place that shows a task's outcome (``job.results()``, ``Task.result``,
``ew.Executor``'s futures, ``elsewhere results``, ``elsewhere logs``), so each is read, and each
failure described, the same way:

- a value: the task's result body, read from its worker's results file;
- an error: a :class:`~elsewhere.TaskError` made from the error record the worker wrote (type,
  message, traceback, host, the exception itself where it could be pickled);
- lost: a TaskError of reason "lost": the backend's reason, or what the vanished worker last
  printed;
- cancelled: a TaskError of reason "cancelled".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..util.errors import JobError, TaskError
from ..util.states import TaskState
from .errorrecord import ErrorRecord
from .journal import read_body, read_log
from .records import Kind, Record
from .store import CONTROL

if TYPE_CHECKING:
    from .handle import JobHandle
    from .snapshot import Snapshot


class OutcomeReader:
    """The values of one job's tasks, read through its handle (bodies cached by file offset:
    a range of fast tasks shares one body)."""

    def __init__(self, handle: JobHandle) -> None:
        self.handle = handle
        self.cache: dict[tuple[str, int], list[Any]] = {}

    @property
    def _name(self) -> str:
        return self.handle.name

    def _seed(self, index: int) -> int:
        return int(self.handle.spec.get("seed") or 0) + index

    def value(self, index: int, snap: Snapshot | None) -> Any:
        """Task ``index``'s value, or its TaskError. An outcome already read stands (a rerun
        makes the reader forget it first); ``snap`` is looked at only when there is none.
        Raises JobError while the task has no outcome."""
        f = self.handle.outcomes.get(index)
        if f is None and snap is not None:
            f = snap.final.get(index)
        if f is None:
            st = snap.task_state(index) if snap is not None else TaskState.PENDING
            if st is TaskState.CANCELLED:
                return TaskError("the task was cancelled before it finished", type_name="Cancelled",
                                 index=index, job=self._name, reason="cancelled", seed=self._seed(index))
            raise JobError(f"task {index} of job {self._name!r} has no result yet (it is {st.value})")
        wid, rec = f
        if rec.kind == Kind.LOST:
            return self.lost_error(index, rec)
        if rec.kind == Kind.CANCELLED:
            return TaskError("the task was cancelled", type_name="Cancelled", index=index,
                             job=self._name, reason="cancelled", seed=rec.seed)
        value = read_body(self.handle.store, wid, rec, self.cache, index)
        if rec.kind == Kind.ERROR:
            return task_error(value, self._name, rec)
        return value

    def lost_error(self, index: int, rec: Record) -> TaskError:
        """The TaskError of a task lost with its worker: the backend's reason, or what the
        worker that vanished last printed (a crash report names the error first)."""
        store = self.handle.store
        q = store.queue()
        if q.lost_by(index) is None and q.lost_reason(index) is None:
            # The reaper appends the record before it writes the queue that says
            # who was lost: wait for it to finish (it holds the lock meanwhile).
            with store.locked_queue():
                pass
            q = store.queue()
        why = q.lost_reason(index)
        if why:
            return TaskError(why, type_name="WorkerLost", index=index, seed=self._seed(index),
                             job=self._name, reason="lost")
        wid = q.lost_by(index) or ""
        info = store.worker_info(wid) if wid else {}
        output = read_log(store, wid, rec.log_off, rec.log_len) if wid else ""
        head = "\n".join(output.strip().splitlines()[:8])
        msg = (f"the worker running it (pid {info.get('pid', '?')}) vanished: it crashed or was "
               "killed (out of memory? a segfault in compiled code? a kill signal?)")
        if head:
            msg += f"; its output:\n{head}"
        return TaskError(msg, type_name="WorkerLost", host=info.get("host", ""), index=index,
                         seed=self._seed(index), job=self._name, reason="lost")

    def values(self, snap: Snapshot) -> tuple[list[Any], list[int], int]:
        """Every task's value in order, as ``snap`` knows them: (values, the indices whose
        value is a TaskError of the job's own making, how many have no outcome yet: None)."""
        out: list[Any] = []
        failed: list[int] = []
        missing = 0
        final = snap.final
        ok = int(Kind.OK)
        cache = self.cache
        store = self.handle.store
        get = final.get
        append = out.append
        communicating = bool(self.handle.spec.get("communicating"))
        n = snap.n
        i = 0
        while i < n:
            f = get(i)
            if f is not None and f[1][0] == ok and not f[1][1]:
                rec = f[1]
                values = cache.get((f[0], rec.res_off))
                if values is None:
                    value = read_body(store, f[0], rec, cache, i)
                    values = cache.get((f[0], rec.res_off))
                    if values is None:
                        append(value)
                        i += 1
                        continue
                end = min(n, final.run_end(i)) if rec.count > 1 else i
                if end - i > 1:
                    # the rest of a range record, none of it overtaken by a retry: one slice
                    out.extend(values[rec.item + i - rec.task:rec.item + end - rec.task])
                    i = end
                    continue
                append(values[rec.item + i - rec.task])
            elif f is not None or snap.task_state(i) is TaskState.CANCELLED:  # errors, single bodies
                v = self.value(i, snap)
                if isinstance(v, TaskError):
                    if communicating:
                        v.rank = i
                    failed.append(i)
                out.append(v)
            else:
                missing += 1
                out.append(None)
            i += 1
        return out, failed, missing

    def log(self, index: int, snap: Snapshot) -> str:
        """What task ``index`` printed (stdout and stderr); while it runs, so far."""
        store = self.handle.store
        f = snap.final.get(index)
        if f is not None:
            wid, rec = f
            if wid == CONTROL:
                wid = store.queue().lost_by(index) or ""
            text = read_log(store, wid, rec.log_off, rec.log_len) if wid else ""
            if rec.count > 1 and text:
                text = (f"[tasks {rec.task}..{rec.task + rec.count - 1} ran as one fast batch; "
                        "this is their output together]\n") + text
            return text
        r = snap.running.get(index)
        if r is not None:
            _, _, off = store.read_running(r[0])
            return read_log(store, r[0], off, -1)
        return ""

    def worker_of(self, index: int, snap: Snapshot) -> str | None:
        """The worker that ran (or runs) task ``index``, if any."""
        f = snap.final.get(index)
        if f is not None:
            if f[0] == CONTROL:
                return self.handle.store.queue().lost_by(index)
            return f[0]
        r = snap.running.get(index)
        return r[0] if r else None


def task_error(value: dict[str, Any], job: str, rec: Record) -> TaskError:
    """The TaskError of a failed task, from the error record its worker wrote."""
    return ErrorRecord.from_value(value).task_error(job, index=rec.task, seed=rec.seed)
