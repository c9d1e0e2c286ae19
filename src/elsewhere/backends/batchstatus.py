"""What a batch scheduler says of a job's array elements, and what the batch backend does of it.

:class:`BatchStatus` is the batch backend's status side: one status command for every job of
a cluster, rate-limited and backed off while nothing changes, accounting for the jobs that
left the queue (``statuses``); a pure reading of them per job (``_survey``); ``job_state``,
a query that says why tasks wait; ``poll``, which reports the tasks of elements that ended
without a result as lost and cancels elements that can never start; and cancelling a job or
one task's element. Elements that claim their tasks (a packed submission) are read by
``claiming.py``.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..util.errors import SchedulerError
from ..util.signals import describe_status
from ..util.states import TaskState
from . import claiming

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..folder.snapshot import Snapshot
    from ..schedulers.syntax import NativeStatus, SchedulerSyntax
    from .remote import RemoteCluster

    _Base = RemoteCluster
else:
    _Base = object

_ENDED = (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED)

#: Pending reasons that mean "this will never start": the job asks for more
#: than the partition, the QOS or the account can ever give. Such a job is
#: cancelled and its tasks failed with the reason, rather than left waiting.
NEVER_STARTS = frozenset({
    "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
    "QOSMaxCpuPerJobLimit", "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit",
    "AssocMaxCpuPerJobLimit", "AssocMaxNodesPerJobLimit", "AssocMaxWallDurationPerJobLimit",
    "InvalidQOS", "InvalidAccount", "ReqNodeNotAvail, UnavailableNodes",
})


class BatchStatus(_Base):
    """The status side of :class:`~elsewhere.backends.batch.BatchCluster` (a mixin of it)."""

    if TYPE_CHECKING:
        syntax: SchedulerSyntax
        status_interval_s: float
        _status_cache: tuple[float, dict[str, NativeStatus]] | None
        _status_jobs: set[str]
        _interval: float

        def _run(self, argv: list[str], *, check: bool = True, timeout: float = 120.0,
                 cwd: str | None = None) -> Any: ...  # fmt: skip

    def _native_ids(self, job: JobHandle) -> list[str]:
        return [s["native_id"] for s in self.get_job_cluster_data(job).get("submissions", [])]

    def statuses(self, job_ids: list[str], *, force: bool = False) -> dict[str, NativeStatus]:
        """Element statuses of all jobs of this cluster: one command, rate-limited."""
        now = time.monotonic()
        self._status_jobs.update(job_ids)
        if not force and self._status_cache is not None and now - self._status_cache[0] < self._interval:
            return self._status_cache[1]
        ids = sorted(self._status_jobs)
        got: dict[str, NativeStatus] = {}
        if ids:
            res = self._run(self.syntax.build_status(ids), check=False)
            ok = getattr(self.syntax, "status_ok", lambda rc, err: rc == 0)(res.returncode, res.stderr.decode(errors="replace"))
            if not ok:
                raise SchedulerError(f"{self.syntax.status_command} failed", command=self.syntax.build_status(ids),
                                     returncode=res.returncode, stderr=res.stderr.decode(errors="replace"))
            got = self.syntax.parse_status(res.text)
            from ..schedulers.syntax import split_array_first

            seen = {s.job_id for s in got.values()} | set(got)
            missing = [j for j in ids
                       if j not in seen and split_array_first(j)[0] not in seen
                       and not any(k.startswith(split_array_first(j)[0]) for k in got)]
            acct = self.syntax.build_accounting(missing) if missing else None
            if acct:
                r2 = self._run(acct, check=False)
                acct_ok = getattr(self.syntax, "accounting_ok", lambda rc, err: rc == 0)
                if acct_ok(r2.returncode, r2.stderr.decode(errors="replace")):
                    for k, v in self.syntax.parse_accounting(r2.text).items():
                        got.setdefault(k, v)
        if self._status_cache is None or got != self._status_cache[1]:
            self._interval = self.status_interval_s
        else:
            self._interval = min(self._interval * 1.5, 60.0)  # nothing changes: back off
        self._status_cache = (now, got)
        return got

    def poll(self, job: JobHandle) -> None:
        """Mirror results down, then act on what the scheduler says: elements that ended
        without a result for some of their tasks make those tasks lost (run again while the
        job's retries last); elements that can never start are cancelled."""
        self.mirror_down(job)
        survey = self._survey(job, job.refresh())
        if survey is None:
            return
        if survey.never:
            try:
                self._cancel(sorted(survey.never))
            except SchedulerError:
                pass
        if survey.dead or survey.orphaned:  # packed elements (claiming.py)
            lost, again = claiming.settle(job, survey)
            survey.lost.update(lost)
            if again:
                try:
                    self.submit_independent(job.for_tasks(again))
                except Exception as exc:  # they cannot start again: failed with the reason
                    survey.lost.update(dict.fromkeys(again, f"{survey.orphaned}; it could not be started "
                                                            f"again: {type(exc).__name__}: {exc}"))  # fmt: skip
        if survey.lost:
            self.mirror_down(job)  # re-read first: a result may have landed while we asked
            self.report_lost(job, survey.lost)

    def job_state(self, job: JobHandle, snapshot: Snapshot) -> Snapshot:
        """The scheduler's view, on top of the folder's: why tasks pend, which run. A query:
        nothing is changed here (``poll`` reports lost tasks and cancels what never starts)."""
        try:
            survey = self._survey(job, snapshot.final)
        except SchedulerError as exc:
            return snapshot.but(note=f"status unknown: {exc}".splitlines()[0])
        if survey is None:
            return snapshot
        note = "; ".join(f"{n} pending: {r}" for r, n in survey.pending.items())
        running = {t: v for t, v in snapshot.running.items() if t not in survey.not_running}
        return snapshot.but(running=running, reasons=survey.reasons, note=note or snapshot.note)

    def _survey(self, job: JobHandle, final: Any) -> _Survey | None:
        """What the scheduler says of the elements holding tasks without an outcome (one
        status command for every job of this cluster, rate-limited); None before any
        submission."""
        subs = self.get_job_cluster_data(job).get("submissions", [])
        if not subs:
            return None
        st = self.statuses([s["native_id"] for s in subs])
        out = _Survey()
        # A task belongs to the last submission that holds it (a retry resubmits it).
        owner: dict[int, str] = {}
        loaded: list[tuple[dict[str, Any], list[list[int]]]] = []
        for sub in subs:
            chunks = json.loads((job.store.path / "submissions" / f"{sub['name']}.json").read_text())
            loaded.append((sub, chunks))
            for chunk in chunks:
                for t in chunk_tasks(chunk):
                    owner[t] = sub["name"]
            for t in claiming.pool(sub):
                owner[t] = sub["name"]
        packed = [sub for sub in subs if claiming.is_packed(sub)]
        if packed:
            claiming.survey(self.kind, self.syntax, job, final, st, owner, packed, out, NEVER_STARTS)
        for sub, chunks in loaded:
            if claiming.is_packed(sub):
                continue
            for k, chunk in enumerate(chunks):
                if sub.get("communicating"):
                    elem = sub["native_id"]
                    ns = st.get(elem) or st.get(self.syntax.element_id(elem, self.syntax.array_index_base))
                else:
                    elem = self.syntax.element_id(sub["native_id"], k + self.syntax.array_index_base)
                    ns = st.get(elem) or (st.get(sub["native_id"]) if len(chunks) == 1 else None)
                open_tasks = [t for t in chunk_tasks(chunk) if t not in final and owner.get(t) == sub["name"]]
                if open_tasks:
                    out.add(self.kind, elem, ns, open_tasks, age_s=time.time() - sub.get("submitted", 0))
        return out

    def cancel_job(self, job: JobHandle) -> None:
        ids = self._native_ids(job)
        if ids:
            self._cancel(ids)
        self._status_cache = None

    def _cancel(self, ids: list[str]) -> None:
        argv = self.syntax.build_cancel(ids)
        res = self._run(argv, check=False)
        if res.returncode != 0 and not self.syntax.cancel_ok(
            res.returncode, res.stderr.decode(errors="replace"), res.text
        ):
            raise SchedulerError(f"{argv[0]} failed", command=argv, returncode=res.returncode,
                                 stderr=res.stderr.decode(errors="replace"))

    def cancel_task(self, job: JobHandle, index: int) -> None:
        """Cancel the array element of task ``index`` when nothing else of it is left to run;
        an element that still holds other tasks runs on (it skips the cancelled task if it
        has not reached it; a result that comes is kept)."""
        if not getattr(self.syntax, "can_cancel_elements", True):
            return  # this scheduler cancels whole jobs only: the task is marked, the others run on
        cancelled = job.store.queue().cancelled_tasks
        final = job.refresh()
        for sub in reversed(self.get_job_cluster_data(job).get("submissions", [])):  # the newest holds it
            if claiming.is_packed(sub):
                if claiming.holds(sub, index):
                    elem = claiming.cancel_task(job, sub, index, self.syntax)
                    if elem is not None:
                        self._cancel([elem])
                    return
                continue
            chunks = json.loads((job.store.path / "submissions" / f"{sub['name']}.json").read_text())
            for k, chunk in enumerate(chunks):
                tasks = chunk_tasks(chunk)
                if index in tasks:
                    if all(t in cancelled or t in final for t in tasks if t != index):
                        self._cancel([self.syntax.element_id(sub["native_id"], k + self.syntax.array_index_base)])
                    return



def chunk_tasks(chunk: list[int]) -> list[int]:
    """The tasks an element is given: ``[a, b]`` (a..b-1), ``[-1, i, j, ...]``, or ``[]``
    (none: it claims them from the job's queue, see claiming.py)."""
    if not chunk:
        return []
    if chunk[0] == -1:
        return list(chunk[1:])
    return list(range(chunk[0], chunk[1]))


class _Survey:
    """What the scheduler's statuses mean for a job's open tasks (see ``BatchCluster._survey``)."""

    def __init__(self) -> None:
        self.lost: dict[int, str] = {}  # task -> why it ended without a result
        self.never: set[str] = set()  # elements that can never start
        self.reasons: dict[int, str] = {}  # task -> "pending: <reason>"
        self.pending: dict[str, int] = {}  # reason -> tasks pending for it
        self.not_running: set[int] = set()  # tasks whose element is known not to run
        # packed elements (claiming.py): their workers whose element ended -> why
        self.dead: dict[str, str] = {}
        self.orphaned = ""  # why tasks waiting to be claimed have no element left ("": they have)
        self.start_again = False  # ... started again in a new submission (the job made progress)

    def add(self, kind: str, elem: str, ns: NativeStatus | None, tasks: list[int], *, age_s: float) -> None:
        """Element ``elem`` of status ``ns`` holds the open ``tasks``."""
        if ns is None:
            # Not in the queue, not in accounting: gone without a word (once it had time to show).
            if age_s > 30:
                self.lost.update((t, "vanished from the scheduler's queue") for t in tasks)
            return
        if ns.state is TaskState.RUNNING:
            return
        self.not_running.update(tasks)
        if ns.state in _ENDED:
            why = ns.reason or ns.native_state
            if ns.exit_code not in (None, 0):
                why += f", {describe_status(ns.exit_code)}"
            self.lost.update((t, f"{kind} {elem} ended ({why}) without a result") for t in tasks)
        elif ns.state in (TaskState.QUEUED, TaskState.PENDING) and ns.reason in NEVER_STARTS:
            self.never.add(elem)
            self.lost.update((t, f"{kind} {elem} can never start ({ns.reason}): it asks for more than the "
                                 "partition, QOS or account allows; it was cancelled") for t in tasks)  # fmt: skip
        elif ns.state in (TaskState.QUEUED, TaskState.PENDING) and ns.reason:
            self.pending[ns.reason] = self.pending.get(ns.reason, 0) + len(tasks)
            self.reasons.update((t, f"pending: {ns.reason}") for t in tasks)

