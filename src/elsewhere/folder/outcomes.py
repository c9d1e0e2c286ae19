"""Reading what a job's tasks gave: values, errors, lost and cancelled tasks, and their output.

One reader for every place that shows a task's outcome (``job.results()``, ``Task.result``,
``ew.Executor``'s futures, ``elsewhere results``, ``elsewhere logs``), so each is read, and each
failure described, the same way:

- a value: the task's result body, read from its worker's results file;
- an error: a :class:`~elsewhere.TaskError` made from the error record the worker wrote (type,
  message, traceback, host, the exception itself where it could be pickled);
- lost: a TaskError of reason "lost": the backend's reason, or what the vanished worker last
  printed;
- cancelled: a TaskError of reason "cancelled";
- damaged: a TaskError of reason "damaged" (type name "DamagedJob") saying which file and
  task, "damaged: results/w3.bin, task 7, checksum mismatch", never a wrong value. A body
  whose checksum does not hold is marked damaged in the job folder at once (the task is then
  failed for everyone, and ``job.retry()`` runs it again); a results file missing or cut short
  is marked so by the next poll of a job whose tasks have all ended (it may be a copy that a
  pull is completing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..util.errors import DamagedJob, ElsewhereError, JobError, TaskError
from ..util.states import TaskState
from .errorrecord import ErrorRecord
from .journal import body_damage, read_body, read_log
from .records import FLAG_DAMAGED, Kind, Record
from .store import is_control

if TYPE_CHECKING:
    from .handle import JobHandle
    from .snapshot import Snapshot


class OutcomeReader:
    """The values of one job's tasks, read through its handle (bodies cached by file offset:
    a range of fast tasks shares one body)."""

    def __init__(self, handle: JobHandle) -> None:
        self.handle = handle
        self.cache: dict[tuple[str, int], list[Any]] = {}
        self.bad: dict[tuple[str, int], DamagedJob] = {}  # bodies found damaged, by (worker, offset)

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
                why = self.handle.store.queue().cancel_reason if self.handle.spec.get("after") else None
                return TaskError("the task was cancelled before it finished" + (f": {why}" if why else ""),
                                 type_name="Cancelled",
                                 index=index, job=self._name, reason="cancelled", seed=self._seed(index))
            raise JobError(f"task {index} of job {self._name!r} has no result yet (it is {st.value})")
        wid, rec = f
        if rec.kind == Kind.LOST:
            return self.lost_error(index, rec)
        if rec.kind == Kind.CANCELLED:
            return TaskError("the task was cancelled", type_name="Cancelled", index=index,
                             job=self._name, reason="cancelled", seed=rec.seed)
        try:
            bad = self.bad.get((wid, rec.res_off))
            if bad is not None:
                raise bad
            value = read_body(self.handle.store, wid, rec, self.cache, index)
        except DamagedJob as exc:
            marks: dict[int, tuple[int, str]] = {}
            err = self.damaged(index, wid, rec, exc, marks)
            self._mark(marks)
            return err
        if rec.kind == Kind.ERROR:
            return task_error(value, self._name, rec)
        return value

    def damaged(self, index: int, wid: str, rec: Record, exc: DamagedJob,
                marks: dict[int, tuple[int, str]]) -> TaskError:  # fmt: skip
        """The TaskError of task ``index``, whose body (``rec``'s, in worker ``wid``'s results)
        is damaged; a body whose bytes are there but wrong is noted in ``marks`` (every task of
        it) to be marked damaged in the folder, once a second read finds it damaged too."""
        err = self.damaged_error(index, f"{exc.path}, task {index}, {exc.what}", exc)
        key = (wid, rec.res_off)
        if key in self.bad:
            return err
        self.bad[key] = exc  # one look per body (the tasks of a range or group share it)
        if exc.what.startswith(("cut short", "the file is missing")):
            return err  # perhaps a copy being completed: the next poll of an ended job looks again
        if body_damage(self.handle.store, wid, rec) is None:
            return err  # whole at a second look: written meanwhile (a copy pulled)
        for (w, r), tasks in self.handle.outcomes.by_entry().items():
            if w == wid and r.res_off == rec.res_off and not r.flags & FLAG_DAMAGED:
                for t in tasks:
                    marks[t] = (r.attempt, f"damaged: {exc.path}, task {t}, {exc.what}")
        return err

    def damaged_error(self, index: int, message: str, exc: BaseException | None = None) -> TaskError:
        """A TaskError of reason "damaged" for task ``index``."""
        return TaskError(message, type_name="DamagedJob", index=index, job=self._name, reason="damaged",
                         seed=self._seed(index), exception=exc)  # fmt: skip

    def _mark(self, marks: dict[int, tuple[int, str]]) -> None:
        """Mark tasks damaged in the folder (best effort: the errors are returned anyway)."""
        if marks:
            try:
                self.handle.mark_damaged(marks)
            except (OSError, ValueError, ElsewhereError):
                pass

    def lost_error(self, index: int, rec: Record) -> TaskError:
        """The TaskError of a task lost with its worker: the backend's reason, or what the
        worker that vanished last printed (a crash report names the error first); of a task
        whose outcome was found damaged, what is damaged."""
        store = self.handle.store
        q = store.queue()
        if rec.flags & FLAG_DAMAGED:
            said = q.lost_reason(index) or f"damaged: the outcome of task {index}"
            return self.damaged_error(index, said.removeprefix("damaged: "))
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
        marks: dict[int, tuple[int, str]] = {}
        i = 0
        while i < n:
            f = get(i)
            if f is not None and f[1][0] == ok and not f[1][1]:
                rec = f[1]
                values = cache.get((f[0], rec.res_off))
                if values is None:
                    try:
                        bad = self.bad.get((f[0], rec.res_off))
                        if bad is not None:
                            raise bad
                        value = read_body(store, f[0], rec, cache, i)
                    except DamagedJob as exc:
                        value = self.damaged(i, f[0], rec, exc, marks)
                        failed.append(i)
                        append(value)
                        i += 1
                        continue
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
        self._mark(marks)
        return out, failed, missing

    def log(self, index: int, snap: Snapshot) -> str:
        """What task ``index`` printed (stdout and stderr); while it runs, so far."""
        store = self.handle.store
        f = snap.final.get(index)
        if f is not None:
            wid, rec = f
            if is_control(wid):
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
            if is_control(f[0]):
                return self.handle.store.queue().lost_by(index)
            return f[0]
        r = snap.running.get(index)
        return r[0] if r else None


def task_error(value: dict[str, Any], job: str, rec: Record) -> TaskError:
    """The TaskError of a failed task, from the error record its worker wrote."""
    return ErrorRecord.from_value(value).task_error(job, index=rec.task, seed=rec.seed)
