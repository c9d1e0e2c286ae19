"""Array elements that claim their tasks from the job's queue (a packed submission).

A packed submission (``packing.py``) starts E elements for more than E tasks. Its
``submissions/<n>.json`` holds E empty chunks: an element whose chunk is empty joins the job's
queue as a worker named ``c<n>.<index>-...`` (submission ``n``, the scheduler's array index)
and claims tasks until none are left (``run/claims.py``). Its record in the cluster data holds
the tasks it was made for, as runs (``"claim": [[first, end], ...]``).

What the scheduler says of those elements is read here, for the batch backend's status side
(``batchstatus.py``)::

    survey()   an element that ended while its worker was still a member (killed, out of
               time, out of memory): that worker is dead (``Survey.dead``); no element of
               the job left alive while tasks wait to be claimed: they are orphaned
               (``Survey.orphaned``); why waiting tasks wait (pending reasons)
    settle()   in ``poll``, under the queue lock: a dead worker's running task is lost with
               the scheduler's reason, the rest of its claim goes back to the queue; orphaned
               tasks are started again in a new submission when the job made progress since
               the last one (they left for want of walltime, or their element died) and no
               element was cancelled; else they are lost, saying why
    cancel_task()  the element running a cancelled task is cancelled only when it holds
               nothing else and nothing is left to claim (else the task runs to its end)
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..folder import records
from ..folder.journal import finished_by
from ..util.states import TaskState

if TYPE_CHECKING:
    from ..folder.handle import JobHandle
    from ..schedulers.syntax import NativeStatus, SchedulerSyntax

__all__ = [
    "cancel_task",
    "holds",
    "is_packed",
    "pool",
    "runs",
    "settle",
    "survey",
    "worker_element",
]

_ENDED = (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED)
_WID = re.compile(r"c(\d+)\.(\d+)-")
#: An element that is neither in the queue nor in accounting this long after its submission
#: is gone (as for elements given their tasks).
VANISHED_AFTER_S = 30.0


class Survey(Protocol):
    """What the batch backend's status side learns of a job's elements (``batchstatus._Survey``)."""

    lost: dict[int, str]  # task -> why it ended without a result
    never: set[str]  # elements that can never start
    reasons: dict[int, str]  # task -> "pending: <reason>"
    pending: dict[str, int]  # reason -> tasks pending for it
    not_running: set[int]  # tasks whose element is known not to run
    dead: dict[str, str]  # workers of packed elements that ended -> why
    orphaned: str  # why tasks waiting to be claimed have no element left ("": they have)
    start_again: bool  # ... started again in a new submission (the job made progress)


def is_packed(sub: dict[str, Any]) -> bool:
    """Whether submission ``sub`` (a cluster-data record) is packed: its elements claim."""
    return sub.get("claim") is not None


def pool(sub: dict[str, Any]) -> Iterator[int]:
    """The tasks packed submission ``sub`` was made for."""
    for first, end in sub.get("claim") or ():
        yield from range(int(first), int(end))


def holds(sub: dict[str, Any], task: int) -> bool:
    """Whether packed submission ``sub`` was made for ``task``."""
    return any(int(first) <= task < int(end) for first, end in sub.get("claim") or ())


def runs(tasks: list[int]) -> list[list[int]]:
    """``tasks`` as runs ``[[first, end], ...]`` (end excluded), in order."""
    out: list[list[int]] = []
    for t in sorted(tasks):
        if out and out[-1][1] == t:
            out[-1][1] = t + 1
        else:
            out.append([t, t + 1])
    return out


def worker_element(wid: str) -> tuple[str, int] | None:
    """(submission name, array index) of a packed element's worker id, else None."""
    m = _WID.match(wid)
    return (m.group(1), int(m.group(2))) if m else None


def _ended_why(ns: NativeStatus) -> str:
    why = ns.reason or ns.native_state
    if ns.exit_code not in (None, 0):
        why += f", exit code {ns.exit_code}"
    return why


