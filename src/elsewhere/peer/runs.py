"""A batch on a worker daemon, from its TASK to its RESULT.

A :class:`Run` is a batch of tasks admitted from one controller: the buffers of
its TASK, the child process it runs on (the message that starts it there:
:func:`build_run_message`), and the outcomes the child reports
(:func:`take_results`), filled in for the tasks that never reported
(:func:`fill_unfinished`) and composed into the RESULT its controller gets
(:func:`build_result`). A :class:`Done` is a RESULT kept until its controller
acknowledges it. The daemon that moves them is :class:`~.daemon.PeerWorker`.
"""

from __future__ import annotations

import mmap
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..folder.errorrecord import ErrorRecord, pickle_values
from .childmsg import GROUP_BYTES, Outcome
from .children import ChildProcess
from .messages import Ask

__all__ = ["Done", "Run", "build_result", "build_run_message", "cap_result", "fill_unfinished", "take_results",
           "task_layout"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_NO_VALUES = pickle.dumps([], protocol=5)


@dataclass
class Run:
    """A batch of tasks admitted from one controller, queued for or running on a child."""

    seq: int
    controller: str
    task_id: str
    ask: Ask
    info: dict[str, Any]
    buffers: tuple[Any, ...] = ()
    fn_buffers: tuple[Any, ...] = ()
    job_buffers: tuple[Any, ...] = ()
    started: float = 0.0
    child: ChildProcess[Run] | None = None
    outcomes: dict[int, tuple[list[Any], Any]] = field(default_factory=dict)  # index -> (row, log)
    runs: list[list[Any]] = field(default_factory=list)  # [first, count, attempt, group, item, t0, t1, rss]
    groups: list[tuple[Any, list[Any]]] = field(default_factory=list)  # (pickled values, oob)
    kill: tuple[Outcome, str] | None = None  # why we killed its child, if we did
    accepted: float = 0.0
    leases: list[tuple[ChildProcess[Run], int]] = field(default_factory=list)  # child memfds of results
    kept: set[int] = field(default_factory=set)  # positions of inputs a result is a view of
    held: list[tuple[Any, bool]] = field(default_factory=list)  # those buffers, reusable after?
    context: tuple[Any, ...] = ()  # who sent it and the job's surroundings: see job_context
    alone: list[int] = field(default_factory=list)  # tasks to run again each alone (its child died)


def task_layout(info: dict[str, Any], nbuffers: int) -> tuple[int, int, int, list[list[int]]]:
    """A TASK's buffer counts (tasks, function part, job part) and its items, checked
    against the ``nbuffers`` it came with; ValueError (or KeyError, TypeError) if they do not
    hold (the daemon's and a lane's reading of a TASK)."""
    ntask, nfn, njp = int(info["ntask"]), int(info.get("nfn", 0)), int(info.get("njpart", 0))
    items = [[int(i), int(a)] for i, a in info["items"]]
    if not (ntask >= 1 and nfn >= 0 and njp >= 0 and ntask + nfn + njp == nbuffers and items):
        raise ValueError("buffer counts do not match")
    return ntask, nfn, njp, items


def job_context(user: str, host: str, job: dict[str, Any]) -> tuple[Any, ...]:
    """What decides which code a task's imports load: the controller's authenticated user
    and host, and the job's working directory, ``sys.path`` and environment. A child that
    imported user modules for one job may run a later job of the same context (as long
    as those modules' files are unchanged), not another's."""
    env = job.get("env") or {}
    return (user, host, str(job.get("cwd")), tuple(str(p) for p in job.get("sys_path") or ()),
            tuple(sorted((str(k), str(v)) for k, v in env.items()) if isinstance(env, dict) else ()))  # fmt: skip


@dataclass
class Done:
    """The RESULT of a run, kept until its controller acknowledges it."""

    info: dict[str, Any]
    buffers: list[Any]
    finished: float
    leases: list[tuple[ChildProcess[Run], int]] = field(default_factory=list)
    held: list[tuple[Any, bool]] = field(default_factory=list)  # input buffers results are in


def build_run_message(run: Run, send_fn: bool, send_job: bool, fd_of: Callable[[Any], int],
                      max_result: int = 4 << 30) -> tuple[dict[str, Any], list[Any], list[int]]:  # fmt: skip
    """The "run" message that starts ``run`` on a child (see child.py): its header, the
    buffers of its body, and the descriptors sent with it (a buffer in a memfd, whose
    descriptor ``fd_of`` gives, -1 if none, goes as that descriptor, up to 250 of them).
    With ``send_fn`` the function part of the batch goes too, with ``send_job`` its job
    part. ``max_result``: the largest RESULT frame; the child groups values well under it."""
    body: list[Any] = []
    fds: list[int] = []
    parts: list[list[int]] = []
    fn_buffers = run.fn_buffers if send_fn else ()
    for buf in run.buffers + fn_buffers + (run.job_buffers if send_job else ()):
        fd = fd_of(buf)
        if fd >= 0 and len(fds) < 250:
            fds.append(fd)
            parts.append([len(buf), 1])
        else:
            body.append(buf)
            parts.append([len(buf), 0])
    header = {"op": "run", "batch": str(run.seq), "job": run.info["job"],
              "diary": run.info["diary"], "items": run.info.get("run", run.info["items"]), "fn": run.info["fn"],
              "ntask": len(run.buffers), "nfn": len(fn_buffers), "jpart": run.info.get("jpart", ""),
              "parts": parts}  # fmt: skip
    if max_result < GROUP_BYTES * 4:
        header["group_bytes"] = max(1, max_result // 4)
    return header, body, fds


def take_results(child: ChildProcess[Run], header: dict[str, Any], body: memoryview,
                 fds: list[int]) -> None:  # fmt: skip
    """A group of outcomes from a child, into its run: one pickled list of values, then the
    logs (the child's run is None: they are dropped, their descriptors closed)."""
    run = child.run
    pos = 0
    group_no = -1
    group = header.get("group")
    fd_iter = iter(fds)
    if group is not None:
        plen, parts = group
        pickled = body[pos : pos + plen]
        pos += plen
        oob: list[Any] = []
        for part in parts:
            length, where = int(part[0]), int(part[1])
            if where == 0:
                oob.append(body[pos : pos + length])
                pos += length
                continue
            if where == 2:  # a slice of the run's own input buffer
                position, offset = int(part[2]), int(part[3])
                if run is None:
                    continue
                if not (0 <= position < len(run.buffers) and offset >= 0
                        and offset + length <= len(run.buffers[position])):  # fmt: skip
                    raise ValueError(f"a result names input {position} at {offset}, which it does not have")
                run.kept.add(position)
                oob.append(memoryview(run.buffers[position])[offset : offset + length])
                continue
            fd = next(fd_iter)
            try:
                if len(part) > 3:  # the child's warm memfd: mapped once, released after ACK
                    lid, capacity = int(part[2]), int(part[3])
                    mm = child.lease_map(lid, capacity, fd)
                    if run is not None:
                        run.leases.append((child, lid))
                else:
                    mm = mmap.mmap(fd, max(length, 1), flags=mmap.MAP_SHARED | _POPULATE,
                                   prot=mmap.PROT_READ)  # fmt: skip
            finally:
                os.close(fd)
            oob.append(memoryview(mm)[:length])
        if run is not None:
            run.groups.append((pickled, oob))
            group_no = len(run.groups) - 1
    outcomes = run.outcomes if run is not None else None
    for index, attempt, status, item_no, t0, t1, rss, log_len in header.get("items", []):
        if log_len:
            logged: bytes | memoryview = body[pos : pos + log_len]
            pos += log_len
        else:  # (most tasks print nothing)
            logged = b""
        if outcomes is not None:
            outcomes[int(index)] = ([index, attempt, status, group_no, item_no, t0, t1, rss, log_len], logged)
    if run is not None:
        most = len(run.info.get("items", ()))
        for first, count, item_no, t0, t1, rss in header.get("runs", ()):  # successes without output
            if not 0 < int(count) <= most:
                raise ValueError(f"a run of {count} tasks in a batch of {most}")
            run.runs.append([int(first), int(count), 0, group_no, int(item_no), t0, t1, rss])
    for fd in fd_iter:
        os.close(fd)


def run_tasks(run: Run) -> int:
    """How many tasks of ``run`` reported an outcome."""
    return len(run.outcomes) + sum(r[1] for r in run.runs)


def spread_runs(run: Run) -> None:
    """The run's runs as one outcome row per task (for a controller that reads no ``runs``,
    and before the rarer paths that look at tasks one by one)."""
    ok = int(Outcome.OK)
    for first, count, attempt, group, item, t0, t1, rss in run.runs:
        for k in range(count):
            run.outcomes[first + k] = ([first + k, attempt, ok, group, item + k, t0, t1, rss, 0], b"")
    run.runs = []


def fill_unfinished(run: Run, culprit_index: int, culprit: Outcome | None, why: str,
                    tail: bytes, since: float, pid: int, host: str) -> None:  # fmt: skip
    """Outcomes for the tasks of ``run`` that did not report one (``host``: this worker's)."""
    spread_runs(run)
    job = run.info.get("job", {})
    seed0 = int(job.get("seed") or 0)
    for index, attempt in run.info.get("items", []):
        if index in run.outcomes:
            continue
        t = since or time.time()
        if index == culprit_index and culprit not in (None, Outcome.REQUEUE):
            kind = "WorkerLost" if culprit is Outcome.LOST else "TaskKilled"
            msg = f"task {index} was lost: {why}" if culprit is Outcome.LOST else why
            error = ErrorRecord(kind, msg, "", host, pid, index, seed0 + index)
            run.groups.append((pickle_values([error]), []))
            row = [index, attempt, int(culprit), len(run.groups) - 1, 0, t, time.time(), 0, len(tail)]
            run.outcomes[index] = (row, tail)
        else:
            row = [index, attempt, int(Outcome.REQUEUE), -1, -1, t, t, 0, 0]
            run.outcomes[index] = (row, b"")


def cap_result(run: Run, max_bytes: int, host: str) -> int:
    """Make the RESULT of ``run`` fit in one frame of at most ``max_bytes``, so that its
    controller hears of every task rather than waiting for a RESULT that can never be
    sent. Groups of values are kept in order while they fit (a group holds the values of
    tasks that ended together; the child keeps groups well under the frame); a group too
    large even alone becomes errors that say so, one that only does not fit with the
    others is handed back (its tasks run again, in a smaller batch). Returns how many
    tasks lost their value to the first."""
    logs = sum(len(log) for _row, log in run.outcomes.values())
    sizes = [len(pickled) + sum(memoryview(b).nbytes for b in oob) for pickled, oob in run.groups]
    room = max_bytes - logs - len(sizes) * 4096  # (an error value takes well under 4 kB)
    if sum(sizes) <= room:
        return 0
    from ..util.units import format_size

    spread_runs(run)

    used = 0
    alone: dict[int, int] = {}  # group -> its size: too large even alone
    later: set[int] = set()  # fits alone, not with the others
    for g, size in enumerate(sizes):
        if size > room:
            alone[g] = size
        elif used + size > room:
            later.add(g)
        else:
            used += size
    job = run.info.get("job", {})
    seed0 = int(job.get("seed") or 0)
    pid = run.child.pid if run.child else 0
    for row, _log in run.outcomes.values():
        if row[3] in later:
            row[2], row[3], row[4] = int(Outcome.REQUEUE), -1, -1
    for g in later:
        run.groups[g] = (_NO_VALUES, [])
    lost = 0
    for g, size in alone.items():
        mine = sorted((row for row, _log in run.outcomes.values() if row[3] == g), key=lambda r: r[4])
        others = f", with {len(mine) - 1} others that ended with it" if len(mine) > 1 else ""
        errors = [ErrorRecord("ResultTooLarge",
                              f"task {row[0]}: its result ({format_size(size)}{others}) is over what one message "
                              f"from a worker may carry ({format_size(max_bytes)}): write it to a file, or return "
                              "it in parts", "", host, pid, row[0], seed0 + row[0])
                  for row in mine]  # fmt: skip
        for k, row in enumerate(mine):
            row[2], row[4] = int(Outcome.ERROR), k
        run.groups[g] = (pickle_values(errors), [])
        lost += len(mine)
    return lost


def build_result(run: Run, host: str, charged: float, *, runs: bool = False) -> tuple[dict[str, Any], list[Any]]:
    """The info and buffers of the RESULT of a finished ``run``: its outcome rows in the
    order of its items (``runs``: the controller reads runs; then the runs of successes as
    they are, and the rows of the other tasks in the order they came), the sizes of its
    groups, ``host``, its child's pid and the seconds ``charged``; buffer 0 holds the
    groups' pickled values, 1 the logs, then the groups' out-of-band buffers."""
    if run.runs and not runs:
        spread_runs(run)
    if run.runs:
        rows = list(run.outcomes.values())
    else:
        order = [i for i, _ in run.info.get("items", [])]
        rows = [run.outcomes[i] for i in order if i in run.outcomes]
    info = {"items": [r[0] for r in rows], "groups": [[len(g[0]), len(g[1])] for g in run.groups],
            "host": host, "pid": run.child.pid if run.child else 0,
            "seconds": charged}  # fmt: skip
    if run.runs:
        info["runs"] = run.runs
    if run.alone:
        info["alone"] = run.alone
    buffers: list[Any] = [b"".join(g[0] for g in run.groups), b"".join(r[1] for r in rows)]
    for g in run.groups:
        buffers.extend(g[1])
    return info, buffers