def survey(kind: str, syntax: SchedulerSyntax, job: JobHandle, final: Any, st: dict[str, NativeStatus],
           owner: dict[int, str], subs: list[dict[str, Any]], out: Survey,
           never_starts: frozenset[str]) -> None:  # fmt: skip
    """Add to ``out`` what the statuses ``st`` say of the elements of the packed ``subs``
    (``owner``: task -> the submission that holds it now; ``never_starts``: pending reasons
    of elements that never start). A pure reading: :func:`settle` acts on it."""
    now = time.time()
    base = syntax.array_index_base
    elements: dict[
        tuple[str, int], tuple[str, NativeStatus | None, bool]
    ] = {}  # -> (id, status, ended)
    alive = running = False
    stopped = False  # an element was cancelled: by someone, or as one that can never start
    ends: Counter[str] = Counter()
    pending: Counter[str] = Counter()
    for sub in subs:
        native, age = str(sub["native_id"]), now - float(sub.get("submitted", 0.0))
        n_el = int(sub.get("elements", 1))
        for k in range(n_el):
            elem = syntax.element_id(native, k + base)
            ns = st.get(elem) or (st.get(native) if n_el == 1 else None)
            ended = False
            if ns is None:
                if age > VANISHED_AFTER_S:
                    ended = True
                    ends["vanished from the scheduler's queue"] += 1
                else:
                    alive = True  # just submitted: not listed yet
            elif ns.state is TaskState.RUNNING:
                alive = running = True
            elif ns.state in _ENDED:
                ended = True
                ends[_ended_why(ns)] += 1
                stopped = stopped or ns.state is TaskState.CANCELLED
            elif ns.reason in never_starts:
                out.never.add(elem)
                ended = stopped = True
                ends[f"can never start ({ns.reason}): it asks for more than the partition, QOS or account "
                     "allows; it was cancelled"] += 1  # fmt: skip
            else:
                alive = True
                if ns.reason:
                    pending[ns.reason] += 1
            elements[(str(sub["name"]), k + base)] = (elem, ns, ended)
    q = job.store.queue()
    for wid, m in q.members.items():
        key = worker_element(wid)
        if key is None or key not in elements or m.get("state") not in ("active", "waiting"):
            continue
        elem, ns, ended = elements[key]
        if ended:
            why = _ended_why(ns) if ns is not None else "vanished from the scheduler's queue"
            out.dead[wid] = f"{kind} {elem} ended ({why}) without a result"
            out.not_running.update(records.iter_ranges(m.get("claim") or []))
    packed = {str(s["name"]) for s in subs}
    if not alive and (out.dead or q.unclaimed() > 0):
        natives = ", ".join(str(s["native_id"]) for s in subs)
        summary = "; ".join(f"{n} {why}" for why, n in ends.most_common(3))
        out.orphaned = (
            f"no element of {kind} job {natives} is left to run it (elements ended: {summary}; "
            f"their output: {job.path / 'logs' / 'scheduler'})"
        )
        # Started again in a new submission while the job makes progress: tasks left for want
        # of walltime, or put back from an element that died (the task it ran is charged on
        # its own, by settle); not if no task ended since the last submission (elements that
        # fail to start, or die at once) or an element was cancelled: lost then, saying why.
        done_before = int(subs[-1].get("outcomes_before", 0))
        out.start_again = not stopped and len(final) > done_before
    if not running and pending:
        reason, _ = pending.most_common(1)[0]
        waiting = [
            t
            for t, name in owner.items()
            if name in packed and t not in final and t not in out.not_running
        ]
        out.pending[reason] = out.pending.get(reason, 0) + len(waiting)
        out.reasons.update((t, f"pending: {reason}") for t in waiting)
        out.not_running.update(waiting)


def settle(job: JobHandle, out: Survey) -> tuple[dict[int, str], list[int]]:
    """Act on ``out`` (from :func:`survey`), under the queue lock: ({task: why} to report
    lost, tasks to start afresh in a new submission). Only workers still members are written
    off here: one that a claiming worker reaped meanwhile is that worker's."""
    store = job.store
    lost: dict[int, str] = {}
    again: list[int] = []
    with store.locked_queue() as q:
        if q.cancelled or not q.submitted:
            return {}, []
        for wid, why in out.dead.items():
            m = q.members.get(wid)
            if m is None or m.get("state") not in ("active", "waiting"):
                continue
            claim = list(records.iter_ranges(m.get("claim") or []))
            q.set_member(wid, "dead", [])
            if not claim:
                continue
            done = finished_by(store, wid, q)
            running, _, _ = store.read_running(wid)
            rest = [t for t in claim if t not in done and t != running]
            if running in claim and running not in done:
                lost[running] = why
            q.requeue(rest)
        if out.orphaned:
            left = [t for t in q.take_unclaimed() if t not in lost]
            if out.start_again:
                q.requeue(left)
                again = left
            else:
                lost.update(dict.fromkeys(left, out.orphaned))
    return lost, again


def cancel_task(
    job: JobHandle, sub: dict[str, Any], index: int, syntax: SchedulerSyntax
) -> str | None:
    """The element of packed ``sub`` to cancel for cancelled task ``index``: the one running
    it, if it holds nothing else unfinished and nothing is left to claim; else None (the task
    runs to its end, its result is kept; the element goes on with the job's other tasks)."""
    q = job.store.queue()
    if q.unclaimed() > 0:
        return None
    final = job.refresh()
    skip = q.cancelled_tasks
    for wid, m in q.members.items():
        key = worker_element(wid)
        if key is None or key[0] != str(sub["name"]) or m.get("state") != "active":
            continue
        if job.store.read_running(wid)[0] != index:
            continue
        others = [t for t in records.iter_ranges(m.get("claim") or []) if t != index]
        if all(t in final or t in skip for t in others):
            return syntax.element_id(str(sub["native_id"]), key[1])
        return None
    return None
